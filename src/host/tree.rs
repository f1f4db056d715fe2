//! A directory-tree walk that never follows a symlink and never crosses a mount point.
//!
//! Works on directory file descriptors (openat with O_NOFOLLOW, statx without following), so a
//! symlink swapped in mid-walk cannot redirect it. Its cost does not grow with depth beyond one
//! name list per level: it holds a single directory open at a time (climbing back through
//! "..", checked against the inode it left), so a pod's 100,000-level chain of directories
//! can exhaust neither our file descriptors nor our memory.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

use super::fsstat::{self, Stat};

/// What to do at a directory that is another mount.
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

/// One directory level: who it is, what is left to visit, its name in its parent.
struct Level {
    stat: Stat,
    pending: Vec<CString>,
    name: Option<CString>,
}

/// Walks everything below `root` (a directory, not followed if it is a symlink). Entries that
/// vanish or change while we walk are skipped: the tree may be in use.
pub fn walk(
    root: &Path,
    at_mount: AtMountPoint,
    visitor: &mut dyn Visitor,
) -> Result<(), WalkError> {
    let root_stat = fsstat::lstat(root).map_err(io_error(root, &[]))?;
    if root_stat.is_mount_root && at_mount == AtMountPoint::Refuse {
        return Err(WalkError::MountPoint(root.to_path_buf()));
    }
    let mut current = open_dir(None, root.as_os_str().as_bytes()).map_err(io_error(root, &[]))?;
    let mut levels = vec![Level {
        stat: root_stat,
        pending: list(&current).map_err(io_error(root, &[]))?,
        name: None,
    }];

    loop {
        let top = levels
            .last_mut()
            .expect("the root level is never popped early");
        let Some(name) = top.pending.pop() else {
            let done = levels.pop().expect("just seen");
            let (Some(parent), Some(name)) = (levels.last(), done.name) else {
                return Ok(()); // the root is done
            };
            current = climb(&current, &parent.stat).map_err(io_error(root, &levels))?;
            visitor
                .leave_dir(current.as_fd(), &name)
                .map_err(io_error(root, &levels))?;
            continue;
        };
        let stat = match fsstat::lstat_at(current.as_fd(), &name) {
            Ok(stat) => stat,
            Err(err) if changed_meanwhile(&err) => continue,
            Err(err) => return Err(io_error(root, &levels)(err)),
        };
        let is_mount = stat.is_dir() && stat.is_mount_root;
        if is_mount && at_mount == AtMountPoint::Refuse {
            return Err(WalkError::MountPoint(shown_path(
                root,
                &levels,
                Some(&name),
            )));
        }
        visitor
            .entry(current.as_fd(), &name, &stat)
            .map_err(io_error(root, &levels))?;
        if !stat.is_dir() || is_mount {
            continue;
        }
        let child = match open_dir(Some(current.as_fd()), name.to_bytes()) {
            Ok(child) => child,
            Err(err) if changed_meanwhile(&err) => continue,
            Err(err) => return Err(io_error(root, &levels)(err)),
        };
        // Something else may have been put in its place between the stat and the open.
        let opened = fsstat::stat_fd(child.as_fd()).map_err(io_error(root, &levels))?;
        if !opened.same_file(&stat) {
            continue;
        }
        let pending = list(&child).map_err(io_error(root, &levels))?;
        levels.push(Level {
            stat,
            pending,
            name: Some(name),
        });
        current = child;
    }
}

/// Opens ".." of `dir` and checks it is the directory we came from (not a moved-in stranger).
fn climb(dir: &OwnedFd, expected: &Stat) -> io::Result<OwnedFd> {
    let parent = open_dir(Some(dir.as_fd()), b"..")?;
    if fsstat::stat_fd(parent.as_fd())?.same_file(expected) {
        Ok(parent)
    } else {
        Err(io::Error::other(
            "a directory was moved out of the tree during the walk",
        ))
    }
}

/// Errors that mean "this entry changed since we listed it", not "the walk failed".
fn changed_meanwhile(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
    )
}

/// Whether `path` is a directory (not a symlink to one) without entries.
pub fn is_empty_dir(path: &Path) -> io::Result<bool> {
    let fd = match open_dir(None, path.as_os_str().as_bytes()) {
        Ok(fd) => fd,
        Err(err) if matches!(err.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => {
            return Ok(false);
        }
        Err(err) => return Err(err),
    };
    let mut dir = Dir::from_fd(fd)?;
    for entry in dir.iter() {
        if !is_self_or_parent(entry?.file_name()) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// "." or "..", which every directory lists.
fn is_self_or_parent(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

fn open_dir(parent: Option<BorrowedFd<'_>>, name: &[u8]) -> io::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd: Result<OwnedFd, Errno> = match parent {
        Some(parent) => openat(parent, name, flags, Mode::empty()),
        None => nix::fcntl::open(name, flags, Mode::empty()),
    };
    fd.map_err(io::Error::from)
}

fn list(fd: &OwnedFd) -> io::Result<Vec<CString>> {
    let mut dir = Dir::from_fd(fd.try_clone()?)?;
    let mut names = Vec::new();
    for entry in dir.iter() {
        let entry = entry?;
        if !is_self_or_parent(entry.file_name()) {
            names.push(entry.file_name().to_owned());
        }
    }
    Ok(names)
}

fn io_error<'a>(root: &'a Path, levels: &'a [Level]) -> impl FnOnce(io::Error) -> WalkError + 'a {
    move |source| WalkError::Io {
        path: shown_path(root, levels, None),
        source,
    }
}

/// The path of the current directory (and `leaf`) for messages, shortened in deep trees.
fn shown_path(root: &Path, levels: &[Level], leaf: Option<&CStr>) -> PathBuf {
    const SHOWN_LEVELS: usize = 8;
    let names: Vec<&CStr> = levels
        .iter()
        .filter_map(|l| l.name.as_deref())
        .chain(leaf)
        .collect();
    let mut path = root.to_path_buf();
    if names.len() > SHOWN_LEVELS {
        path.push(format!("…{} levels…", names.len() - SHOWN_LEVELS));
    }
    let skip = names.len().saturating_sub(SHOWN_LEVELS);
    for name in &names[skip..] {
        path.push(OsStr::from_bytes(name.to_bytes()));
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// Records how many entries it saw and the highest descriptor number it was handed.
    #[derive(Default)]
    struct Probe {
        entries: usize,
        highest_fd: i32,
    }

    impl Visitor for Probe {
        fn entry(&mut self, parent: BorrowedFd<'_>, _: &CStr, _: &Stat) -> io::Result<()> {
            self.entries += 1;
            self.highest_fd = self.highest_fd.max(parent.as_raw_fd());
            Ok(())
        }
    }

    /// A chain of `depth` directories below `root`, made relative to each level (no PATH_MAX).
    fn chain(root: &Path, depth: usize) {
        let mut dir = open_dir(None, root.as_os_str().as_bytes()).unwrap();
        for _ in 0..depth {
            nix::sys::stat::mkdirat(dir.as_fd(), "d", Mode::from_bits_truncate(0o755)).unwrap();
            dir = open_dir(Some(dir.as_fd()), b"d").unwrap();
        }
        std::fs::write(format!("/proc/self/fd/{}/leaf", dir.as_raw_fd()), b"x").unwrap();
    }

    #[test]
    fn only_an_empty_directory_itself_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(is_empty_dir(&empty).unwrap());
        std::os::unix::fs::symlink(&empty, dir.path().join("link")).unwrap();
        assert!(
            !is_empty_dir(&dir.path().join("link")).unwrap(),
            "not followed"
        );
        std::fs::write(empty.join("file"), b"x").unwrap();
        assert!(!is_empty_dir(&empty).unwrap());
        assert!(!is_empty_dir(&empty.join("file")).unwrap(), "a file");
        assert!(is_empty_dir(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn deep_trees_use_one_descriptor_not_one_per_level() {
        let dir = tempfile::tempdir().unwrap();
        chain(dir.path(), 3000);
        let mut probe = Probe::default();
        walk(dir.path(), AtMountPoint::Refuse, &mut probe).unwrap();
        assert_eq!(probe.entries, 3001);
        // One descriptor per level would reach past 3000.
        assert!(
            probe.highest_fd < 1000,
            "descriptor {} in use",
            probe.highest_fd
        );
        super::super::safe_delete::remove_all(&dir.path().join("d")).unwrap();
        assert!(!dir.path().join("d").exists());
    }

    #[test]
    fn error_paths_are_shortened_in_deep_trees() {
        let levels: Vec<Level> = (0..20)
            .map(|i| Level {
                stat: fsstat::lstat(Path::new("/")).unwrap(),
                pending: vec![],
                name: (i > 0).then(|| CString::new(format!("d{i}")).unwrap()),
            })
            .collect();
        let shown = shown_path(Path::new("/v"), &levels, Some(c"leaf"));
        assert!(shown.starts_with("/v"));
        assert!(shown.ends_with("d19/leaf"));
        assert!(shown.as_os_str().len() < 80, "{}", shown.display());
    }
}
