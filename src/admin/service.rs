//! The admin gRPC service: thin like the CSI ones (validate → call the domain → map errors).

use std::io::{self, Write};
use std::sync::Arc;

use prost::bytes::Bytes;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn};

use super::stream::{CHUNKS_IN_FLIGHT, ChunkReader, ChunkWriter};
use crate::admin_api::{self as api, admin_server::Admin, export_volume_response::Message};
use crate::cluster::node::transfer::{self, target::PullError};
use crate::faces::driver::{Driver, blocking};
use crate::faces::request;
use crate::volume::Volumes;
use crate::volume::inventory::{
    PARAM_PV_NAME, PARAM_PVC_NAME, PARAM_PVC_NAMESPACE, VolumeReport, pod_uid_of,
};
use crate::volume::state::record::{ContentSource, SizeLimit};

pub struct AdminService {
    driver: Arc<Driver>,
}

impl AdminService {
    pub fn new(driver: Arc<Driver>) -> Self {
        AdminService { driver }
    }

    fn volumes(&self) -> Result<Arc<Volumes>, Status> {
        self.driver.volumes().map_err(Status::from)
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn describe_volumes(
        &self,
        request: Request<api::DescribeVolumesRequest>,
    ) -> Result<Response<api::DescribeVolumesResponse>, Status> {
        let request = request.into_inner();
        let (pool, measure) = (request.pool, request.measure);
        let volumes = self.volumes()?;
        let reports = {
            let volumes = volumes.clone();
            let pool = Some(pool).filter(|p| !p.is_empty());
            blocking(move || volumes.describe_all(pool.as_deref(), measure)).await?
        };
        Ok(Response::new(api::DescribeVolumesResponse {
            volumes: reports.iter().map(|r| to_api(&volumes, r)).collect(),
        }))
    }

    async fn describe_volume(
        &self,
        request: Request<api::DescribeVolumeRequest>,
    ) -> Result<Response<api::Volume>, Status> {
        let id = request::volume_id(&request.into_inner().volume_id)?;
        let volumes = self.volumes()?;
        let report = {
            let volumes = volumes.clone();
            blocking(move || volumes.describe(&id)).await?
        };
        Ok(Response::new(to_api(&volumes, &report)))
    }

    async fn remove_volume(
        &self,
        request: Request<api::RemoveVolumeRequest>,
    ) -> Result<Response<api::RemoveVolumeResponse>, Status> {
        let id = request::volume_id(&request.into_inner().volume_id)?;
        let volumes = self.volumes()?;
        blocking(move || {
            // Unlike DeleteVolume, an admin naming a volume that is not here should hear so.
            volumes.get(&id)?;
            volumes.delete(&id)
        })
        .await?;
        Ok(Response::new(api::RemoveVolumeResponse {}))
    }

    async fn pull_volume(
        &self,
        request: Request<api::PullVolumeRequest>,
    ) -> Result<Response<api::PullVolumeResponse>, Status> {
        let request = request.into_inner();
        let id = request::volume_id(&request.volume_id)?;
        if !crate::config::is_object_name(&request.source_pv) {
            return Err(Status::invalid_argument(format!(
                "source_pv {:?} is not a PV name",
                request.source_pv.chars().take(80).collect::<String>()
            )));
        }
        let volumes = self.volumes()?;
        let Some(puller) = transfer::puller(&self.driver.config, &volumes).await else {
            return Err(Status::failed_precondition(
                "this node plugin serves no transfers: it runs without --transfer-address (or without Kubernetes credentials)",
            ));
        };
        let pulled = if request.from_disk.is_empty() {
            puller.pull(&id, &request.source_pv).await
        } else {
            (puller.adopt(&id, &request.source_pv, &request.from_disk)).await
        };
        let pulled = pulled.map_err(|err| match err {
            PullError::Refused(why) => Status::permission_denied(why),
            PullError::Unreachable(why) => Status::unavailable(why),
            PullError::Import(err) => Status::from(err),
        })?;
        info!(volume = %id, source_pv = %request.source_pv, source_node = %pulled.source_node, bytes = pulled.stream_bytes, sha256 = %pulled.sha256, "admin: volume pulled");
        Ok(Response::new(api::PullVolumeResponse {
            source_node: pulled.source_node,
            stream_bytes: pulled.stream_bytes,
            data_bytes: pulled.data_bytes,
            entries: pulled.entries,
            sha256: pulled.sha256,
        }))
    }

    async fn unfence_volume(
        &self,
        request: Request<api::UnfenceVolumeRequest>,
    ) -> Result<Response<api::UnfenceVolumeResponse>, Status> {
        let id = request::volume_id(&request.into_inner().volume_id)?;
        let volumes = self.volumes()?;
        let lifted = blocking(move || volumes.unfence(&id, None)).await?;
        Ok(Response::new(match lifted {
            None => api::UnfenceVolumeResponse::default(),
            Some(outcome) => api::UnfenceVolumeResponse {
                was_fenced: true,
                mounts_writable: outcome.mounts_changed as u32,
                failed: outcome.failed,
            },
        }))
    }

    async fn export_volume(
        &self,
        request: Request<api::ExportVolumeRequest>,
    ) -> Result<Response<BoxStream<api::ExportVolumeResponse>>, Status> {
        let id = request::volume_id(&request.into_inner().volume_id)?;
        let volumes = self.volumes()?;
        // Refusals (published, busy, unknown) answer before any byte is streamed.
        let source = {
            let id = id.clone();
            blocking(move || volumes.open_export(&id)).await?
        };
        let (tx, rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let start = api::ExportVolumeResponse {
            message: Some(Message::Start(api::ExportStart {
                data_bytes: source.header.allocated_bytes,
                source: source.description.clone(),
            })),
        };
        info!(volume = %id, source = %source.description, "export started");
        // The source (its hold on the volume, or its temporary snapshot) lives as long as
        // the writing: until the end, an error, or the client going away.
        tokio::task::spawn_blocking(move || {
            if tx.blocking_send(Ok(start)).is_err() {
                return;
            }
            let mut out = ChunkWriter::new(tx.clone(), |data| api::ExportVolumeResponse {
                message: Some(Message::Data(data.into())),
            });
            let written = source.write_to(&mut out).and_then(|summary| {
                out.flush()
                    .map_err(|err| crate::error::Error::host("sending the export", err))?;
                Ok(summary)
            });
            // The stream ends when the last sender goes: only once the source has let go of
            // the volume and removed its temporary snapshot, so a client that saw the end
            // finds the node as it was.
            drop(out);
            drop(source);
            match written {
                Ok(summary) => {
                    info!(volume = %id, bytes = summary.stream_bytes, data_bytes = summary.data_bytes, entries = summary.entries, "export finished")
                }
                Err(err) => {
                    warn!(volume = %id, error = %err, "export failed");
                    let _ = tx.blocking_send(Err(Status::from(err)));
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn import_volume(
        &self,
        request: Request<Streaming<api::ImportVolumeRequest>>,
    ) -> Result<Response<api::ImportVolumeResponse>, Status> {
        let mut stream = request.into_inner();
        let first = stream.message().await?.ok_or_else(|| {
            Status::invalid_argument("empty import: the first message names the volume")
        })?;
        let id = request::volume_id(&first.volume_id)?;
        let volumes = self.volumes()?;
        let (tx, rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
        tokio::spawn(forward(first.data, stream, tx));
        let reader = ChunkReader::new(rx);
        let summary = blocking(move || volumes.import(&id, first.replace, reader)).await?;
        Ok(Response::new(api::ImportVolumeResponse {
            stream_bytes: summary.stream_bytes,
            data_bytes: summary.data_bytes,
            entries: summary.entries,
            sha256: summary.sha256_hex(),
        }))
    }
}

/// Hands the bytes of an import's messages to the blocking reader, in order; ends when the
/// client finishes (EOF) or its stream breaks (an error the import reports).
async fn forward(
    first: Bytes,
    mut stream: Streaming<api::ImportVolumeRequest>,
    tx: mpsc::Sender<io::Result<Bytes>>,
) {
    if !first.is_empty() && tx.send(Ok(first)).await.is_err() {
        return;
    }
    loop {
        let next = match stream.message().await {
            Ok(Some(message)) if message.data.is_empty() => continue,
            Ok(Some(message)) => Ok(message.data),
            Ok(None) => return,
            Err(status) => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!("the client's stream broke: {}", status.message()),
            )),
        };
        let broken = next.is_err();
        // A closed channel: the import ended (done or refused) and reads no more.
        if tx.send(next).await.is_err() || broken {
            return;
        }
    }
}

fn to_api(volumes: &Volumes, report: &VolumeReport) -> api::Volume {
    let record = &report.record;
    api::Volume {
        volume_id: record.id.to_string(),
        name: record.name.clone(),
        pv_name: report.parameter(PARAM_PV_NAME).to_string(),
        pvc_namespace: report.parameter(PARAM_PVC_NAMESPACE).to_string(),
        pvc_name: report.parameter(PARAM_PVC_NAME).to_string(),
        pool: record.pool.clone(),
        access_type: record.kind.as_str().to_string(),
        capacity_bytes: record.capacity_bytes,
        used_bytes: report.used_bytes,
        enforcement: match record.size_limit {
            SizeLimit::None => "none",
            // An image volume's limit is its own filesystem's size.
            SizeLimit::File if record.kind.image_fs().is_some() => "filesystem",
            SizeLimit::File => "file",
            SizeLimit::BtrfsQgroup => "btrfs-qgroup",
            SizeLimit::ProjectQuota { .. } => "project-quota",
        }
        .to_string(),
        abnormal: report.condition.abnormal,
        orphaned: record.orphaned.is_some(),
        condition: report.condition.message.clone(),
        publications: record
            .publications
            .iter()
            .map(|p| api::Publication {
                target_path: p.target.display().to_string(),
                pod_uid: pod_uid_of(&p.target, volumes.kubelet_dir()).unwrap_or_default(),
                readonly: p.readonly,
                device: p
                    .loop_device
                    .as_ref()
                    .map(|name| format!("/dev/{name}"))
                    .unwrap_or_default(),
                staging: p.staging,
            })
            .collect(),
        snapshots: report
            .snapshots
            .iter()
            .map(|s| api::Snapshot {
                snapshot_id: s.id.to_string(),
                name: s.name.clone(),
                size_bytes: s.size_bytes,
                ready: s.ready,
                created_unix_ms: s.created_unix_ms,
                error: s.copy_stopped().unwrap_or_default(),
            })
            .collect(),
        host_path: report.host_path.display().to_string(),
        access_modes: record
            .access_modes
            .iter()
            .map(|m| {
                serde_json::to_value(m)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            })
            .collect(),
        created_unix_ms: record.created_unix_ms,
        content_source: match &record.content_source {
            Some(ContentSource::Snapshot(id)) => format!("snapshot {id}"),
            Some(ContentSource::Volume(id)) => format!("volume {id}"),
            None => String::new(),
        },
    }
}
