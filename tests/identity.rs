//! Identity service, the capabilities and info each service reports, and what each `--mode`
//! offers on its socket.

mod common;

use common::*;
use csi::controller_service_capability::rpc::Type as ControllerRpc;
use csi::node_service_capability::rpc::Type as NodeRpc;
use csi::plugin_capability::service::Type as PluginService;

/// Each capability's type, which every capability must have; `service` names whose they are.
fn types_of<C, T>(capabilities: Vec<C>, service: &str, type_of: impl Fn(C) -> Option<T>) -> Vec<T> {
    capabilities
        .into_iter()
        .map(|cap| type_of(cap).unwrap_or_else(|| panic!("empty {service} capability")))
        .collect()
}

/// The RPCs a controller or node capability list advertises: each capability must name an RPC
/// this crate's CSI schema knows; `rpc_of` picks its raw RPC type.
fn rpcs_of<C, R>(capabilities: Vec<C>, service: &str, rpc_of: impl Fn(C) -> Option<i32>) -> Vec<R>
where
    R: TryFrom<i32, Error = prost::UnknownEnumValue>,
{
    types_of(capabilities, service, rpc_of)
        .into_iter()
        .map(|rpc| R::try_from(rpc).unwrap_or_else(|e| panic!("unknown {service} rpc: {e}")))
        .collect()
}

async fn plugin_capabilities(driver: &TestDriver) -> Vec<csi::plugin_capability::Type> {
    let request = csi::GetPluginCapabilitiesRequest {};
    let response = driver.identity().get_plugin_capabilities(request).await;
    let capabilities = response
        .expect("GetPluginCapabilities")
        .into_inner()
        .capabilities;
    types_of(capabilities, "plugin", |cap| cap.r#type)
}

async fn plugin_services(driver: &TestDriver) -> Vec<PluginService> {
    plugin_capabilities(driver)
        .await
        .into_iter()
        .filter_map(|cap| match cap {
            csi::plugin_capability::Type::Service(service) => {
                Some(PluginService::try_from(service.r#type).expect("known service type"))
            }
            csi::plugin_capability::Type::VolumeExpansion(_) => None,
        })
        .collect()
}

async fn controller_rpcs(driver: &TestDriver) -> Vec<ControllerRpc> {
    use csi::controller_service_capability::Type::Rpc;
    let request = csi::ControllerGetCapabilitiesRequest {};
    let response = driver
        .controller()
        .controller_get_capabilities(request)
        .await;
    let capabilities = response
        .expect("ControllerGetCapabilities")
        .into_inner()
        .capabilities;
    rpcs_of(capabilities, "controller", |cap| {
        cap.r#type.map(|Rpc(rpc)| rpc.r#type)
    })
}

async fn node_rpcs(driver: &TestDriver) -> Vec<NodeRpc> {
    use csi::node_service_capability::Type::Rpc;
    let request = csi::NodeGetCapabilitiesRequest {};
    let response = driver.node().node_get_capabilities(request).await;
    let capabilities = response
        .expect("NodeGetCapabilities")
        .into_inner()
        .capabilities;
    rpcs_of(capabilities, "node", |cap| {
        cap.r#type.map(|Rpc(rpc)| rpc.r#type)
    })
}

async fn start_in_mode(mode: &'static str) -> TestDriver {
    TestDriver::start_with(Options {
        mode: Some(mode),
        ..Default::default()
    })
    .await
}

/// CreateVolume on a socket that offers no volume work of the controller's.
async fn assert_create_volume_unimplemented(driver: &TestDriver) {
    let request = create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), SIZE);
    let create = driver.controller().create_volume(request).await;
    expect_code(create, Code::Unimplemented);
}

#[tokio::test]
async fn plugin_info_names_the_driver_and_its_version() {
    let driver = TestDriver::start().await;
    let info = driver
        .identity()
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .expect("GetPluginInfo")
        .into_inner();
    assert_eq!(info.name, DRIVER_NAME);
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
}

#[tokio::test]
async fn plugin_capabilities_offer_controller_and_topology() {
    let driver = TestDriver::start().await;
    let services = plugin_services(&driver).await;
    assert!(services.contains(&PluginService::ControllerService));
    assert!(services.contains(&PluginService::VolumeAccessibilityConstraints));
    let online = csi::plugin_capability::volume_expansion::Type::Online as i32;
    assert!(
        plugin_capabilities(&driver)
            .await
            .iter()
            .any(|cap| matches!(
                cap,
                csi::plugin_capability::Type::VolumeExpansion(e) if e.r#type == online
            )),
        "online volume expansion is claimed"
    );
}

#[tokio::test]
async fn probe_is_ready() {
    let driver = TestDriver::start().await;
    let probe = driver
        .identity()
        .probe(csi::ProbeRequest {})
        .await
        .expect("Probe")
        .into_inner();
    assert_eq!(probe.ready, Some(true));
}

#[tokio::test]
async fn controller_mode_claims_no_volume_work() {
    let driver = start_in_mode("controller").await;
    // csi-resizer needs CONTROLLER_SERVICE to run at all.
    assert!(
        plugin_services(&driver)
            .await
            .contains(&PluginService::ControllerService)
    );
    // Only MODIFY_VOLUME: csi-resizer's changes of VolumeAttributesClass, handed to the
    // volume's node through its PV (no API server here: refused, saying so).
    assert_eq!(
        controller_rpcs(&driver).await,
        vec![ControllerRpc::ModifyVolume]
    );
    let modify = driver
        .controller()
        .controller_modify_volume(csi::ControllerModifyVolumeRequest {
            volume_id: unknown_volume_id(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(modify.code(), Code::FailedPrecondition, "{modify:?}");
    assert!(
        modify.message().contains("no Kubernetes client"),
        "{}",
        modify.message()
    );
    assert_create_volume_unimplemented(&driver).await;
    // csi-resizer reads NodeGetCapabilities on this socket: EXPAND_VOLUME there (and none on
    // the controller) makes it use its trivial resizer, leaving expansion to the node.
    assert!(node_rpcs(&driver).await.contains(&NodeRpc::ExpandVolume));
    let probe = driver.identity().probe(csi::ProbeRequest {}).await;
    assert_eq!(probe.expect("Probe").into_inner().ready, Some(true));
    assert!(
        !driver.data.exists(),
        "controller mode must not touch the data dir"
    );
}

#[tokio::test]
async fn node_mode_offers_no_controller_service() {
    let driver = start_in_mode("node").await;
    let services = plugin_services(&driver).await;
    assert!(!services.contains(&PluginService::ControllerService));
    assert!(services.contains(&PluginService::VolumeAccessibilityConstraints));
    assert_create_volume_unimplemented(&driver).await;
    assert!(node_rpcs(&driver).await.contains(&NodeRpc::GetVolumeStats));
}

#[tokio::test]
async fn node_capabilities_and_info() {
    let driver = TestDriver::start_with(Options {
        max_volumes_per_node: Some(7),
        ..Default::default()
    })
    .await;
    let rpcs = node_rpcs(&driver).await;
    for wanted in [
        // Image volumes mount their filesystem once per node.
        NodeRpc::StageUnstageVolume,
        NodeRpc::GetVolumeStats,
        NodeRpc::ExpandVolume,
        NodeRpc::VolumeCondition,
        NodeRpc::SingleNodeMultiWriter,
    ] {
        assert!(rpcs.contains(&wanted), "{wanted:?} missing from {rpcs:?}");
    }

    let info = driver
        .node()
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .expect("NodeGetInfo")
        .into_inner();
    assert_eq!(info.node_id, NODE_ID);
    assert_eq!(info.max_volumes_per_node, 7);
    assert_eq!(info.accessible_topology, Some(topology(NODE_ID)));
}

#[tokio::test]
async fn controller_capabilities_in_the_default_mode() {
    let driver = TestDriver::start().await;
    let rpcs = controller_rpcs(&driver).await;
    for wanted in [
        ControllerRpc::CreateDeleteVolume,
        ControllerRpc::ListVolumes,
        ControllerRpc::GetCapacity,
        ControllerRpc::GetVolume,
        ControllerRpc::VolumeCondition,
        ControllerRpc::ListVolumesPublishedNodes,
        ControllerRpc::SingleNodeMultiWriter,
        ControllerRpc::CreateDeleteSnapshot,
        ControllerRpc::ListSnapshots,
        ControllerRpc::CloneVolume,
        ControllerRpc::ModifyVolume,
    ] {
        assert!(rpcs.contains(&wanted), "{wanted:?} missing from {rpcs:?}");
    }
    // Attaching is not a thing for node-local volumes; advertising it would make the CO call it.
    assert!(!rpcs.contains(&ControllerRpc::PublishUnpublishVolume));
}

#[tokio::test]
async fn rpcs_we_do_not_offer_answer_unimplemented() {
    let driver = TestDriver::start().await;
    let publish = driver
        .controller()
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: unknown_volume_id(),
            node_id: NODE_ID.into(),
            ..Default::default()
        })
        .await;
    expect_code(publish, Code::Unimplemented);
}
