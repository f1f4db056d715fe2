//! The puller's other source: a dead node's disk, attached to this node and mounted by an
//! operator at `<data-dir>/adopt/<disk>`. The source PV must name this node in
//! `stickyvol.csi.io/move-to`, as a node-to-node pull must; its volume's data is read from the
//! disk's pool and imported here (`Volumes::adopt`, which trusts nothing of that pool).

use std::path::PathBuf;

use tracing::info;

use super::target::{PullError, Pulled, Puller, Source};
use crate::cluster::kit::names::MOVE_TO;
use crate::volume::copies::adopt::disk_name_is_valid;
use crate::volume::state::id::VolumeId;

/// Under the data dir: where an operator mounts a dead node's disk to adopt its volumes.
pub const ADOPT_DIR: &str = "adopt";

impl Puller {
    /// Copies the volume of PV `source_pv` (pinned to another node, whose disk is mounted here
    /// as `disk`) into `target`, replacing what it holds.
    pub async fn adopt(
        &self,
        target: &VolumeId,
        source_pv: &str,
        disk: &str,
    ) -> Result<Pulled, PullError> {
        if !disk_name_is_valid(disk) {
            let shown: String = disk.chars().take(80).collect();
            return Err(PullError::Refused(format!(
                "{shown:?} is not a disk name (one plain name under {ADOPT_DIR}/)"
            )));
        }
        let Source {
            node,
            volume,
            move_to,
        } = self.source_of(source_pv).await?;
        if move_to.as_deref() != Some(self.settings.node.as_str()) {
            return Err(PullError::Refused(format!(
                "PV {source_pv} is not to move here ({MOVE_TO} does not name {})",
                self.settings.node
            )));
        }
        let source = VolumeId::parse(&volume).ok_or_else(|| {
            PullError::Refused(format!("PV {source_pv} names no volume of this driver"))
        })?;
        let pool_root: PathBuf = self.settings.adopt_root.join(disk);
        info!(target = %target, source = %source, source_node = %node, pool = %pool_root.display(), "transfer: adopting a volume from a disk");
        let volumes = self.volumes.clone();
        let id = target.clone();
        let summary = tokio::task::spawn_blocking(move || volumes.adopt(&id, &source, &pool_root))
            .await
            .map_err(|err| PullError::Unreachable(err.to_string()))?
            .map_err(PullError::Import)?;
        Ok(Pulled {
            source_node: node,
            stream_bytes: summary.stream_bytes,
            data_bytes: summary.data_bytes,
            entries: summary.entries,
            sha256: summary.sha256_hex(),
        })
    }
}
