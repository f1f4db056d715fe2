//! CSI GroupController: group snapshots, cut on the node that holds every member (see
//! `volume::copies::group` for the instant they promise). Served where the Controller service
//! does volume work; in controller mode (beside csi-resizer) it claims no capability.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::csi::group_controller_server::GroupController;
use crate::csi::group_controller_service_capability::{Rpc, rpc};
use crate::csi::{self};
use crate::faces::controller::{timestamp, to_csi_snapshot};
use crate::faces::driver::{Driver, blocking};
use crate::faces::request;
use crate::volume::Volumes;
use crate::volume::copies::group::{GroupRequest, GroupSnapshot};
use crate::volume::state::id::{GroupSnapshotId, SnapshotId, VolumeId};

pub struct GroupControllerService {
    driver: Arc<Driver>,
}

impl GroupControllerService {
    pub fn new(driver: Arc<Driver>) -> Self {
        GroupControllerService { driver }
    }

    fn volumes(&self) -> Result<Arc<Volumes>, Status> {
        self.driver.volumes().map_err(Status::from)
    }
}

fn to_csi_group(group: &GroupSnapshot) -> csi::VolumeGroupSnapshot {
    csi::VolumeGroupSnapshot {
        group_snapshot_id: group.record.id.to_string(),
        snapshots: group.snapshots.iter().map(|s| to_csi_snapshot(s)).collect(),
        creation_time: Some(timestamp(group.record.created_unix_ms)),
        ready_to_use: group.ready(),
    }
}

/// The source volumes: each one of our ids, or NOT_FOUND (an id not ours names nothing here).
fn source_ids(ids: &[String]) -> Result<Vec<VolumeId>, Status> {
    ids.iter()
        .map(|id| {
            request::required("source_volume_ids", id)?;
            VolumeId::parse(id)
                .ok_or_else(|| Status::not_found(format!("source volume {id:?} does not exist")))
        })
        .collect()
}

/// The snapshot ids a call lists: one not ours cannot be a member (INVALID_ARGUMENT, as for a
/// list that does not match).
fn listed_ids(ids: &[String]) -> Result<Vec<SnapshotId>, Status> {
    ids.iter()
        .map(|id| {
            SnapshotId::parse(id).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "snapshot_ids names {id:?}, which is no snapshot of a group"
                ))
            })
        })
        .collect()
}

#[tonic::async_trait]
impl GroupController for GroupControllerService {
    async fn group_controller_get_capabilities(
        &self,
        _request: Request<csi::GroupControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::GroupControllerGetCapabilitiesResponse>, Status> {
        let capabilities = if self.driver.volumes().is_ok() {
            vec![csi::GroupControllerServiceCapability {
                r#type: Some(csi::group_controller_service_capability::Type::Rpc(Rpc {
                    r#type: rpc::Type::CreateDeleteGetVolumeGroupSnapshot as i32,
                })),
            }]
        } else {
            Vec::new()
        };
        Ok(Response::new(csi::GroupControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn create_volume_group_snapshot(
        &self,
        request: Request<csi::CreateVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::CreateVolumeGroupSnapshotResponse>, Status> {
        let req = request.into_inner();
        let name = request::volume_name(&req.name)?.to_string();
        if req.source_volume_ids.is_empty() {
            return Err(Status::invalid_argument("source_volume_ids is required"));
        }
        let sources = source_ids(&req.source_volume_ids)?;
        let parameters = request::group_snapshot_parameters(&req.parameters)?;
        let volumes = self.volumes()?;
        let group = blocking(move || {
            volumes.create_group_snapshot(GroupRequest {
                name,
                sources,
                parameters,
            })
        })
        .await?;
        Ok(Response::new(csi::CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(to_csi_group(&group)),
        }))
    }

    async fn delete_volume_group_snapshot(
        &self,
        request: Request<csi::DeleteVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::DeleteVolumeGroupSnapshotResponse>, Status> {
        let req = request.into_inner();
        request::required("group_snapshot_id", &req.group_snapshot_id)?;
        let volumes = self.volumes()?;
        // Not one of our ids: it cannot exist here, and deleting what does not exist succeeds.
        if let Some(id) = GroupSnapshotId::parse(&req.group_snapshot_id) {
            let listed = listed_ids(&req.snapshot_ids)?;
            blocking(move || volumes.delete_group_snapshot(&id, &listed)).await?;
        }
        Ok(Response::new(csi::DeleteVolumeGroupSnapshotResponse {}))
    }

    async fn get_volume_group_snapshot(
        &self,
        request: Request<csi::GetVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::GetVolumeGroupSnapshotResponse>, Status> {
        let req = request.into_inner();
        let given = request::required("group_snapshot_id", &req.group_snapshot_id)?;
        let id = GroupSnapshotId::parse(given)
            .ok_or_else(|| Status::not_found(format!("group snapshot {given:?} does not exist")))?;
        let listed = listed_ids(&req.snapshot_ids)?;
        let volumes = self.volumes()?;
        let group = blocking(move || volumes.group_snapshot(&id, &listed)).await?;
        Ok(Response::new(csi::GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(to_csi_group(&group)),
        }))
    }
}
