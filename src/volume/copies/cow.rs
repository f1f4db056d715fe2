//! How a pool copies volume data for snapshots, restores and clones, copy-on-write where its
//! filesystem allows:
//! - btrfs, volumes as subvolumes (quota on): a snapshot of the subvolume, O(1) and atomic,
//!   so crash-consistent while a pod writes; read-only for a snapshot, writable for a volume;
//! - reflink (XFS, or btrfs volumes that are plain directories): FICLONE per file, so data is
//!   shared but files are taken one by one;
//! - copy (ext4, tmpfs, …): every data segment copied, holes kept.
//!
//! Block volumes are one image file: FICLONE of the whole file where the filesystem can (atomic),
//! a sparse copy otherwise.
//!
//! A copy is not flushed here: its caller flushes the pool (`sync_copy`) before a record says the
//! copy exists, and after the source's filesystem is thawed when it was frozen for the copy, so
//! that the volume's writers never wait for a flush of the whole pool (which a neighbour's
//! unwritten data can make last seconds).

use std::fs::OpenOptions;
use std::path::Path;

use tracing::warn;

use crate::error::{Error, IoContext, Result};
use crate::host::btrfs;
use crate::host::copy::{self, CopyError, CopyReport, DataMode, Progress};
use crate::volume::space::limits::{NewDirectory, remove_directory, size_file, split};
use crate::volume::space::mechanism::Mechanism;
use crate::volume::space::pool::Pool;
use crate::volume::space::throttle::{caller_gone, node_walk};
use crate::volume::state::record::{Allocation, VolumeKind};

/// What copying produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    pub mechanism: Mechanism,
    /// Bytes of data the copy holds (shared with its source or not).
    pub data_bytes: u64,
    /// Bytes physically written: what the copy costs the pool now.
    pub copied_bytes: u64,
}

impl Copied {
    fn from_report(mechanism: Mechanism, report: CopyReport) -> Copied {
        // A reflink the filesystem refused for every file was a copy after all.
        let all_copied = report.data_bytes > 0 && report.copied_bytes >= report.data_bytes;
        let mechanism = if mechanism == Mechanism::Copy || all_copied {
            Mechanism::Copy
        } else {
            Mechanism::Reflink
        };
        Copied {
            mechanism,
            data_bytes: report.data_bytes,
            copied_bytes: report.copied_bytes,
        }
    }
}

/// Copies the data of a volume (`source`, of `kind`) to `dest` (which must not exist) as a
/// snapshot of `pool`; durable once `sync_copy` has run. (A btrfs snapshot of a subvolume is
/// flushed here: its usage is exact only after the commit.)
pub fn snapshot_unflushed(
    pool: &Pool,
    kind: VolumeKind,
    source: &Path,
    dest: &Path,
    progress: &mut dyn Progress,
) -> Result<Copied> {
    let copied = match kind {
        VolumeKind::Block | VolumeKind::Image(_) => {
            carry(pool.cow, source, dest, progress, copy::copy_file)?
        }
        VolumeKind::Filesystem => {
            if pool.cow == Mechanism::BtrfsSnapshot && is_subvolume(source)? {
                let (parent, name) = split(dest)?;
                btrfs::snapshot_subvolume(source, parent, name, true).context(|| {
                    format!("snapshotting {} as {}", source.display(), dest.display())
                })?;
                sync(dest)?;
                // Exact after the commit `sync` made: all of it shared, none of it its own yet.
                let usage = btrfs::subvolume_id(dest).and_then(|id| btrfs::usage(dest, id));
                let usage =
                    usage.context(|| format!("reading the qgroup of {}", dest.display()))?;
                return Ok(Copied {
                    mechanism: Mechanism::BtrfsSnapshot,
                    data_bytes: usage.referenced,
                    copied_bytes: usage.exclusive,
                });
            } else {
                make_private_dir(dest)?;
                carry(pool.cow, source, dest, progress, copy::copy_tree)?
            }
        }
    };
    Ok(copied)
}

/// The copy of an image's file, not yet flushed: what a group snapshot makes while its
/// members' filesystems are frozen, flushing (`sync_copy`) once they are thawed.
pub fn clone_file(pool: &Pool, source: &Path, dest: &Path) -> Result<Copied> {
    carry(pool.cow, source, dest, &mut copy::Always, copy::copy_file)
}

/// Makes a copy made here durable: a flush of the pool's filesystem holding `dest`.
pub fn sync_copy(dest: &Path) -> Result<()> {
    sync(dest)
}

/// Makes a new volume's data at `dest` (its staging path in `pool`) from the data of a
/// snapshot or volume at `source`, limited to `capacity` like any volume of the pool; durable
/// once `sync_copy` has run.
pub fn fill_volume_unflushed(
    pool: &Pool,
    kind: VolumeKind,
    allocation: Allocation,
    source: &Path,
    dest: &Path,
    capacity: u64,
) -> Result<Option<NewDirectory>> {
    let made = match kind {
        // An image's filesystem grows to a bigger file when it is next staged.
        VolumeKind::Block | VolumeKind::Image(_) => {
            carry(pool.cow, source, dest, &mut copy::Always, copy::copy_file)?;
            let file = OpenOptions::new()
                .write(true)
                .open(dest)
                .context(|| format!("opening {}", dest.display()))?;
            if file.metadata().map_or(0, |m| m.len()) < capacity || allocation == Allocation::Thick
            {
                size_file(&file, dest, allocation, capacity)?;
            }
            None
        }
        VolumeKind::Filesystem => {
            let subvolume_source = pool.cow == Mechanism::BtrfsSnapshot
                && is_subvolume(source)?
                && same_btrfs(source, &pool.volumes);
            Some(if subvolume_source {
                pool.enforcement.clone_subvolume(source, dest, capacity)?
            } else {
                let made = pool.enforcement.make_directory(dest, capacity)?;
                if let Err(err) = carry(pool.cow, source, dest, &mut copy::Always, copy::copy_tree)
                {
                    // The partial copy goes now, with the limit it was given: the caller knows
                    // no limit of a volume it never made, and a tenant can make copies fail
                    // (xattrs past our bound, a hard-link bomb) to leak project quota limits.
                    if let Err(cleanup) = remove_directory(made.limit, dest) {
                        warn!(path = %dest.display(), error = %cleanup, "could not remove a failed copy; it is removed at next start");
                    }
                    return Err(err);
                }
                made
            })
        }
    };
    Ok(made)
}

/// Runs one of host::copy's copies with the mechanism's data mode.
fn carry(
    mechanism: Mechanism,
    source: &Path,
    dest: &Path,
    progress: &mut dyn Progress,
    copy: fn(&Path, &Path, DataMode, &mut dyn Progress) -> Result<CopyReport, CopyError>,
) -> Result<Copied> {
    // The slot a freeze around this copy took first, if there is one (`with_frozen`).
    let Some(_slot) = node_walk() else {
        return Err(Error::host(
            format!("waiting to copy {}", source.display()),
            caller_gone(),
        ));
    };
    let report = copy(source, dest, mechanism.data_mode(), progress)
        .map_err(|err| copy_failure(source, err))?;
    Ok(Copied::from_report(mechanism, report))
}

fn copy_failure(source: &Path, err: CopyError) -> Error {
    match err {
        CopyError::Walk(err) => Error::walk_at(source, "copying", err),
        CopyError::Cancelled => Error::Pending(format!("the copy of {}", source.display())),
    }
}

/// Flushes the copy to disk: it must survive a power loss before a record says it exists.
fn sync(dest: &Path) -> Result<()> {
    copy::sync_filesystem(dest).context(|| format!("syncing {}", dest.display()))
}

fn is_subvolume(path: &Path) -> Result<bool> {
    btrfs::is_subvolume(path).context(|| format!("inspecting {}", path.display()))
}

fn same_btrfs(a: &Path, b: &Path) -> bool {
    matches!((btrfs::filesystem_id(a), btrfs::filesystem_id(b)), (Ok(x), Ok(y)) if x == y)
}

/// Snapshot directories are for us only (root's); their content keeps its own modes.
fn make_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .context(|| format!("creating {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_that_shared_every_extent_is_a_reflink() {
        let report = |data_bytes, copied_bytes| CopyReport {
            files: 1,
            data_bytes,
            copied_bytes,
        };
        let seen = |m, r| Copied::from_report(m, r).mechanism;
        assert_eq!(seen(Mechanism::Reflink, report(10, 0)), Mechanism::Reflink);
        assert_eq!(seen(Mechanism::Reflink, report(10, 10)), Mechanism::Copy);
        assert_eq!(seen(Mechanism::Reflink, report(10, 4)), Mechanism::Reflink);
        assert_eq!(seen(Mechanism::Copy, report(10, 10)), Mechanism::Copy);
        assert_eq!(seen(Mechanism::Copy, report(0, 0)), Mechanism::Copy);
    }
}
