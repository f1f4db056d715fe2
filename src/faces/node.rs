//! CSI Node: what kubelet calls to make a volume appear in (and leave) a pod.

use std::path::Path;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::csi::node_server::Node;
use crate::csi::node_service_capability::{Rpc, rpc};
use crate::csi::{self, volume_usage::Unit};
use crate::faces::driver::{Driver, blocking};
use crate::faces::request;
use crate::volume::Volumes;
use crate::volume::image::StageRequest;
use crate::volume::publish::PublishRequest;
use crate::volume::state::id::VolumeId;
use crate::volume::stats::Amounts;

pub struct NodeService {
    driver: Arc<Driver>,
}

impl NodeService {
    pub fn new(driver: Arc<Driver>) -> Self {
        NodeService { driver }
    }

    fn volumes(&self) -> Result<Arc<Volumes>, Status> {
        self.driver.volumes().map_err(Status::from)
    }

    fn kubelet_dir(&self) -> &Path {
        &self.driver.config.kubelet_dir
    }
}

fn usage(amounts: Amounts, unit: Unit) -> csi::VolumeUsage {
    let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    csi::VolumeUsage {
        available: clamp(amounts.available),
        total: clamp(amounts.total),
        used: clamp(amounts.used),
        unit: unit as i32,
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let req = request.into_inner();
        request::required("volume_id", &req.volume_id)?;
        let staging = request::path_beneath(
            self.kubelet_dir(),
            "staging_target_path",
            &req.staging_target_path,
        )?;
        let capability = request::capability(req.volume_capability.as_ref())?;
        let id = request::volume_id(&req.volume_id)?;
        let volumes = self.volumes()?;
        // Directory and block volumes: answered from memory, with no thread hop.
        if volumes.stages_nothing(&id, &capability)? {
            return Ok(Response::new(csi::NodeStageVolumeResponse {}));
        }
        let stage = StageRequest {
            staging,
            capability,
            key: request::stage_key(&req.secrets)?.map(std::sync::Arc::new),
        };
        blocking(move || volumes.stage(&id, stage)).await?;
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let req = request.into_inner();
        request::required("volume_id", &req.volume_id)?;
        let staging = request::path_beneath(
            self.kubelet_dir(),
            "staging_target_path",
            &req.staging_target_path,
        )?;
        // As for unpublish: an id that is not ours must never leave kubelet hanging.
        let id = VolumeId::parse(&req.volume_id);
        let volumes = self.volumes()?;
        if id.as_ref().is_some_and(|id| volumes.unstages_nothing(id)) {
            return Ok(Response::new(csi::NodeUnstageVolumeResponse {}));
        }
        blocking(move || volumes.unstage(id.as_ref(), &staging)).await?;
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        // Every argument is checked before the id is looked up: a bad request is INVALID_ARGUMENT
        // even for an unknown volume.
        request::required("volume_id", &req.volume_id)?;
        let target = request::path_beneath(self.kubelet_dir(), "target_path", &req.target_path)?;
        let capability = request::capability(req.volume_capability.as_ref())?;
        let pod = request::pod_info(&req.volume_context)?;
        let id = request::volume_id(&req.volume_id)?;
        let volumes = self.volumes()?;
        let publish = PublishRequest {
            target,
            capability,
            readonly: req.readonly,
            pod,
        };
        blocking(move || volumes.publish(&id, publish)).await?;
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        request::required("volume_id", &req.volume_id)?;
        let target = request::path_beneath(self.kubelet_dir(), "target_path", &req.target_path)?;
        // An id that is not ours still gets its target tidied: kubelet must never hang on it.
        let id = VolumeId::parse(&req.volume_id);
        let volumes = self.volumes()?;
        blocking(move || volumes.unpublish(id.as_ref(), &target)).await?;
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let req = request.into_inner();
        request::required("volume_id", &req.volume_id)?;
        request::required("volume_path", &req.volume_path)?;
        let id = request::volume_id(&req.volume_id)?;
        let volumes = self.volumes()?;
        // The path is only compared with recorded targets, never used to touch the host itself.
        let path = std::path::PathBuf::from(req.volume_path);
        let stats = blocking(move || volumes.stats(&id, &path)).await?;
        let mut usage_list = vec![usage(stats.bytes, Unit::Bytes)];
        usage_list.extend(stats.inodes.map(|inodes| usage(inodes, Unit::Inodes)));
        Ok(Response::new(csi::NodeGetVolumeStatsResponse {
            usage: usage_list,
            volume_condition: Some(csi::VolumeCondition {
                abnormal: stats.condition.abnormal,
                message: stats.condition.message,
            }),
        }))
    }

    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        request::required("volume_id", &req.volume_id)?;
        request::required("volume_path", &req.volume_path)?;
        let range = req.capacity_range.unwrap_or_default();
        // CSI: neither bound may be negative (CreateVolume refuses them the same way).
        if range.required_bytes < 0 || range.limit_bytes < 0 {
            return Err(Status::invalid_argument(format!(
                "capacity_range must not be negative (required_bytes {}, limit_bytes {})",
                range.required_bytes, range.limit_bytes
            )));
        }
        let kind = match req.volume_capability.as_ref() {
            Some(cap) => Some(request::capability(Some(cap))?.kind),
            None => None,
        };
        let id = request::volume_id(&req.volume_id)?;
        let volumes = self.volumes()?;
        // An unknown volume is NOT_FOUND whatever the path (csi-sanity sends "some/path"); the
        // path is then checked like any kubelet path, though growing never touches it.
        volumes.get(&id)?;
        request::expand_volume_path(self.kubelet_dir(), &req.volume_path)?;
        // No capacity_range: nothing asked beyond the current size (0 is always satisfied).
        let capacity_bytes =
            blocking(move || volumes.expand(&id, kind, range.required_bytes, range.limit_bytes))
                .await?;
        Ok(Response::new(csi::NodeExpandVolumeResponse {
            capacity_bytes,
        }))
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        let capabilities = [
            // Image volumes mount their filesystem once per node; the others stage nothing.
            rpc::Type::StageUnstageVolume,
            rpc::Type::GetVolumeStats,
            rpc::Type::ExpandVolume,
            rpc::Type::VolumeCondition,
            rpc::Type::SingleNodeMultiWriter,
        ]
        .into_iter()
        .map(|t| csi::NodeServiceCapability {
            r#type: Some(csi::node_service_capability::Type::Rpc(Rpc {
                r#type: t as i32,
            })),
        })
        .collect();
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn node_get_info(
        &self,
        _request: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        let config = &self.driver.config;
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: config.node_id.clone(),
            max_volumes_per_node: config.max_volumes_per_node,
            accessible_topology: Some(self.driver.topology()),
        }))
    }
}
