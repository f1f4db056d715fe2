//! Keeping filesystem volumes within their size: which mechanism a pool uses, and the four
//! things each one does (make a limited directory, resize the limit, read usage, clean up).
//!
//! - btrfs: every volume is a subvolume whose qgroup is limited to the volume's size.
//! - XFS/ext4: every volume's directory carries its own project id (inherited by everything
//!   created below it) whose project quota is the volume's size.
//! - none: plain directories; usage is measured by walking the tree and never limited.
//!
//! The mechanism a volume was made with is kept in its record (`SizeLimit`), so a pool whose
//! setting changes later still handles its existing volumes the way they were made.

use std::fs;
use std::io;
use std::path::Path;

use tracing::{info, warn};

use crate::config::EnforcementChoice;
use crate::error::{Error, IoContext, Result};
use crate::host::fsstat::{self, FsKind};
use crate::host::projquota::{self, ProjectIdLease, ProjectIds};
use crate::host::tree::WalkError;
use crate::host::{btrfs, safe_delete};
use crate::volume::space::throttle::{caller_gone, node_walks};
use crate::volume::state::record::{Allocation, SizeLimit, VolumeRecord};

/// How one pool limits the size of new filesystem volumes.
#[derive(Debug)]
pub enum Enforcement {
    None,
    Btrfs,
    Project(ProjectIds),
}

/// A filesystem volume's directory just made; `commit` once its record is written.
pub struct NewDirectory {
    pub limit: SizeLimit,
    lease: Option<ProjectIdLease>,
}

impl NewDirectory {
    /// The project id now belongs to a record: it is not offered again.
    pub fn commit(self) {
        if let Some(lease) = self.lease {
            lease.commit();
        }
    }
}

/// Usage read from the mechanism that limits the volume: O(1), no tree walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitUsage {
    pub used_bytes: u64,
    /// Files and directories charged to the volume, where the mechanism counts them.
    pub inodes: Option<u64>,
    /// The limit in force; `None` when it has gone missing.
    pub limit_bytes: Option<u64>,
}

impl Enforcement {
    /// Picks the mechanism for the pool at `root` (see `EnforcementChoice`). Project ids come
    /// from `project_ids`, one allocator for every pool of the node, so two pools on one
    /// filesystem can never hand out the same id.
    pub fn choose(
        pool: &str,
        root: &Path,
        choice: EnforcementChoice,
        project_ids: &ProjectIds,
    ) -> Result<Enforcement> {
        if choice == EnforcementChoice::None {
            return Ok(Enforcement::None);
        }
        let kind = fsstat::filesystem_kind(root)
            .context(|| format!("probing the filesystem of {}", root.display()))?;
        let refuse = |why: String| {
            Err(Error::FailedPrecondition(format!(
                "pool {pool:?} at {}: {why}",
                root.display()
            )))
        };
        let project_ids = || Enforcement::Project(project_ids.clone());
        let quota_on = |probe: fn(&Path) -> io::Result<bool>| {
            probe(root).context(|| format!("checking quota on {}", root.display()))
        };
        match (choice, kind) {
            (EnforcementChoice::Btrfs, FsKind::Btrfs) => {
                if !quota_on(btrfs::quota_enabled)? {
                    // Quota has a cost on big filesystems: done only when asked for by name.
                    info!(pool, root = %root.display(), "enabling btrfs quota (--enforcement {pool}=btrfs)");
                    btrfs::enable_quota(root)
                        .context(|| format!("enabling btrfs quota on {}", root.display()))?;
                }
                Ok(Enforcement::Btrfs)
            }
            (EnforcementChoice::Btrfs, other) => refuse(format!(
                "--enforcement btrfs needs a btrfs filesystem, this is {}",
                other.name()
            )),
            (EnforcementChoice::Project, FsKind::Xfs | FsKind::Ext4) => {
                if quota_on(projquota::project_quota_enabled)? {
                    Ok(project_ids())
                } else {
                    refuse(
                        "--enforcement project needs the filesystem mounted with prjquota".into(),
                    )
                }
            }
            (EnforcementChoice::Project, other) => refuse(format!(
                "--enforcement project needs XFS or ext4, this is {}",
                other.name()
            )),
            (_, FsKind::Btrfs) => {
                if quota_on(btrfs::quota_enabled)? {
                    Ok(Enforcement::Btrfs)
                } else {
                    warn!(pool, root = %root.display(), "btrfs quota is off: filesystem volume sizes are NOT enforced; start with --enforcement {pool}=btrfs to enable quota");
                    Ok(Enforcement::None)
                }
            }
            (_, FsKind::Xfs | FsKind::Ext4) => {
                if quota_on(projquota::project_quota_enabled)? {
                    Ok(project_ids())
                } else {
                    warn!(pool, root = %root.display(), filesystem = kind.name(), "no project quota (mount with prjquota): filesystem volume sizes are NOT enforced");
                    Ok(Enforcement::None)
                }
            }
            (_, other) => {
                warn!(pool, root = %root.display(), filesystem = other.name(), "this filesystem cannot limit directory sizes: filesystem volume sizes are NOT enforced");
                Ok(Enforcement::None)
            }
        }
    }

    pub fn enforces(&self) -> bool {
        !matches!(self, Enforcement::None)
    }

    pub fn describe(&self) -> &'static str {
        match self {
            Enforcement::None => "none (sizes measured, not enforced)",
            Enforcement::Btrfs => "btrfs qgroups",
            Enforcement::Project(_) => "project quotas",
        }
    }

    /// Makes the (staging) directory `dir` of a filesystem volume, limited to `capacity` bytes
    /// where this pool can. On error nothing needs undoing but removing `dir`.
    pub fn make_directory(&self, dir: &Path, capacity: u64) -> Result<NewDirectory> {
        let made = match self {
            Enforcement::None => {
                mkdir(dir)?;
                NewDirectory {
                    limit: SizeLimit::None,
                    lease: None,
                }
            }
            Enforcement::Btrfs => {
                let (parent, name) = split(dir)?;
                btrfs::create_subvolume(parent, name)
                    .context(|| format!("creating subvolume {}", dir.display()))?;
                btrfs::set_limit(dir, capacity)
                    .context(|| format!("limiting {} to {capacity} bytes", dir.display()))?;
                NewDirectory {
                    limit: SizeLimit::BtrfsQgroup,
                    lease: None,
                }
            }
            Enforcement::Project(ids) => {
                mkdir(dir)?;
                let lease = ids
                    .allocate(|id| projquota::project_use(dir, id))
                    .context(|| format!("choosing a project id for {}", dir.display()))?;
                let project_id = lease.id();
                projquota::assign_project(dir, project_id)
                    .and_then(|()| projquota::set_project_limit(dir, project_id, capacity))
                    .context(|| {
                        format!(
                            "limiting {} to {capacity} bytes (project {project_id})",
                            dir.display()
                        )
                    })?;
                NewDirectory {
                    limit: SizeLimit::ProjectQuota { project_id },
                    lease: Some(lease),
                }
            }
        };
        // mkdir honours the umask; emptyDir semantics want every user of the pod to write.
        super::set_mode(dir, 0o777)?;
        Ok(made)
    }

    /// Makes the (staging) directory `dir` of a filesystem volume as a writable btrfs snapshot
    /// of the subvolume `source` (a snapshot or another volume: O(1), extents shared), limited
    /// to `capacity` bytes like a new volume. Only for pools limiting sizes with btrfs qgroups.
    pub fn clone_subvolume(
        &self,
        source: &Path,
        dir: &Path,
        capacity: u64,
    ) -> Result<NewDirectory> {
        if !matches!(self, Enforcement::Btrfs) {
            return Err(Error::FailedPrecondition(format!(
                "cannot clone {} as a subvolume: the pool does not make volumes as btrfs subvolumes",
                source.display()
            )));
        }
        let (parent, name) = split(dir)?;
        btrfs::snapshot_subvolume(source, parent, name, false)
            .context(|| format!("cloning {} as {}", source.display(), dir.display()))?;
        btrfs::set_limit(dir, capacity)
            .context(|| format!("limiting {} to {capacity} bytes", dir.display()))?;
        Ok(NewDirectory {
            limit: SizeLimit::BtrfsQgroup,
            lease: None,
        })
    }

    /// Makes sure the directory `dir` of a filesystem volume limited by `limit` exists with its
    /// limit in force (after a power loss took some of an unflushed create): made again if
    /// missing (keeping the record's project id), its limit set again if gone.
    pub fn remake_directory(&self, limit: SizeLimit, dir: &Path, capacity: u64) -> Result<()> {
        let missing = fsstat::lstat_if_exists(dir)
            .context(|| format!("inspecting {}", dir.display()))?
            .is_none();
        let limited = |what: io::Result<()>| {
            what.context(|| format!("limiting {} to {capacity} bytes", dir.display()))
        };
        match limit {
            SizeLimit::None | SizeLimit::File => {
                if missing {
                    mkdir(dir)?;
                }
            }
            SizeLimit::BtrfsQgroup => {
                if missing {
                    let (parent, name) = split(dir)?;
                    btrfs::create_subvolume(parent, name)
                        .context(|| format!("creating subvolume {}", dir.display()))?;
                }
                let in_force = !missing
                    && usage(limit, dir)
                        .ok()
                        .flatten()
                        .is_some_and(|u| u.limit_bytes.is_some());
                if !in_force {
                    limited(btrfs::set_limit(dir, capacity))?;
                }
            }
            SizeLimit::ProjectQuota { project_id } => {
                if missing {
                    mkdir(dir)?;
                }
                let assigned = projquota::project_of(dir).is_ok_and(|(id, _)| id == project_id);
                if !assigned {
                    limited(projquota::assign_project(dir, project_id))?;
                }
                limited(projquota::set_project_limit(dir, project_id, capacity))?;
            }
        }
        if missing {
            super::set_mode(dir, 0o777)?;
        }
        Ok(())
    }

    /// One allocator for the whole node, knowing the ids `records` hold.
    pub fn project_ids<'a>(records: impl IntoIterator<Item = &'a VolumeRecord>) -> ProjectIds {
        let in_use = records.into_iter().filter_map(|r| match r.size_limit {
            SizeLimit::ProjectQuota { project_id } => Some(project_id),
            _ => None,
        });
        ProjectIds::new(projquota::DEFAULT_PROJECT_ID_RANGE, in_use)
    }

    /// The limit that the data of a deleted volume, left behind by a crash (its record is
    /// gone), still carries: so removing it cleans up the way DeleteVolume would have, and a
    /// project id is not left with a limit that makes every later start skip it as foreign.
    pub fn limit_left_on(&self, dir: &Path) -> SizeLimit {
        if btrfs::is_subvolume(dir).unwrap_or(false) {
            return SizeLimit::BtrfsQgroup;
        }
        match (self, projquota::project_of(dir)) {
            (Enforcement::Project(ids), Ok(found)) => orphaned_project(found, ids)
                .map_or(SizeLimit::None, |project_id| SizeLimit::ProjectQuota {
                    project_id,
                }),
            _ => SizeLimit::None,
        }
    }

    /// Keeps the project id of data a crash left (its limit from `limit_left_on`) from going
    /// to a new volume until that data is removed in the background: the removal then clears
    /// a quota nobody else uses. The id is free again when the lease is dropped.
    pub fn reserve_left(&self, limit: SizeLimit) -> Option<ProjectIdLease> {
        match (self, limit) {
            (Enforcement::Project(ids), SizeLimit::ProjectQuota { project_id }) => {
                ids.reserve(project_id)
            }
            _ => None,
        }
    }

    /// The volume with this limit was deleted: its project id may be handed out again.
    pub fn forget(&self, limit: SizeLimit) {
        if let (Enforcement::Project(ids), SizeLimit::ProjectQuota { project_id }) = (self, limit) {
            ids.release(project_id);
        }
    }
}

/// The project id of orphaned data that is ours to clear: one we hand out (in range, with the
/// inherit flag we set), held by no record or lease. A power loss may bring data back after
/// its id went to a newer volume, whose limit must stay.
fn orphaned_project((project_id, inherited): (u32, bool), ids: &ProjectIds) -> Option<u32> {
    (inherited && ids.range().contains(&project_id) && !ids.is_held(project_id))
        .then_some(project_id)
}

/// Sets the limit of the volume at `dir` to `capacity` bytes (growing it online).
pub fn resize(limit: SizeLimit, dir: &Path, capacity: u64) -> io::Result<()> {
    match limit {
        SizeLimit::None | SizeLimit::File => Ok(()),
        SizeLimit::BtrfsQgroup => btrfs::set_limit(dir, capacity),
        SizeLimit::ProjectQuota { project_id } => {
            projquota::set_project_limit(dir, project_id, capacity)
        }
    }
}

/// The volume's usage as its limit counts it; `None` where nothing counts it (plain
/// directories, which only a tree walk can measure).
pub fn usage(limit: SizeLimit, dir: &Path) -> io::Result<Option<LimitUsage>> {
    match limit {
        SizeLimit::None | SizeLimit::File => Ok(None),
        SizeLimit::BtrfsQgroup => {
            if !btrfs::is_subvolume(dir)? {
                return Ok(Some(LimitUsage {
                    used_bytes: 0,
                    inodes: None,
                    limit_bytes: None,
                }));
            }
            let qgroup = btrfs::usage(dir, btrfs::subvolume_id(dir)?)?;
            // Subvolumes a pod made inside its volume escape the volume's qgroup: their data
            // is counted here, so stats, the condition and the pool's books still see it.
            let nested: u64 = btrfs::nested_subvolumes(dir)?
                .into_iter()
                .filter_map(|(_, id)| btrfs::usage(dir, id).ok())
                .map(|usage| usage.referenced)
                .sum();
            Ok(Some(LimitUsage {
                used_bytes: qgroup.referenced + nested,
                inodes: None,
                limit_bytes: qgroup.max_referenced,
            }))
        }
        SizeLimit::ProjectQuota { project_id } => {
            let (assigned, _) = projquota::project_of(dir)?;
            let quota = projquota::project_usage(dir, project_id)?;
            Ok(Some(LimitUsage {
                used_bytes: quota.used_bytes,
                inodes: Some(quota.inodes),
                limit_bytes: quota.hard_limit_bytes.filter(|_| assigned == project_id),
            }))
        }
    }
}

/// Removes the data of a filesystem volume at `dir`, then what its limit leaves behind.
/// The caller has checked that no mount lies at or below `dir`.
pub fn remove_directory(limit: SizeLimit, dir: &Path) -> Result<(), WalkError> {
    let Some(_slot) = node_walks().take() else {
        return Err(WalkError::Io {
            path: dir.to_path_buf(),
            source: caller_gone(),
        });
    };
    if limit == SizeLimit::BtrfsQgroup && destroy_subvolume(dir)? {
        return Ok(());
    }
    // The tree walk never follows a symlink nor crosses a mount; it also empties nested
    // subvolumes and removes them (and a btrfs volume's own) as directories.
    safe_delete::remove_all(dir)?;
    if let (SizeLimit::ProjectQuota { project_id }, Some(parent)) = (limit, dir.parent())
        && let Err(err) = projquota::clear_project_limit(parent, project_id)
    {
        warn!(project_id, error = %err, "could not clear the quota of a deleted volume");
    }
    // A btrfs qgroup goes by itself once the kernel has dropped the subvolume.
    Ok(())
}

/// Destroys the subvolume at `dir` in one call (whatever it holds, it cannot reach outside
/// itself); false when that is not possible (not a subvolume, or subvolumes nested inside).
fn destroy_subvolume(dir: &Path) -> Result<bool, WalkError> {
    let failed = |source| WalkError::Io {
        path: dir.to_path_buf(),
        source,
    };
    match btrfs::is_subvolume(dir) {
        Ok(true) => {}
        Ok(false) => return Ok(false),
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(failed(err)),
    }
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name().and_then(|n| n.to_str()))
    else {
        return Ok(false);
    };
    match btrfs::delete_subvolume(parent, name) {
        Ok(()) => Ok(true),
        Err(err) if err.raw_os_error() == Some(libc::ENOTEMPTY) => Ok(false),
        Err(err) => Err(failed(err)),
    }
}

fn mkdir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o777)
        .create(dir)
        .context(|| format!("creating {}", dir.display()))
}

/// A path's parent and final name, for calls that take them apart.
pub(in crate::volume) fn split(dir: &Path) -> Result<(&Path, &str)> {
    match (dir.parent(), dir.file_name().and_then(|n| n.to_str())) {
        (Some(parent), Some(name)) => Ok((parent, name)),
        _ => Err(Error::host(
            format!("making {}", dir.display()),
            io::Error::from(io::ErrorKind::InvalidInput),
        )),
    }
}

/// Grows a block file to `bytes`: sparse (thin), or with every block allocated (thick), so a
/// thick volume's writes can never meet a full disk.
pub fn size_file(file: &fs::File, path: &Path, allocation: Allocation, bytes: u64) -> Result<()> {
    let sized = match allocation {
        Allocation::Thin => file.set_len(bytes),
        Allocation::Thick => nix::fcntl::fallocate(
            file,
            nix::fcntl::FallocateFlags::empty(),
            0,
            bytes as libc::off_t,
        )
        .map_err(std::io::Error::from),
    };
    sized.context(|| {
        format!(
            "sizing {} to {bytes} bytes ({})",
            path.display(),
            allocation.as_str()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_free_project_id_of_ours_is_cleared_after_orphaned_data() {
        let ids = ProjectIds::new(100..200, [150]);
        assert_eq!(orphaned_project((120, true), &ids), Some(120));
        assert_eq!(
            orphaned_project((150, true), &ids),
            None,
            "a record holds it"
        );
        assert_eq!(orphaned_project((120, false), &ids), None, "not set by us");
        assert_eq!(
            orphaned_project((7, true), &ids),
            None,
            "an admin's project"
        );
        assert_eq!(
            orphaned_project((0, true), &ids),
            None,
            "the default project"
        );
        let lease = ids.allocate(|_| Ok(projquota::IdUse::Unused)).unwrap();
        assert_eq!(
            orphaned_project((lease.id(), true), &ids),
            None,
            "a create holds it"
        );
    }
}
