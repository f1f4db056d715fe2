//! Deleting a volume's data: never follows a symlink, never crosses a mount point.
//!
//! A pod can plant anything inside its volume, e.g. a symlink to /etc or a bind mount of a host
//! directory. Deletion unlinks symlinks themselves and refuses (removing nothing further below)
//! when it meets a mount point, so data outside the volume is never touched. A chain of
//! directories deeper than a walk enters (`tree::MAX_DEPTH`) is cut: its part below the limit is
//! moved up to the top of the tree being removed, and removed by the next pass.
//!
//! A walk resumes a long listing at the kernel's cookie for the last name it read. Where that
//! cookie is a position in the listing (tmpfs before Linux 6.6, ramfs), removing the names read
//! so far moves the rest forward, and the resumed listing skips as many: a pass can end with
//! names left. Passes go on while the last one removed something and names remain.

use std::ffi::CStr;
use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, RenameFlags, open, renameat2};
use nix::sys::stat::Mode;
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::btrfs;
use super::fsstat::{self, Stat};
use super::tree::{self, AtMountPoint, Visitor, WalkError};

/// Removes what it is shown; moves directories below the depth limit to `top`.
struct Remover {
    top: OwnedFd,
    moved: usize,
    /// Names removed so far, over every pass.
    removed: usize,
    /// Whether this pass left a directory in place because it was not empty yet.
    left_behind: bool,
}

impl Remover {
    /// Counts a name `result` says was removed.
    fn count(&mut self, result: nix::Result<()>) -> io::Result<()> {
        result.map_err(io::Error::from)?;
        self.removed += 1;
        Ok(())
    }
}

impl Visitor for Remover {
    fn entry(&mut self, parent: BorrowedFd<'_>, name: &CStr, stat: &Stat) -> io::Result<()> {
        if stat.is_dir() {
            // A subvolume a pod made read-only inside its volume: nothing in it could go.
            if stat.ino == btrfs::SUBVOLUME_ROOT_INODE {
                btrfs::make_writable_at(parent, name)?;
            }
            return Ok(()); // removed in leave_dir, once empty
        }
        let unlinked = unlinkat(parent, name, UnlinkatFlags::NoRemoveDir);
        ignore_missing(self.count(unlinked))
    }

    fn leave_dir(&mut self, parent: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
        match unlinkat(parent, name, UnlinkatFlags::RemoveDir) {
            // Names its listing skipped: the next pass.
            Err(Errno::ENOTEMPTY) => {
                self.left_behind = true;
                Ok(())
            }
            removed => ignore_missing(self.count(removed)),
        }
    }

    fn too_deep(&mut self, parent: BorrowedFd<'_>, name: &CStr) -> io::Result<bool> {
        // Same filesystem (the walk crosses no mount), so a rename; never over an existing name.
        loop {
            self.moved += 1;
            let aside = format!(".stickyvol-deep-{}", self.moved);
            match renameat2(
                parent,
                name,
                self.top.as_fd(),
                aside.as_str(),
                RenameFlags::RENAME_NOREPLACE,
            ) {
                Err(Errno::EEXIST) => continue,
                other => return other.map(|()| true).map_err(io::Error::from),
            }
        }
    }
}

/// Passes that found names left behind, at most: each one at least halves what a skipping
/// listing leaves, so 64 is never reached by a finite directory.
const MAX_PASSES_LEAVING_NAMES: usize = 64;

/// Walks `dir` removing what is below it, pass after pass while a pass cut a deep chain (each
/// cut moves a chain's lower part up, so they end) or left names behind (see the module
/// comment) and removed something. Names still there at the end are an error (ENOTEMPTY).
fn remove_below(dir: &Path) -> Result<(), WalkError> {
    let io_err = |source| WalkError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let top = open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|err| io_err(err.into()))?;
    let mut remover = Remover {
        top,
        moved: 0,
        removed: 0,
        left_behind: false,
    };
    let mut passes_leaving_names = 0;
    loop {
        let (moved, removed) = (remover.moved, remover.removed);
        remover.left_behind = false;
        tree::walk(dir, AtMountPoint::Refuse, &mut remover)?;
        if remover.moved != moved {
            continue;
        }
        if !remover.left_behind && tree::has_no_entries(remover.top.as_fd()).map_err(io_err)? {
            return Ok(());
        }
        passes_leaving_names += 1;
        if remover.removed == removed || passes_leaving_names == MAX_PASSES_LEAVING_NAMES {
            return Err(io_err(io::Error::from_raw_os_error(libc::ENOTEMPTY)));
        }
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
    remove_below(path)?;
    ignore_missing(fs::remove_dir(path)).map_err(io_err)
}

/// Removes everything below the directory `dir`, keeping `dir` itself (its owner, mode, quota
/// and subvolume stay): emptying a volume in place.
pub fn remove_contents(dir: &Path) -> Result<(), WalkError> {
    remove_below(dir)
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
        assert!(
            fs::symlink_metadata(&link).is_err(),
            "the symlink itself is still there"
        );
        assert!(outside.path().is_dir());
        assert_eq!(
            fs::read(outside.path().join("precious")).unwrap(),
            b"keep me"
        );
    }

    /// A chain of `depth` directories named "d" below `root`, a file at the bottom.
    fn chain(root: &Path, depth: usize) {
        use std::os::fd::AsRawFd;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let mut dir = open(root, flags, Mode::empty()).unwrap();
        for _ in 0..depth {
            nix::sys::stat::mkdirat(dir.as_fd(), "d", Mode::from_bits_truncate(0o755)).unwrap();
            dir = nix::fcntl::openat(dir.as_fd(), "d", flags, Mode::empty()).unwrap();
        }
        fs::write(format!("/proc/self/fd/{}/leaf", dir.as_raw_fd()), b"x").unwrap();
    }

    #[test]
    fn chains_deeper_than_a_walk_enters_are_cut_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("v");
        fs::create_dir(&root).unwrap();
        fs::write(root.join("beside"), b"x").unwrap();
        chain(&root, 2 * tree::MAX_DEPTH + 10);
        remove_contents(&root).unwrap();
        assert!(tree::is_empty_dir(&root).unwrap());

        chain(&root, tree::MAX_DEPTH + 1);
        remove_all(&root).unwrap();
        assert!(!root.exists());
    }

    #[test]
    fn very_deep_trees_do_not_overflow_the_stack() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("v");
        let mut path = root.clone();
        fs::create_dir(&path).unwrap();
        let mut depth = 0;
        // Each whole path stays under PATH_MAX (4096): about 1,500 levels.
        while path.as_os_str().len() < 3000 {
            path.push("d");
            fs::create_dir(&path).unwrap();
            depth += 1;
        }
        fs::write(path.join("leaf"), b"x").unwrap();
        assert!(depth > 1000, "only {depth} levels");
        remove_all(&root).unwrap();
        assert!(!root.exists());
    }

    /// A ramfs, unmounted when dropped (also when the test fails).
    struct Ramfs(tempfile::TempDir);

    impl Drop for Ramfs {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(self.0.path(), nix::mount::MntFlags::MNT_DETACH);
        }
    }

    /// ramfs lists a directory with `dcache_readdir`, whose cookies are positions in the
    /// listing, as tmpfs did before Linux 6.6: once the names of a first batch are removed,
    /// resuming at a cookie skips as many. Big directories in and below the one removed, so
    /// that their listings take several batches.
    #[test]
    fn removal_finishes_where_removing_a_name_moves_the_cookies_of_the_rest() {
        let mount = tempfile::tempdir_in("/var/tmp").unwrap();
        nix::mount::mount(
            Some("ramfs"),
            mount.path(),
            Some("ramfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .unwrap();
        let ramfs = Ramfs(mount);
        let root = ramfs.0.path().join("v");
        for dir in [root.clone(), root.join("below")] {
            fs::create_dir(&dir).unwrap();
            for n in 0..3000 {
                fs::write(dir.join(format!("a-file-with-a-long-name-{n:05}")), b"").unwrap();
            }
        }
        remove_contents(&root).unwrap();
        assert!(tree::is_empty_dir(&root).unwrap());
        fs::write(root.join("again"), b"").unwrap();
        remove_all(&root).unwrap();
        assert!(!root.exists());
    }
}
