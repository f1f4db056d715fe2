//! What the admin commands show about a node's volumes: the record joined with what the host
//! says now (usage where it is cheap to know, condition, publications, snapshots).

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use tracing::debug;

use super::available::cheap_usage;
use super::copies::snapshot::SnapshotRecord;
use super::space::pool::Pool;
use super::state::id::VolumeId;
use super::state::record::VolumeRecord;
use super::{Condition, Volumes};
use crate::error::{Error, IoContext, Result};

/// csi-provisioner's `--extra-create-metadata` parameters.
pub const PARAM_PV_NAME: &str = "csi.storage.k8s.io/pv/name";
pub const PARAM_PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
pub const PARAM_PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";

/// One volume as an admin sees it.
#[derive(Debug, Clone)]
pub struct VolumeReport {
    pub record: Arc<VolumeRecord>,
    /// Bytes in use where quotas or the file's allocation tell it, or a walk measured it; None
    /// for a plain directory not measured.
    pub used_bytes: Option<u64>,
    pub condition: Condition,
    pub host_path: PathBuf,
    /// Snapshots taken of it that still exist, oldest first.
    pub snapshots: Vec<Arc<SnapshotRecord>>,
}

impl VolumeReport {
    pub fn parameter(&self, key: &str) -> &str {
        self.record.parameters.get(key).map_or("", String::as_str)
    }
}

impl Volumes {
    /// Records that volume `id` serves claim `namespace/name` from now on (a move re-bound the
    /// claim to it; csi-provisioner named the move's temporary claim): Events about the volume
    /// go to that claim.
    pub fn name_claim(&self, id: &VolumeId, namespace: &str, name: &str) -> Result<()> {
        let _slot = self.claim(id)?;
        let record = self.get(id)?;
        let mut parameters = record.parameters.clone();
        parameters.insert(PARAM_PVC_NAMESPACE.into(), namespace.into());
        parameters.insert(PARAM_PVC_NAME.into(), name.into());
        self.store
            .put(VolumeRecord {
                parameters,
                ..(*record).clone()
            })
            .context(|| format!("writing the record of volume {id}"))?;
        Ok(())
    }

    /// Every volume, or those of pool `pool` (NOT_FOUND for a pool this node lacks), by id;
    /// `measure` walks plain directories for their usage.
    pub fn describe_all(&self, pool: Option<&str>, measure: bool) -> Result<Vec<VolumeReport>> {
        if let Some(name) = pool
            && self.pools().iter().all(|p| p.name != name)
        {
            return Err(Error::NotFound(format!("this node has no pool {name:?}")));
        }
        let mut records = self.store.all();
        records.retain(|r| pool.is_none_or(|name| r.pool == name));
        records.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        let snapshots = self.snapshots.all();
        Ok(records
            .into_iter()
            .map(|record| self.report(record, &snapshots, measure))
            .collect())
    }

    /// One volume, measured (NOT_FOUND if this node does not hold it).
    pub fn describe(&self, id: &super::state::id::VolumeId) -> Result<VolumeReport> {
        let record = self.get(id)?;
        Ok(self.report(record, &self.snapshots.all(), true))
    }

    /// What a plain directory uses, by a walk (None if it cannot be walked: its condition says
    /// why); the pool's books learn it too.
    fn measured(&self, pool: &Pool, record: &VolumeRecord) -> Option<u64> {
        let data = pool.data_path(&record.id, record.kind);
        match self.walked_usage(pool, &record.id, &data) {
            Ok(usage) => {
                pool.set_used(&record.id, usage.bytes);
                Some(usage.bytes)
            }
            Err(err) => {
                debug!(volume = %record.id, error = %err, "cannot measure usage");
                None
            }
        }
    }

    fn report(
        &self,
        record: Arc<VolumeRecord>,
        snapshots: &[Arc<SnapshotRecord>],
        measure: bool,
    ) -> VolumeReport {
        let pool = self.pool_of(&record).ok();
        let used_bytes = pool.and_then(|pool| {
            pool.commit_qgroups();
            cheap_usage(pool, &record).or_else(|| measure.then(|| self.measured(pool, &record))?)
        });
        let host_path = match &record.orphaned {
            Some(orphaned) => orphaned.lost_path.clone(),
            None => pool.map_or_else(PathBuf::new, |pool| pool.data_path(&record.id, record.kind)),
        };
        let mut taken: Vec<_> = snapshots
            .iter()
            .filter(|s| s.source_volume == record.id)
            .cloned()
            .collect();
        taken.sort_by_key(|s| (s.created_unix_ms, s.id.as_str().to_string()));
        VolumeReport {
            condition: self.condition(&record),
            record,
            used_bytes,
            host_path,
            snapshots: taken,
        }
    }
}

/// The pod a kubelet target path belongs to: `<kubelet>/pods/<uid>/volumes/…` (filesystem) or
/// `<kubelet>/plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<uid>` (block).
pub fn pod_uid_of(target: &Path, kubelet_dir: &Path) -> Option<String> {
    let parts: Vec<&str> = target
        .strip_prefix(kubelet_dir)
        .ok()?
        .components()
        .map(|c| match c {
            Component::Normal(part) => part.to_str(),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let uid = match parts.as_slice() {
        ["pods", uid, "volumes", ..] => uid,
        [
            "plugins",
            "kubernetes.io",
            "csi",
            "volumeDevices",
            "publish",
            _pv,
            uid,
        ] => uid,
        _ => return None,
    };
    Some(uid.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_uids_come_from_kubelet_paths() {
        let kubelet = Path::new("/var/lib/kubelet");
        let fs =
            Path::new("/var/lib/kubelet/pods/0b6c1a2e-7f/volumes/kubernetes.io~csi/pvc-1/mount");
        let block = Path::new(
            "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-2/5d1e-aa",
        );
        assert_eq!(pod_uid_of(fs, kubelet).as_deref(), Some("0b6c1a2e-7f"));
        assert_eq!(pod_uid_of(block, kubelet).as_deref(), Some("5d1e-aa"));
        assert_eq!(pod_uid_of(Path::new("/var/lib/kubelet/x/y"), kubelet), None);
        assert_eq!(
            pod_uid_of(Path::new("/elsewhere/pods/u/volumes/x"), kubelet),
            None
        );
    }
}
