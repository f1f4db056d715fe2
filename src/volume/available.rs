//! What a pool can still promise (GetCapacity), and the usage measurements that keep the
//! promises honest (see `accounting`).

use tracing::{debug, error};

use super::Volumes;
use super::space::limits;
use super::space::mechanism::Mechanism;
use super::space::pool::Pool;
use super::state::record::{SizeLimit, VolumeKind, VolumeRecord};
use crate::host::{btrfs, fsstat};

impl Volumes {
    /// What pool `pool_name` can promise to new volumes of `kinds`, measured afresh. Zero when
    /// this node lacks the pool, or when `require_enforcement` asks for limited filesystem
    /// volumes and the pool cannot limit them (so the scheduler looks elsewhere).
    pub fn available_for(
        &self,
        pool_name: &str,
        kinds: &[VolumeKind],
        require_enforcement: bool,
    ) -> crate::error::Result<u64> {
        let Ok(pool) = self.pool(pool_name) else {
            return Ok(0);
        };
        // No capability given: the answer must hold for any volume, so filesystem too.
        let wants_directories = kinds.is_empty() || kinds.contains(&VolumeKind::Filesystem);
        if require_enforcement && wants_directories && !pool.enforcement.enforces() {
            return Ok(0);
        }
        // A filesystem this node cannot make is as absent as a pool (see `create`).
        if kinds
            .iter()
            .filter_map(|kind| kind.image_fs())
            .any(|fs| fs.missing_tool().is_some())
        {
            return Ok(0);
        }
        self.refresh_usage(pool);
        pool.available()
    }

    /// Measures what every volume of `pool` uses where that is cheap (block files, quotas);
    /// plain directories keep their last measurement (NodeGetVolumeStats walks them).
    pub(super) fn refresh_usage(&self, pool: &Pool) {
        pool.commit_qgroups();
        for record in self.store.all().iter().filter(|r| r.pool == pool.name) {
            if let Some(used) = cheap_usage(pool, record) {
                pool.set_used(&record.id, used);
            }
        }
        // What a btrfs snapshot holds alone grows as its source is overwritten or deleted.
        let btrfs_snapshots =
            self.snapshots.all().into_iter().filter(|r| {
                r.pool == pool.name && r.ready && r.mechanism == Mechanism::BtrfsSnapshot
            });
        for record in btrfs_snapshots {
            let path = pool.snapshot_path(&record.id, record.kind);
            match btrfs::subvolume_id(&path).and_then(|id| btrfs::usage(&path, id)) {
                Ok(usage) => pool.set_used(&record.id, usage.exclusive),
                Err(err) => {
                    debug!(snapshot = %record.id, error = %err, "cannot measure snapshot usage")
                }
            }
        }
        pool.usage_measured();
    }
}

/// A volume's usage without walking its tree, if its kind or limit allows.
pub(super) fn cheap_usage(pool: &Pool, record: &VolumeRecord) -> Option<u64> {
    let path = pool.data_path(&record.id, record.kind);
    let measured = match (record.kind, record.size_limit) {
        (VolumeKind::Block | VolumeKind::Image(_), _) => {
            fsstat::lstat(&path).map(|stat| Some(stat.allocated))
        }
        (VolumeKind::Filesystem, SizeLimit::None | SizeLimit::File) => Ok(None),
        (VolumeKind::Filesystem, limit) => {
            limits::usage(limit, &path).map(|usage| usage.map(|u| u.used_bytes))
        }
    };
    measured.unwrap_or_else(|err| {
        // Gone or unreadable: keep the last figure (the safe side), the condition reports it.
        debug!(volume = %record.id, error = %err, "cannot measure usage");
        None
    })
}

impl Volumes {
    /// Logs an error for every pool found full at start (see `space::full`), with what to do
    /// about it.
    pub(in crate::volume) fn report_full_pools(&self) {
        for pool in self.pools().iter().filter(|p| p.is_full().unwrap_or(false)) {
            error!(pool = %pool.name, filesystem = %pool.root.display(), "the filesystem of pool {} ({}) is full: new volumes are refused with RESOURCE_EXHAUSTED{}. Free space there: delete volumes (DeleteVolume, `stickyvol volume delete`) or files a tenant wrote in a volume without size enforcement; the driver recovers by itself", pool.name, pool.root.display(), if pool.name == self.default_pool().name { ", and record changes only fit in the space the state journal reserved" } else { "" });
        }
    }
}
