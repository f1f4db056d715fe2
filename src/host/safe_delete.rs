//! Deleting a volume's data: never follows a symlink, never crosses a mount point.
//!
//! A pod can plant anything inside its volume, e.g. a symlink to /etc or a bind mount of a host
//! directory. Deletion unlinks symlinks themselves and refuses (removing nothing further below)
//! when it meets a mount point, so data outside the volume is never touched.

use std::ffi::CStr;
use std::fs;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

use nix::unistd::{UnlinkatFlags, unlinkat};

use super::fsstat::{self, Stat};
use super::tree::{self, AtMountPoint, Visitor, WalkError};

struct Remover;

impl Visitor for Remover {
    fn entry(&mut self, parent: BorrowedFd<'_>, name: &CStr, stat: &Stat) -> io::Result<()> {
        if stat.is_dir() {
            return Ok(()); // removed in leave_dir, once empty
        }
        ignore_missing(unlinkat(parent, name, UnlinkatFlags::NoRemoveDir).map_err(io::Error::from))
    }

    fn leave_dir(&mut self, parent: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
        ignore_missing(unlinkat(parent, name, UnlinkatFlags::RemoveDir).map_err(io::Error::from))
    }
}

/// Removes `path` and everything below it. A missing path is success (deletion is idempotent).
/// `path` itself may be a file, a symlink (removed, not followed) or a directory.
pub fn remove_all(path: &Path) -> Result<(), WalkError> {
    let io_err = |source| WalkError::Io {
        path: path.to_path_buf(),
        source,
    };
    let Some(stat) = fsstat::lstat_if_exists(path).map_err(io_err)? else {
        return Ok(());
    };
    if !stat.is_dir() {
        return ignore_missing(fs::remove_file(path)).map_err(io_err);
    }
    // An empty directory (a volume never written) goes in one call: rmdir follows no symlink
    // and fails on a mount point. Any failure but a vanished path means: walk it.
    match fs::remove_dir(path) {
        Ok(()) => return Ok(()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(_) => {}
    }
    tree::walk(path, AtMountPoint::Refuse, &mut Remover)?;
    ignore_missing(fs::remove_dir(path)).map_err(io_err)
}

/// Removes everything below the directory `dir`, keeping `dir` itself (its owner, mode, quota
/// and subvolume stay): emptying a volume in place.
pub fn remove_contents(dir: &Path) -> Result<(), WalkError> {
    tree::walk(dir, AtMountPoint::Refuse, &mut Remover)
}

fn ignore_missing(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn removes_nested_trees_without_following_symlinks() {
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("precious"), b"keep me").unwrap();
        let volume = tempfile::tempdir().unwrap();
        let root = volume.path().join("v");
        fs::create_dir_all(root.join("a/b/c")).unwrap();
        fs::write(root.join("a/b/c/file"), b"x").unwrap();
        symlink(outside.path(), root.join("a/link-to-dir")).unwrap();
        symlink(outside.path().join("precious"), root.join("link-to-file")).unwrap();

        remove_all(&root).unwrap();
        assert!(!root.exists());
        assert_eq!(
            fs::read(outside.path().join("precious")).unwrap(),
            b"keep me"
        );
        remove_all(&root).unwrap(); // idempotent
    }

    #[test]
    fn emptying_keeps_the_directory_and_spares_what_symlinks_point_at() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("keep"), b"x").unwrap();
        let root = dir.path().join("v");
        fs::create_dir_all(root.join("a/b")).unwrap();
        fs::write(root.join("a/b/f"), b"data").unwrap();
        symlink(outside.path(), root.join("link")).unwrap();
        remove_contents(&root).unwrap();
        assert!(root.is_dir());
        assert_eq!(fs::read_dir(&root).unwrap().count(), 0);
        assert!(outside.path().join("keep").exists());
    }

    #[test]
    fn a_symlink_as_root_is_unlinked_not_followed() {
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("precious"), b"keep me").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("v");
        symlink(outside.path(), &link).unwrap();
        remove_all(&link).unwrap();
        assert!(outside.path().join("precious").exists());
    }

    #[test]
    fn very_deep_trees_do_not_overflow_the_stack() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("v");
        let mut path = root.clone();
        fs::create_dir(&path).unwrap();
        for _ in 0..2000 {
            path.push("d");
            // Relative creation keeps each path short enough for the kernel.
            let _ = fs::create_dir(&path);
            if path.as_os_str().len() > 3000 {
                break;
            }
        }
        remove_all(&root).unwrap();
        assert!(!root.exists());
    }
}
