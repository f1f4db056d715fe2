//! NodeGetVolumeStats: the volume's own usage, not the whole filesystem's.

use std::path::Path;

use super::space::limits;
use super::space::pool::Pool;
use super::space::throttle::node_walks;
use super::state::id::VolumeId;
use super::state::record::{Publication, SizeLimit, VolumeKind, VolumeRecord};
use super::{Condition, Volumes, data_problem, joined, usage_problem};
use crate::error::{Error, IoContext, Result};
use crate::host::tree::WalkError;
use crate::host::{fsstat, usage};

/// Total, used and available amounts of one unit (bytes or inodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Amounts {
    pub total: u64,
    pub used: u64,
    pub available: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeStats {
    pub bytes: Amounts,
    /// Filesystem volumes only: a block device has no inodes of its own.
    pub inodes: Option<Amounts>,
    pub condition: Condition,
}

impl Volumes {
    /// What the plain directory `data` of volume `id` uses, by a walk that waits for one of
    /// the pool's walk slots, or the figure a walk found moments ago (see `throttle`).
    pub(super) fn walked_usage(
        &self,
        pool: &Pool,
        id: &VolumeId,
        data: &Path,
    ) -> Result<usage::Usage, WalkError> {
        // A caller gone while this waits gets nothing: ECANCELED stands for "not measured".
        let gone = || WalkError::Io {
            path: data.to_path_buf(),
            source: std::io::Error::from_raw_os_error(libc::ECANCELED),
        };
        let walked = self.usage_cache.get_or_walk(
            id,
            || {
                let Some(_slot) = pool.walks.take() else {
                    return Err(gone());
                };
                let Some(_node_slot) = node_walks().take() else {
                    return Err(gone());
                };
                usage::measure(data)
            },
            gone,
        );
        if let Err(Some(why)) = walked.as_ref().map_err(WalkError::tree_made) {
            self.usage_cache.note_unmeasurable(id, why);
        }
        walked
    }

    /// Stats of volume `id` as published at `path` (NOT_FOUND if it is not published there).
    pub fn stats(&self, id: &VolumeId, path: &Path) -> Result<VolumeStats> {
        let record = self.get(id)?;
        let not_published = || {
            Error::NotFound(format!(
                "volume {id} is not published at {}",
                path.display()
            ))
        };
        let publication = record.publication(path).ok_or_else(not_published)?;
        let pool = self.pool_of(&record)?;
        let data = pool.data_path(id, record.kind);
        let capacity = record.capacity_bytes as u64;
        // Checked before liveness, which needs the data: a published volume whose data vanished
        // must show up as abnormal in kubelet's volume health, not as NOT_FOUND.
        if let Some(problem) = data_problem(&record, &data) {
            return Ok(VolumeStats {
                bytes: Amounts {
                    total: capacity,
                    used: 0,
                    available: 0,
                },
                inodes: None,
                condition: Condition::from_problem(Some(problem)),
            });
        }
        if !self.is_live(&record, publication).unwrap_or(false) {
            return Err(not_published());
        }
        match record.kind {
            VolumeKind::Filesystem => self.directory_stats(&record, publication, pool, &data),
            VolumeKind::Image(fs) => self.image_stats(&record, fs, publication, &data),
            VolumeKind::Block => {
                let file =
                    fsstat::lstat(&data).context(|| format!("inspecting {}", data.display()))?;
                pool.set_used(id, file.allocated);
                Ok(VolumeStats {
                    bytes: Amounts {
                        total: capacity,
                        used: file.allocated.min(capacity),
                        available: capacity.saturating_sub(file.allocated),
                    },
                    inodes: None,
                    condition: Condition::from_problem(pool.starves(id, file.allocated, file.size)),
                })
            }
        }
    }

    /// A filesystem volume's stats: O(1) from the quota where its size is enforced, a walk of
    /// `data` otherwise.
    fn directory_stats(
        &self,
        record: &VolumeRecord,
        publication: &Publication,
        pool: &Pool,
        data: &Path,
    ) -> Result<VolumeStats> {
        let id = &record.id;
        let capacity = record.capacity_bytes as u64;
        let space = fsstat::space(&publication.target)
            .context(|| format!("statvfs {}", publication.target.display()))?;
        // A walk its tree's owner made fail (a tree deeper or larger than we walk, or reshaped
        // while walked) gives the last figure and shows the volume abnormal, saying why, rather
        // than an error kubelet would retry at once; the overflow check counts it as above its size.
        let walk = || match self.walked_usage(pool, id, data) {
            Ok(m) => Ok((m.bytes, Some(m.inodes), None)),
            Err(err) if err.tree_made().is_some() => {
                self.notice_unmeasured(record);
                Ok((
                    pool.used_of(id).unwrap_or(0),
                    None,
                    Some(format!("the usage of volume {id} was not measured: {err}")),
                ))
            }
            Err(err) => Err(Error::volume_walk(id, "measuring", err)),
        };
        let mut unreadable = None;
        if record.size_limit == SizeLimit::BtrfsQgroup {
            pool.commit_qgroups();
        }
        let (used, inodes, limited) = match limits::usage(record.size_limit, data) {
            Ok(Some(quota)) => (quota.used_bytes, quota.inodes, quota.limit_bytes.is_some()),
            Ok(None) => {
                let (bytes, inodes, unmeasured) = walk()?;
                unreadable = unmeasured;
                (bytes, inodes, false)
            }
            // E.g. btrfs quota turned off: measure the slow way and say why.
            Err(err) => {
                let (bytes, inodes, unmeasured) = walk()?;
                unreadable = unmeasured.or(Some(format!(
                    "cannot read the size limit of volume {id}: {err}; it may fill its pool"
                )));
                (bytes, inodes, false)
            }
        };
        pool.set_used(id, used);
        self.notice_overflow(record, used);
        Ok(VolumeStats {
            bytes: Amounts {
                total: capacity,
                used,
                available: capacity.saturating_sub(used).min(space.available_bytes),
            },
            inodes: inodes.map(|used| Amounts {
                total: used + space.available_inodes,
                used,
                available: space.available_inodes,
            }),
            condition: Condition::from_problem(joined(
                joined(self.audit_problem(id), super::fence::fence_problem(record)),
                unreadable.or_else(|| usage_problem(record, used, limited)),
            )),
        })
    }
}
