//! A directory-tree walk that never follows a symlink and never crosses a mount point.
//!
//! Works on directory file descriptors (openat with O_NOFOLLOW, statx without following), so a
//! symlink swapped in mid-walk cannot redirect it, and uses an explicit stack so a maliciously
//! deep tree cannot overflow ours. Used by safe deletion and by usage measurement.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

use super::fsstat::{self, Stat};

/// What to do at a directory that is another mount (or another filesystem).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtMountPoint {
    /// Stop the walk with `WalkError::MountPoint`.
    Refuse,
    /// Report it as an entry but do not descend.
    Skip,
}

#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    #[error("{0} is a mount point")]
    MountPoint(PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Callbacks of a walk. `parent` is an open descriptor of the directory holding `name`.
pub trait Visitor {
    /// Called for every entry below the root, before descending into it if it is a directory.
    fn entry(&mut self, parent: BorrowedFd<'_>, name: &CStr, stat: &Stat) -> io::Result<()>;
    /// Called after all entries of the directory `name` have been visited.
    fn leave_dir(&mut self, _parent: BorrowedFd<'_>, _name: &CStr) -> io::Result<()> {
        Ok(())
    }
}

struct Frame {
    fd: OwnedFd,
    path: PathBuf,
    /// Entries still to visit (names read up front: the visitor may delete as we go).
    pending: Vec<CString>,
    /// Our name in the parent frame (None for the root).
    name: Option<CString>,
}

/// Walks everything below `root` (a directory, not followed if it is a symlink).
pub fn walk(
    root: &Path,
    at_mount: AtMountPoint,
    visitor: &mut dyn Visitor,
) -> Result<(), WalkError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source: io::Error| WalkError::Io { path, source }
    };
    let root_stat = fsstat::lstat(root).map_err(io_err(root))?;
    if root_stat.is_mount_root && at_mount == AtMountPoint::Refuse {
        return Err(WalkError::MountPoint(root.to_path_buf()));
    }
    let root_fd = open_dir_at(None, root.as_os_str().as_bytes()).map_err(io_err(root))?;
    let mut stack = vec![frame(root_fd, root.to_path_buf(), None).map_err(io_err(root))?];

    while let Some(top) = stack.last_mut() {
        let Some(name) = top.pending.pop() else {
            let done = stack.pop().expect("stack is not empty");
            if let (Some(parent), Some(name)) = (stack.last(), done.name.as_ref()) {
                drop(done.fd);
                visitor
                    .leave_dir(parent.fd.as_fd(), name)
                    .map_err(io_err(&done.path))?;
            }
            continue;
        };
        let path = top.path.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
        let stat = match fsstat::lstat_at(top.fd.as_fd(), &name) {
            Ok(stat) => stat,
            // Gone since we listed the directory: nothing to visit.
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => return Err(io_err(&path)(err)),
        };
        let crosses_mount = stat.is_dir() && (stat.is_mount_root || stat.dev != root_stat.dev);
        if crosses_mount && at_mount == AtMountPoint::Refuse {
            return Err(WalkError::MountPoint(path));
        }
        visitor
            .entry(top.fd.as_fd(), &name, &stat)
            .map_err(io_err(&path))?;
        if stat.is_dir() && !crosses_mount {
            let fd = open_dir_at(Some(top.fd.as_fd()), name.to_bytes()).map_err(io_err(&path))?;
            let child = frame(fd, path.clone(), Some(name)).map_err(io_err(&path))?;
            stack.push(child);
        }
    }
    Ok(())
}

fn frame(fd: OwnedFd, path: PathBuf, name: Option<CString>) -> io::Result<Frame> {
    let pending = list(&fd)?;
    Ok(Frame {
        fd,
        path,
        pending,
        name,
    })
}

fn open_dir_at(parent: Option<BorrowedFd<'_>>, name: &[u8]) -> io::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = match parent {
        Some(parent) => openat(parent, name, flags, Mode::empty()),
        None => nix::fcntl::open(name, flags, Mode::empty()),
    };
    fd.map_err(io::Error::from)
}

fn list(fd: &OwnedFd) -> io::Result<Vec<CString>> {
    let mut dir = Dir::from_fd(fd.try_clone()?)?;
    let mut names = Vec::new();
    for entry in dir.iter() {
        let name = entry?.file_name().to_owned();
        if name.as_bytes() != b"." && name.as_bytes() != b".." {
            names.push(name);
        }
    }
    Ok(names)
}
