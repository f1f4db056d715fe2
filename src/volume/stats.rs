//! NodeGetVolumeStats: the volume's own usage, not the whole filesystem's.

use std::path::Path;

use super::id::VolumeId;
use super::limits;
use super::record::VolumeKind;
use super::{Condition, Volumes, walk_failure};
use crate::error::{Error, IoContext, Result};
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
        let mut condition = self.condition(&record);
        // Checked before liveness, which needs the data: a published volume whose data vanished
        // must show up as abnormal in kubelet's volume health, not as NOT_FOUND.
        if !condition.abnormal && !self.is_live(&record, publication).unwrap_or(false) {
            return Err(not_published());
        }
        if condition.abnormal {
            let zero = Amounts {
                total: capacity,
                used: 0,
                available: 0,
            };
            return Ok(VolumeStats {
                bytes: zero,
                inodes: None,
                condition,
            });
        }
        match record.kind {
            VolumeKind::Filesystem => {
                let space = fsstat::space(&publication.target)
                    .context(|| format!("statvfs {}", publication.target.display()))?;
                let (used, inodes) = match limits::usage(record.size_limit, &data)
                    .context(|| format!("reading the quota of volume {id}"))?
                {
                    Some(quota) => {
                        if quota.limit_bytes.is_none() {
                            condition = Condition {
                                abnormal: true,
                                message: format!(
                                    "the size limit of volume {id} is gone ({:?}); it can fill the disk",
                                    record.size_limit
                                ),
                            };
                        }
                        (quota.used_bytes, quota.inodes)
                    }
                    None => {
                        let measured = usage::measure(&data)
                            .map_err(|err| walk_failure(id, "measuring", err))?;
                        (measured.bytes, Some(measured.inodes))
                    }
                };
                pool.set_used(id, used);
                if used > capacity && !condition.abnormal {
                    condition = Condition {
                        abnormal: true,
                        message: format!(
                            "volume {id} uses {used} bytes, more than its size of {capacity} bytes{}",
                            if record.size_limit.is_enforced() {
                                ""
                            } else {
                                " (sizes are not enforced on its pool)"
                            }
                        ),
                    };
                }
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
                    condition,
                })
            }
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
                    condition,
                })
            }
        }
    }
}
