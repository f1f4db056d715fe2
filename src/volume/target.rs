//! Publish and stage targets: the path kubelet names for a pod's mount (NodePublishVolume) or
//! for an image volume's staging mount (NodeStageVolume), checked, made, and acted on. Used
//! by `publish` and `image` alike.
//!
//! The target's parent is opened and checked once (inside the kubelet dir, outside the pools);
//! everything after acts relative to that descriptor, never on the path resolved again, which
//! whoever can write kubelet's directories could swap for a symlink in between (`Target`).

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use tracing::warn;

use super::Volumes;
use crate::error::{Error, IoContext, Result};
use crate::host::dirfd;
use crate::host::fsstat::{self, Stat};

impl Volumes {
    /// The target's existing ancestors must resolve (symlinks followed) inside the kubelet dir
    /// and outside the data dir (volumes are never targets of each other).
    fn check_target_ancestors(&self, target: &Path) -> Result<()> {
        let mut ancestor = target.parent();
        while let Some(dir) = ancestor {
            match fsstat::canonical(dir) {
                Ok(real) => return self.check_resolved(target, &real),
                Err(err) if err.kind() == io::ErrorKind::NotFound => ancestor = dir.parent(),
                Err(err) => return Err(Error::host(format!("resolving {}", dir.display()), err)),
            }
        }
        Ok(())
    }

    /// `real`, where an ancestor of `target` resolves, must be inside the kubelet dir and
    /// outside every pool.
    fn check_resolved(&self, target: &Path, real: &Path) -> Result<()> {
        if let Some(pool) = self.pools().iter().find(|p| real.starts_with(&p.root)) {
            return Err(Error::InvalidArgument(format!(
                "target {} lies inside the data directory {} (pool {:?})",
                target.display(),
                pool.root.display(),
                pool.name
            )));
        }
        if !real.starts_with(&self.kubelet_dir) {
            return Err(Error::InvalidArgument(format!(
                "target {} resolves through {} outside the kubelet directory {}",
                target.display(),
                real.display(),
                self.kubelet_dir.display()
            )));
        }
        Ok(())
    }

    /// Opens the target's parent, creating it unless (as kubelet does) it exists: its deepest
    /// existing ancestor is opened (symlinks followed) and checked where the kernel says it
    /// is, and the missing directories are made beneath it without following any symlink. The
    /// publish or stage then acts on this descriptor, never on the path resolved again.
    pub(super) fn open_target_parent(&self, target: &Path) -> Result<OwnedFd> {
        let mut missing = Vec::new();
        let mut dir = target.parent().unwrap_or(Path::new("/"));
        let mut opened = loop {
            match dirfd::open_dir(dir) {
                Ok(fd) => break fd,
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    missing.extend(dir.file_name());
                    dir = dir.parent().unwrap_or(Path::new("/"));
                }
                Err(err) => return Err(Error::host(format!("opening {}", dir.display()), err)),
            }
        };
        let real =
            dirfd::name_of(opened.as_fd()).context(|| format!("resolving {}", dir.display()))?;
        self.check_resolved(target, &real)?;
        for name in missing.into_iter().rev() {
            opened = dirfd::make_dir_at(opened.as_fd(), name)
                .context(|| format!("creating {} in {}", name.to_string_lossy(), real.display()))?;
        }
        Ok(opened)
    }

    /// The target's parent for an unpublish or unstage: opened and checked as for a publish,
    /// never created; None when it does not exist (nor, then, does the target).
    pub(super) fn open_existing_target_parent(&self, target: &Path) -> Result<Option<OwnedFd>> {
        let parent = target.parent().unwrap_or(Path::new("/"));
        match dirfd::open_dir(parent) {
            Ok(opened) => {
                let real = dirfd::name_of(opened.as_fd())
                    .context(|| format!("resolving {}", parent.display()))?;
                self.check_resolved(target, &real)?;
                Ok(Some(opened))
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                self.check_target_ancestors(target)?;
                Ok(None)
            }
            Err(err) => Err(Error::host(format!("opening {}", parent.display()), err)),
        }
    }
}

/// A target as (un)publish and (un)stage act on it: a name in its checked, open parent
/// directory (None when an unpublish or unstage found no parent: then there is no target
/// either).
pub(super) struct Target<'a> {
    pub(super) parent: Option<BorrowedFd<'a>>,
    pub(super) name: &'a OsStr,
    /// For messages only.
    pub(super) path: &'a Path,
}

impl Target<'_> {
    pub(super) fn parent(&self) -> Result<BorrowedFd<'_>> {
        self.parent.ok_or_else(|| {
            Error::host(
                format!("opening the parent of {}", self.path.display()),
                io::ErrorKind::NotFound.into(),
            )
        })
    }

    /// The target itself (a symlink not followed; a mount on it entered) and what it is.
    pub(super) fn open(&self) -> Result<Option<(OwnedFd, Stat)>> {
        let Some(parent) = self.parent else {
            return Ok(None);
        };
        let inspect = || format!("inspecting {}", self.path.display());
        let Some(opened) = dirfd::open_at(parent, self.name).context(inspect)? else {
            return Ok(None);
        };
        let stat = fsstat::stat_fd(opened.as_fd()).context(inspect)?;
        Ok(Some((opened, stat)))
    }

    /// The directory to mount on (`what`: "target", "staging path"): made if missing, or
    /// found with what is mounted there already; FAILED_PRECONDITION if it is not a directory.
    pub(super) fn mount_point(&self, what: &str) -> Result<MountPoint> {
        match self.open()? {
            None => dirfd::make_dir_at(self.parent()?, self.name)
                .map(MountPoint::Made)
                .context(|| format!("creating {}", self.path.display())),
            Some((fd, stat)) if stat.is_dir() && stat.is_mount_root => {
                Ok(MountPoint::Mounted(fd, stat))
            }
            Some((fd, stat)) if stat.is_dir() => Ok(MountPoint::Empty(fd)),
            Some(_) => Err(Error::FailedPrecondition(format!(
                "{what} {} exists and is not a directory",
                self.path.display()
            ))),
        }
    }

    pub(super) fn stat(&self) -> Result<Option<Stat>> {
        Ok(self.open()?.map(|(_, stat)| stat))
    }

    pub(super) fn read_link(&self) -> Option<PathBuf> {
        dirfd::read_link_at(self.parent?, self.name).ok()
    }

    pub(super) fn remove_file(&self) -> Result<()> {
        dirfd::remove_file_at(self.parent()?, self.name)
            .context(|| format!("removing {}", self.path.display()))
    }

    /// Removes the (empty) target directory; one with content is left, with a warning, for
    /// an admin.
    pub(super) fn remove_empty_dir(&self) -> Result<()> {
        match dirfd::remove_dir_at(self.parent()?, self.name) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(err) if err.raw_os_error() == Some(libc::ENOTEMPTY) => {
                warn!(target = %self.path.display(), "target is not mounted but not empty; leaving it in place");
                Ok(())
            }
            Err(err) => Err(Error::host(
                format!("removing {}", self.path.display()),
                err,
            )),
        }
    }
}

/// A directory to mount on, as [`Target::mount_point`] found it.
pub(super) enum MountPoint {
    /// Made just now: a failed mount removes it again.
    Made(OwnedFd),
    /// There already, nothing mounted on it.
    Empty(OwnedFd),
    /// Something is mounted there (an earlier attempt's mount, or not ours).
    Mounted(OwnedFd, Stat),
}

pub(super) fn target_name(target: &Path) -> Result<&OsStr> {
    target
        .file_name()
        .ok_or_else(|| Error::InvalidArgument(format!("target {} names no file", target.display())))
}
