//! The CSI client: one HTTP/2 channel over the unix socket shared by every task, a deadline on
//! every call, and what the driver says about itself.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use stickyvol::csi;
use stickyvol::csi::controller_client::ControllerClient;
use stickyvol::csi::group_controller_client::GroupControllerClient;
use stickyvol::csi::identity_client::IdentityClient;
use stickyvol::csi::node_client::NodeClient;
use stickyvol::csi::plugin_capability::service::Type as ServiceType;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::report::{Recorder, Rpc};

/// The socket path of a `unix://` endpoint (a bare absolute path is accepted too).
pub fn socket_path(endpoint: &str) -> Result<PathBuf, String> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if path.starts_with('/') {
        Ok(PathBuf::from(path))
    } else {
        Err(format!(
            "endpoint {endpoint:?} must be unix:///ABSOLUTE/PATH"
        ))
    }
}

/// Opens one channel to the socket. Requests on it are multiplexed over one connection.
pub async fn connect(
    socket: &Path,
    deadline: Duration,
) -> Result<Channel, tonic::transport::Error> {
    stickyvol::unix_channel::connect(socket, Some(deadline)).await
}

/// Clients of the CSI services on one channel, with the per-call deadline.
#[derive(Clone)]
pub struct Csi {
    pub identity: IdentityClient<Channel>,
    pub controller: ControllerClient<Channel>,
    pub node: NodeClient<Channel>,
    pub group: GroupControllerClient<Channel>,
    deadline: Duration,
}

impl Csi {
    pub fn new(channel: Channel, deadline: Duration) -> Csi {
        Csi {
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel.clone()),
            group: GroupControllerClient::new(channel.clone()),
            node: NodeClient::new(channel),
            deadline,
        }
    }

    /// A request carrying the deadline (the driver sees it as grpc-timeout; the channel
    /// enforces it on our side too).
    pub fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(self.deadline);
        request
    }
}

/// Times `call` and records it under `rpc` in `recorder`.
pub async fn timed<T, F>(recorder: &mut Recorder, rpc: Rpc, call: F) -> Result<T, Status>
where
    F: Future<Output = Result<tonic::Response<T>, Status>>,
{
    let started = Instant::now();
    let result = call.await;
    recorder.record(rpc, started.elapsed(), result.as_ref().err());
    result.map(tonic::Response::into_inner)
}

/// What the driver advertises, as read at the start.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DriverInfo {
    pub name: String,
    pub vendor_version: String,
    pub node_id: String,
    /// NodeGetInfo's accessible_topology, passed to CreateVolume as requisite and preferred.
    pub topology: Option<HashMap<String, String>>,
    pub controller_service: bool,
    pub create_delete_volume: bool,
    pub controller_publish: bool,
    pub stage_unstage: bool,
    /// Node capability GET_VOLUME_STATS.
    pub get_volume_stats: bool,
}

/// Reads GetPluginInfo, GetPluginCapabilities, ControllerGetCapabilities, NodeGetCapabilities
/// and NodeGetInfo; each call is recorded in `recorder`.
pub async fn discover(csi: &Csi, recorder: &mut Recorder) -> Result<DriverInfo, String> {
    use csi::controller_service_capability::rpc;
    use csi::node_service_capability::rpc as node_rpc;
    let info = ask(
        recorder,
        Rpc::GetPluginInfo,
        csi.identity
            .clone()
            .get_plugin_info(csi.request(csi::GetPluginInfoRequest {})),
    )
    .await?;
    let services = plugin_services(csi, recorder).await?;
    let controller_service = services.contains(&(ServiceType::ControllerService as i32));
    let topology_constraints =
        services.contains(&(ServiceType::VolumeAccessibilityConstraints as i32));
    // A driver without the controller service is not asked for its capabilities.
    let controller_caps = match controller_service {
        true => controller_rpcs(csi, recorder).await?,
        false => Vec::new(),
    };
    let node_caps = node_rpcs(csi, recorder).await?;
    let node = ask(
        recorder,
        Rpc::NodeGetInfo,
        csi.node
            .clone()
            .node_get_info(csi.request(csi::NodeGetInfoRequest {})),
    )
    .await?;

    let has = |t: rpc::Type| controller_caps.contains(&(t as i32));
    let node_has = |t: node_rpc::Type| node_caps.contains(&(t as i32));
    Ok(DriverInfo {
        name: info.name,
        vendor_version: info.vendor_version,
        node_id: node.node_id,
        topology: node
            .accessible_topology
            .filter(|_| topology_constraints)
            .map(|t| t.segments),
        controller_service,
        create_delete_volume: has(rpc::Type::CreateDeleteVolume),
        controller_publish: has(rpc::Type::PublishUnpublishVolume),
        stage_unstage: node_has(node_rpc::Type::StageUnstageVolume),
        get_volume_stats: node_has(node_rpc::Type::GetVolumeStats),
    })
}

/// One call of `discover`, timed and recorded; a failure names the call and the driver's code.
async fn ask<T, F>(recorder: &mut Recorder, rpc: Rpc, call: F) -> Result<T, String>
where
    F: Future<Output = Result<tonic::Response<T>, Status>>,
{
    timed(recorder, rpc, call)
        .await
        .map_err(|status| format!("{}: {:?}: {}", rpc.name(), status.code(), status.message()))
}

/// The `type` of every capability of a list that is a `$variant` (a service, or an RPC): each
/// CSI service has a capability type of its own, alike but for the names.
macro_rules! listed {
    ($capabilities:expr, $variant:path) => {
        $capabilities
            .iter()
            .filter_map(|c| match &c.r#type {
                Some($variant(kind)) => Some(kind.r#type),
                _ => None,
            })
            .collect::<Vec<i32>>()
    };
}

/// The services GetPluginCapabilities lists (`ServiceType` values).
async fn plugin_services(csi: &Csi, recorder: &mut Recorder) -> Result<Vec<i32>, String> {
    let plugin = ask(
        recorder,
        Rpc::GetPluginCapabilities,
        csi.identity
            .clone()
            .get_plugin_capabilities(csi.request(csi::GetPluginCapabilitiesRequest {})),
    )
    .await?;
    Ok(listed!(
        plugin.capabilities,
        csi::plugin_capability::Type::Service
    ))
}

/// The RPCs ControllerGetCapabilities lists.
async fn controller_rpcs(csi: &Csi, recorder: &mut Recorder) -> Result<Vec<i32>, String> {
    let caps = ask(
        recorder,
        Rpc::ControllerGetCapabilities,
        csi.controller
            .clone()
            .controller_get_capabilities(csi.request(csi::ControllerGetCapabilitiesRequest {})),
    )
    .await?;
    Ok(listed!(
        caps.capabilities,
        csi::controller_service_capability::Type::Rpc
    ))
}

/// The RPCs NodeGetCapabilities lists.
async fn node_rpcs(csi: &Csi, recorder: &mut Recorder) -> Result<Vec<i32>, String> {
    let caps = ask(
        recorder,
        Rpc::NodeGetCapabilities,
        csi.node
            .clone()
            .node_get_capabilities(csi.request(csi::NodeGetCapabilitiesRequest {})),
    )
    .await?;
    Ok(listed!(
        caps.capabilities,
        csi::node_service_capability::Type::Rpc
    ))
}

/// Probe's answer: ready unless it says `ready: false`.
pub async fn probe(csi: &Csi) -> Result<bool, Status> {
    let response = csi
        .identity
        .clone()
        .probe(csi.request(csi::ProbeRequest {}))
        .await?
        .into_inner();
    Ok(response.ready.unwrap_or(true))
}
