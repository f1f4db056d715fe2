//! Bringing every inode of a tree back into one project. Outside a user namespace the owner of
//! a file may set its project id (FS_IOC_FSSETXATTR needs no privilege), so a tenant can move
//! files out of its volume's quota (project 0: counted against nothing) or into a neighbour's.
//!
//! A walk of the tree (`tree::walk_within`: no symlink followed, no mount crossed, memory
//! bounded whatever the tree) opens every directory and regular file from its parent's
//! descriptor, checks it is the inode the walk listed (a tenant renames while we walk), and puts
//! it back into the project (directories with the inherit flag). The kernel moves its quota
//! charges along. A regular file is resolved with O_PATH, checked, and only then opened through
//! that descriptor, so a device node renamed over it is never opened. The open does not wait for
//! a tenant's file lease to be broken (O_NONBLOCK): such a file is counted as unchecked, the
//! audit is not clean, and the kernel breaks the lease for the next one.
//!
//! Symlinks, device nodes, FIFOs and sockets are left alone: the ioctl needs a file opened for
//! it, and opening a device acts on it. They hold no data blocks (a symlink at most its target).

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat};
use nix::sys::stat::Mode;

use super::fsstat::{self, Stat};
use super::projquota;
use super::tree::{self, AtMountPoint, Budget, Visitor, WalkError};

/// Distinct foreign ids a repair remembers (with their counts) for its report; more are counted
/// under the last one's total only.
pub const MAX_FOREIGN_IDS: usize = 8;

/// What a repair found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Repairs {
    /// Inodes looked at (the root included); hard links count once per name.
    pub inodes: u64,
    /// Inodes put back into the project.
    pub repaired: u64,
    /// Regular files that could not be opened without waiting for a tenant's lease to break.
    pub unchecked: u64,
    /// The foreign project ids found (up to `MAX_FOREIGN_IDS`) and how many inodes carried each
    /// (a directory in the right project without the inherit flag counts under its own id).
    pub foreign: BTreeMap<u32, u64>,
}

impl Repairs {
    fn note(&mut self, found: u32) {
        self.repaired += 1;
        if self.foreign.len() < MAX_FOREIGN_IDS || self.foreign.contains_key(&found) {
            *self.foreign.entry(found).or_default() += 1;
        }
    }
}

/// Puts `root` (a directory, not followed if it is a symlink) and everything below it into
/// project `project_id`, within `budget`. `stop()` is asked at every entry: true ends the walk
/// with ECANCELED. Entries that vanish while we walk are skipped.
pub fn repair_tree(
    root: &Path,
    project_id: u32,
    budget: Budget,
    stop: &dyn Fn() -> bool,
) -> Result<Repairs, WalkError> {
    let failed = |source| WalkError::Io {
        path: root.to_path_buf(),
        source,
    };
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let top = open(root, flags, Mode::empty()).map_err(|e| failed(e.into()))?;
    let mut repairer = Repairer {
        project_id,
        stop,
        repairs: Repairs::default(),
    };
    repairer.check(top.as_fd(), true).map_err(failed)?;
    drop(top);
    tree::walk_within(root, AtMountPoint::Skip, budget, &mut repairer)?;
    Ok(repairer.repairs)
}

struct Repairer<'a> {
    project_id: u32,
    stop: &'a dyn Fn() -> bool,
    repairs: Repairs,
}

impl Repairer<'_> {
    /// Puts the open inode `fd` back into the project if it left it.
    fn check(&mut self, fd: BorrowedFd<'_>, is_dir: bool) -> io::Result<()> {
        self.repairs.inodes += 1;
        let (found, inherit) = projquota::project_of_fd(fd)?;
        if found == self.project_id && (inherit || !is_dir) {
            return Ok(());
        }
        projquota::set_project_of_fd(fd, self.project_id, is_dir)?;
        self.repairs.note(found);
        Ok(())
    }
}

impl Visitor for Repairer<'_> {
    fn entry(&mut self, parent: BorrowedFd<'_>, name: &CStr, stat: &Stat) -> io::Result<()> {
        if (self.stop)() {
            return Err(io::Error::from_raw_os_error(libc::ECANCELED));
        }
        let opened = if stat.is_mount_root {
            // Another filesystem's: not ours to audit (the walk does not enter it either).
            Ok(None)
        } else if stat.is_dir() {
            tree::open_listed_dir(parent, name, stat)
        } else if stat.is_regular_file() {
            open_listed_file(parent, name, stat)
        } else {
            Ok(None)
        };
        match opened {
            Ok(Some(fd)) => self.check(fd.as_fd(), stat.is_dir()),
            // Gone or replaced since it was listed: what replaced it is met by name later.
            Ok(None) => Ok(()),
            Err(err) if err.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                self.repairs.unchecked += 1;
                Ok(())
            }
            Err(err) => Err(err),
        }
    }
}

/// Opens the regular file the walk listed as `listed` at `name`, read-only and without waiting
/// (EWOULDBLOCK while a lease on it is being broken); None if the name no longer leads to it.
fn open_listed_file(
    parent: BorrowedFd<'_>,
    name: &CStr,
    listed: &Stat,
) -> io::Result<Option<OwnedFd>> {
    let path_only = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let handle = match openat(parent, name, path_only, Mode::empty()) {
        Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => return Ok(None),
        handle => handle?,
    };
    let found = fsstat::stat_fd(handle.as_fd())?;
    if !found.is_regular_file() || !found.same_file(listed) {
        return Ok(None);
    }
    let link = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&handle));
    let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    Ok(Some(open(link.as_str(), flags, Mode::empty())?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_ids_are_counted_within_a_bound() {
        let mut repairs = Repairs::default();
        for id in 0..20u32 {
            repairs.note(id);
            repairs.note(id.min(3));
        }
        assert_eq!(repairs.repaired, 40);
        assert_eq!(repairs.foreign.len(), MAX_FOREIGN_IDS);
        // Ids met before the bound was reached keep counting.
        assert_eq!(repairs.foreign[&3], 18);
        assert_eq!(repairs.foreign[&0], 2);
        assert!(!repairs.foreign.contains_key(&8));
    }
}
