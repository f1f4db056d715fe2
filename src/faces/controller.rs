//! CSI Controller: volume lifecycle, run on the node that owns the data (see docs/design.md,
//! "Where things run").

use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::debug;

use crate::class::{ClassParameters, Mutable};
use crate::cluster::controller::modify::{self, Relay};
use crate::cluster::kit::client::{self, Retries};
use crate::config::Config;
use crate::csi::controller_server::Controller;
use crate::csi::controller_service_capability::{Rpc, rpc};
use crate::csi::{self, list_volumes_response as list};
use crate::error::Error;
use crate::faces::driver::{
    CONTEXT_ACCESS_TYPE, CONTEXT_HOST_PATH, CONTEXT_NODE, Driver, blocking,
};
use crate::faces::request;
use crate::volume::copies::snapshot::{SnapshotFilter, SnapshotRecord, SnapshotRequest};
use crate::volume::create::CreateRequest;
use crate::volume::state::id::{SnapshotId, VolumeId};
use crate::volume::state::record::{VolumeKind, VolumeRecord};
use crate::volume::{Condition, Volumes};

pub struct ControllerService {
    driver: Arc<Driver>,
}

impl ControllerService {
    pub fn new(driver: Arc<Driver>) -> Self {
        ControllerService { driver }
    }

    fn volumes(&self) -> Result<Arc<Volumes>, Status> {
        self.driver.volumes().map_err(Status::from)
    }
}

fn to_csi_volume(driver: &Driver, volumes: &Volumes, record: &VolumeRecord) -> csi::Volume {
    // Empty when the volume's pool is not configured (its condition says so).
    let path = volumes
        .data_path(record)
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    csi::Volume {
        capacity_bytes: record.capacity_bytes,
        volume_id: record.id.to_string(),
        volume_context: [
            (CONTEXT_HOST_PATH.to_string(), path),
            (CONTEXT_NODE.to_string(), driver.config.node_id.clone()),
            (
                CONTEXT_ACCESS_TYPE.to_string(),
                record.kind.as_str().to_string(),
            ),
        ]
        .into(),
        content_source: record
            .content_source
            .as_ref()
            .map(request::csi_content_source),
        accessible_topology: vec![driver.topology()],
    }
}

/// The volume with its status (published here or not, condition): this inspects the host.
fn with_status(
    driver: &Driver,
    volumes: &Volumes,
    record: &VolumeRecord,
) -> (csi::Volume, Vec<String>, csi::VolumeCondition) {
    // On this node if published anywhere: the node id is what published_node_ids lists.
    let published_nodes = if volumes.has_live_publication(record) {
        vec![driver.config.node_id.clone()]
    } else {
        Vec::new()
    };
    (
        to_csi_volume(driver, volumes, record),
        published_nodes,
        to_csi_condition(volumes.condition(record)),
    )
}

/// ControllerModifyVolume from the controller: the volume's node sets the limits.
async fn relay(config: &Config, volume_id: &str, wanted: &Mutable) -> Result<(), Error> {
    let client = client::make(Retries::On)
        .await
        .map_err(|err| Error::FailedPrecondition(format!("no Kubernetes client: {err}")))?;
    let relay = Relay {
        client,
        driver: config.driver_name.clone(),
        topology_key: config.topology_key(),
        patience: modify::PATIENCE,
    };
    relay.modify(volume_id, wanted).await
}

fn to_csi_condition(condition: Condition) -> csi::VolumeCondition {
    csi::VolumeCondition {
        abnormal: condition.abnormal,
        message: condition.message,
    }
}

/// Builds the CreateRequest from a CSI request, or the error that answers it.
fn create_request(driver: &Driver, req: csi::CreateVolumeRequest) -> Result<CreateRequest, Error> {
    let name = request::volume_name(&req.name)?.to_string();
    let caps = request::capabilities(&req.volume_capabilities)?;
    let parameters = request::parameters(&req.parameters)?;
    if let Some(reason) = caps
        .iter()
        .find_map(|cap| cap.unsupported_reason(parameters.shared_access))
    {
        return Err(Error::InvalidArgument(reason));
    }
    let mutable = request::mutable(&req.mutable_parameters)?;
    let content_source = req
        .volume_content_source
        .as_ref()
        .map(request::content_source)
        .transpose()?;
    let requisite = req
        .accessibility_requirements
        .as_ref()
        .map_or(&[][..], |t| &t.requisite[..]);
    let config = &driver.config;
    if !request::topology_allows(requisite, &config.topology_key(), &config.node_id) {
        return Err(Error::ResourceExhausted(format!(
            "volume {name:?} must be reachable from topologies that exclude this node ({}={}); volumes live only where they are created",
            config.topology_key(),
            config.node_id
        )));
    }
    let range = req.capacity_range.unwrap_or_default();
    let mut access_modes: Vec<_> = caps.iter().map(|c| c.access_mode).collect();
    access_modes.sort();
    access_modes.dedup();
    let mut mount_flags: Vec<_> = caps.iter().flat_map(|c| c.mount_flags.clone()).collect();
    mount_flags.sort();
    mount_flags.dedup();
    // csi-provisioner moves the class's fsType into the capability; a caller that leaves it
    // among the parameters (csi-sanity's --csi.testvolumeparameters) means the same.
    let kind = match (caps[0].kind, parameters.image_fs) {
        (VolumeKind::Filesystem, Some(fs)) => VolumeKind::Image(fs),
        (kind, _) => kind,
    };
    request::limits_fit(kind, &mutable.io)?;
    let encrypted = request::encryption_fits(kind, parameters.encryption)?;
    Ok(CreateRequest {
        name,
        required_bytes: range.required_bytes,
        limit_bytes: range.limit_bytes,
        kind,
        access_modes,
        mount_flags,
        pool: parameters.pool,
        allocation: parameters.allocation,
        require_enforcement: parameters.require_enforcement,
        parameters: parameters.raw,
        content_source,
        mutable,
        encrypted,
    })
}

/// A creation time in milliseconds since the epoch, as CSI carries it.
pub(crate) fn timestamp(millis: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: (millis / 1000) as i64,
        nanos: ((millis % 1000) * 1_000_000) as i32,
    }
}

pub(crate) fn to_csi_snapshot(record: &SnapshotRecord) -> csi::Snapshot {
    csi::Snapshot {
        // Kubernetes refuses restores asking less than this: what the source's claim asked,
        // not the filesystem minimum the driver raised it to (the restore is raised alike).
        size_bytes: record.restorable_from_bytes(),
        snapshot_id: record.id.to_string(),
        source_volume_id: record.source_volume.to_string(),
        creation_time: Some(timestamp(record.created_unix_ms)),
        ready_to_use: record.ready,
        group_snapshot_id: record
            .group
            .as_ref()
            .map(|group| group.to_string())
            .unwrap_or_default(),
    }
}

/// A list page size: 0 means all; negative is refused.
fn page_size(max_entries: i32) -> Result<usize, Status> {
    match max_entries {
        n if n < 0 => Err(Status::invalid_argument("max_entries must not be negative")),
        0 => Ok(usize::MAX),
        n => Ok(n as usize),
    }
}

/// A list's starting_token: one of the ids we handed out as next_token, or ABORTED.
fn page_token<T>(token: &str, parse: impl Fn(&str) -> Option<T>) -> Result<Option<T>, Status> {
    match token {
        "" => Ok(None),
        token => parse(token).map(Some).ok_or_else(|| {
            Status::aborted(format!(
                "starting_token {token:?} was not issued by this driver"
            ))
        }),
    }
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let create = create_request(&self.driver, request.into_inner())?;
        let volumes = self.volumes()?;
        let worker = volumes.clone();
        let record = blocking(move || worker.create(create)).await?;
        Ok(Response::new(csi::CreateVolumeResponse {
            volume: Some(to_csi_volume(&self.driver, &volumes, &record)),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        let req = request.into_inner();
        request::required("volume_id", &req.volume_id)?;
        let volumes = self.volumes()?;
        // Not one of our ids: it cannot exist here, and deleting what does not exist succeeds.
        if let Some(id) = VolumeId::parse(&req.volume_id) {
            blocking(move || volumes.delete(&id)).await?;
        }
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        let req = request.into_inner();
        let id = request::volume_id(&req.volume_id)?;
        let caps = request::capabilities(&req.volume_capabilities)?;
        let record = self.volumes()?.get(&id)?;
        let refusal = caps
            .iter()
            .find_map(|cap| {
                if !record.kind.serves(cap.kind) {
                    Some(format!(
                        "volume {id} is a {} volume, not {}",
                        record.kind.as_str(),
                        cap.kind.as_str()
                    ))
                } else {
                    cap.unsupported_reason(record.is_shared())
                }
            })
            .or_else(|| {
                request::parameters(&req.parameters)
                    .err()
                    .map(|e| e.to_string())
            })
            .or_else(|| {
                (!req.mutable_parameters.is_empty())
                    .then(|| "mutable_parameters are not supported".to_string())
            });
        let response = match refusal {
            Some(message) => csi::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            },
            None => csi::ValidateVolumeCapabilitiesResponse {
                confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: req.mutable_parameters,
                }),
                message: String::new(),
            },
        };
        Ok(Response::new(response))
    }

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        let req = request.into_inner();
        let max = page_size(req.max_entries)?;
        let after = page_token(&req.starting_token, VolumeId::parse)?;
        let volumes = self.volumes()?;
        let driver = self.driver.clone();
        let (entries, next) = blocking(move || {
            let (page, next) = volumes.list(after.as_ref(), max);
            let entries = page
                .iter()
                .map(|record| {
                    let (volume, published_node_ids, condition) =
                        with_status(&driver, &volumes, record);
                    list::Entry {
                        volume: Some(volume),
                        status: Some(list::VolumeStatus {
                            published_node_ids,
                            volume_condition: Some(condition),
                        }),
                    }
                })
                .collect();
            Ok((entries, next))
        })
        .await?;
        Ok(Response::new(csi::ListVolumesResponse {
            entries,
            next_token: next.map(|id| id.to_string()).unwrap_or_default(),
        }))
    }

    async fn controller_get_volume(
        &self,
        request: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        let id = request::volume_id(&request.into_inner().volume_id)?;
        let volumes = self.volumes()?;
        let driver = self.driver.clone();
        let (volume, published_node_ids, condition) = blocking(move || {
            let record = volumes.get(&id)?;
            Ok(with_status(&driver, &volumes, &record))
        })
        .await?;
        Ok(Response::new(csi::ControllerGetVolumeResponse {
            volume: Some(volume),
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids,
                volume_condition: Some(condition),
            }),
        }))
    }

    /// The IO limits of a VolumeAttributesClass: set here where the volume is (the node plugin,
    /// csi-sanity); in `--mode=controller`, beside csi-resizer, handed to the volume's node
    /// through its PV (`cluster::controller::modify`).
    async fn controller_modify_volume(
        &self,
        request: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        let req = request.into_inner();
        let id = request::volume_id(&req.volume_id)?;
        let wanted = request::mutable(&req.mutable_parameters)?;
        match self.driver.volumes() {
            Ok(volumes) => blocking(move || volumes.modify(&id, wanted)).await?,
            Err(_) => relay(&self.driver.config, &id.to_string(), &wanted).await?,
        }
        Ok(Response::new(csi::ControllerModifyVolumeResponse {}))
    }

    async fn get_capacity(
        &self,
        request: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        let req = request.into_inner();
        let parameters = request::parameters(&req.parameters).unwrap_or_else(|err| {
            // Refusing would leave the class without capacity objects, and the scheduler would
            // blame space: CreateVolume names the mistake instead (see `ClassParameters::lenient`).
            debug!(error = %err, "GetCapacity of a class with a mistake: answered without it");
            ClassParameters::lenient(&req.parameters)
        });
        let caps = req
            .volume_capabilities
            .iter()
            .map(|cap| request::capability(Some(cap)))
            .collect::<Result<Vec<_>, _>>()?;
        let config = &self.driver.config;
        let here = req.accessible_topology.as_ref().is_none_or(|t| {
            request::topology_allows(
                std::slice::from_ref(t),
                &config.topology_key(),
                &config.node_id,
            )
        });
        let servable = caps
            .iter()
            .all(|cap| cap.unsupported_reason(parameters.shared_access).is_none());
        let volumes = self.volumes()?;
        let mut kinds: Vec<_> = caps.iter().map(|cap| cap.kind).collect();
        kinds.extend(parameters.image_fs.map(VolumeKind::Image));
        let available = if here && servable {
            let bytes = blocking(move || {
                volumes.available_for(&parameters.pool, &kinds, parameters.require_enforcement)
            })
            .await?;
            i64::try_from(bytes).unwrap_or(i64::MAX)
        } else {
            0
        };
        Ok(Response::new(csi::GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(available),
            minimum_volume_size: None,
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        let req = request.into_inner();
        let name = request::volume_name(&req.name)?.to_string();
        let source = request::required("source_volume_id", &req.source_volume_id)?;
        let source = VolumeId::parse(source)
            .ok_or_else(|| Status::not_found(format!("source volume {source:?} does not exist")))?;
        let parameters = request::snapshot_parameters(&req.parameters)?;
        let volumes = self.volumes()?;
        let record = blocking(move || {
            volumes.create_snapshot(SnapshotRequest {
                name,
                source,
                parameters,
            })
        })
        .await?;
        Ok(Response::new(csi::CreateSnapshotResponse {
            snapshot: Some(to_csi_snapshot(&record)),
        }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        let req = request.into_inner();
        request::required("snapshot_id", &req.snapshot_id)?;
        let volumes = self.volumes()?;
        // Not one of our ids: it cannot exist here, and deleting what does not exist succeeds.
        if let Some(id) = SnapshotId::parse(&req.snapshot_id) {
            blocking(move || volumes.delete_snapshot(&id)).await?;
        }
        Ok(Response::new(csi::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        let req = request.into_inner();
        let max = page_size(req.max_entries)?;
        let after = page_token(&req.starting_token, SnapshotId::parse)?;
        let volumes = self.volumes()?;
        let empty = || Ok(Response::new(csi::ListSnapshotsResponse::default()));
        // A filter naming an id that is not ours matches nothing (not an error, per the spec).
        let mut filter = SnapshotFilter::default();
        if !req.snapshot_id.is_empty() {
            let Some(id) = SnapshotId::parse(&req.snapshot_id) else {
                return empty();
            };
            filter.snapshot = Some(id);
        }
        if !req.source_volume_id.is_empty() {
            let Some(id) = VolumeId::parse(&req.source_volume_id) else {
                return empty();
            };
            filter.source = Some(id);
        }
        let (page, next) = volumes.list_snapshots(&filter, after.as_ref(), max);
        Ok(Response::new(csi::ListSnapshotsResponse {
            entries: page
                .iter()
                .map(|record| csi::list_snapshots_response::Entry {
                    snapshot: Some(to_csi_snapshot(record)),
                })
                .collect(),
            next_token: next.map(|id| id.to_string()).unwrap_or_default(),
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        // Controller mode (beside csi-resizer) does no volume work and so claims none.
        let types: &[rpc::Type] = if self.driver.volumes().is_ok() {
            &[
                rpc::Type::CreateDeleteVolume,
                rpc::Type::ListVolumes,
                rpc::Type::GetCapacity,
                rpc::Type::GetVolume,
                rpc::Type::VolumeCondition,
                rpc::Type::ListVolumesPublishedNodes,
                rpc::Type::SingleNodeMultiWriter,
                rpc::Type::CreateDeleteSnapshot,
                rpc::Type::ListSnapshots,
                rpc::Type::CloneVolume,
                rpc::Type::ModifyVolume,
            ]
        } else {
            // Beside csi-resizer: a change of VolumeAttributesClass, handed to the volume's node.
            &[rpc::Type::ModifyVolume]
        };
        let capabilities = types
            .iter()
            .map(|t| csi::ControllerServiceCapability {
                r#type: Some(csi::controller_service_capability::Type::Rpc(Rpc {
                    r#type: *t as i32,
                })),
            })
            .collect();
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }
}
