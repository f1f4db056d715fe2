//! File identity and filesystem space, straight from statx(2) and statvfs(3).
//!
//! statx's mount-root attribute answers "is this path a mount point?" in O(1), without reading
//! /proc/self/mountinfo, and also for bind mounts within one filesystem (where comparing st_dev
//! with the parent's would say "no").

use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use nix::sys::statvfs::{FsFlags, statvfs};
use serde::{Deserialize, Serialize};

/// The subset of statx we use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub dev: (u32, u32),
    pub ino: u64,
    pub mode: u32,
    pub size: u64,
    /// Bytes allocated on disk (st_blocks × 512).
    pub allocated: u64,
    /// Hard links to this inode.
    pub links: u32,
    pub is_mount_root: bool,
}

impl Stat {
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
    pub fn is_symlink(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFLNK
    }
    pub fn is_regular_file(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }
    /// Same inode on the same device: a bind mount of a directory shows its source's identity.
    pub fn same_file(&self, other: &Stat) -> bool {
        self.id() == other.id()
    }
    /// Which file this is (see [`FileId`]).
    pub fn id(&self) -> FileId {
        FileId {
            dev: self.dev,
            ino: self.ino,
        }
    }
}

/// Which file this is, kernel-wide: its filesystem's device number (major, minor) and its inode
/// number. Unlike a path, it means the same in every mount namespace: two namespaces can each
/// have a different file at one path (two nodes of a test cluster on one kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FileId {
    pub dev: (u32, u32),
    pub ino: u64,
}

/// The identity of the file `path` names, symlinks followed (the file an open(2) of `path` gets).
pub fn file_id(path: &Path) -> io::Result<FileId> {
    let opened = nix::fcntl::open(path, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())?;
    Ok(stat_fd(opened.as_fd())?.id())
}

/// statx of `path` itself (a symlink is not followed).
pub fn lstat(path: &Path) -> io::Result<Stat> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    statx_raw(libc::AT_FDCWD, &c_path, 0)
}

/// statx of `name` inside the directory `dir` (a symlink is not followed).
pub fn lstat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Stat> {
    statx_raw(dir.as_raw_fd(), name, 0)
}

/// statx of an open file descriptor.
pub fn stat_fd(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    statx_raw(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH)
}

/// The canonical form of the existing `path` (symlinks followed), as the kernel names what it
/// opened. realpath(3) reads the link of every component, each looked up from the root again:
/// this is one lookup and one readlink, checked against the file itself so a name the kernel
/// decorates (" (deleted)") is never taken for a path.
pub fn canonical(path: &Path) -> io::Result<PathBuf> {
    let opened = nix::fcntl::open(path, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())?;
    let link = format!("/proc/self/fd/{}", opened.as_raw_fd());
    // Never NotFound: callers take that for "this path does not exist".
    let named = std::fs::read_link(&link)
        .map_err(|err| io::Error::other(format!("reading {link}: {err}")))?;
    let file = stat_fd(opened.as_fd())?;
    let same =
        named.is_absolute() && lstat_if_exists(&named)?.is_some_and(|at| at.same_file(&file));
    if !same {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} moved or vanished while being resolved", path.display()),
        ));
    }
    Ok(named)
}

/// Like `lstat`, but a missing path is `Ok(None)`.
pub fn lstat_if_exists(path: &Path) -> io::Result<Option<Stat>> {
    match lstat(path) {
        Ok(stat) => Ok(Some(stat)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

fn statx_raw(dirfd: libc::c_int, name: &CStr, extra_flags: libc::c_int) -> io::Result<Stat> {
    let mut buf = MaybeUninit::<libc::statx>::zeroed();
    let flags = libc::AT_SYMLINK_NOFOLLOW
        | libc::AT_NO_AUTOMOUNT
        | libc::AT_STATX_SYNC_AS_STAT
        | extra_flags;
    let mask = libc::STATX_TYPE
        | libc::STATX_MODE
        | libc::STATX_INO
        | libc::STATX_SIZE
        | libc::STATX_BLOCKS;
    // SAFETY: name is a valid C string and buf is a properly sized, writable statx buffer.
    let rc = unsafe { libc::statx(dirfd, name.as_ptr(), flags, mask, buf.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statx succeeded and filled the buffer.
    let st = unsafe { buf.assume_init() };
    let mount_root = libc::STATX_ATTR_MOUNT_ROOT as u64;
    if st.stx_attributes_mask & mount_root == 0 {
        // Kernels before 5.8 cannot tell; we require one that can rather than guess.
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "kernel does not report STATX_ATTR_MOUNT_ROOT (needs Linux 5.8+)",
        ));
    }
    Ok(Stat {
        dev: (st.stx_dev_major, st.stx_dev_minor),
        ino: st.stx_ino,
        mode: u32::from(st.stx_mode),
        size: st.stx_size,
        allocated: st.stx_blocks.saturating_mul(512),
        links: st.stx_nlink,
        is_mount_root: st.stx_attributes & mount_root != 0,
    })
}

/// Space and inodes of the filesystem holding `path`, as an unprivileged writer would see them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    pub total_bytes: u64,
    pub available_bytes: u64,
    pub total_inodes: u64,
    pub available_inodes: u64,
    pub read_only: bool,
}

pub fn space(path: &Path) -> io::Result<Space> {
    let st = statvfs(path)?;
    let fragment = st.fragment_size();
    Ok(Space {
        total_bytes: st.blocks().saturating_mul(fragment),
        available_bytes: st.blocks_available().saturating_mul(fragment),
        total_inodes: st.files(),
        available_inodes: st.files_available(),
        read_only: st.flags().contains(FsFlags::ST_RDONLY),
    })
}

/// The per-mount flags currently in effect at `path` (ST_RDONLY, ST_NOSUID, ...).
pub fn mount_flags(path: &Path) -> io::Result<FsFlags> {
    Ok(statvfs(path)?.flags())
}

/// Filesystems whose size-enforcement and copy-on-write features matter to us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsKind {
    Btrfs,
    Xfs,
    Ext4,
    Tmpfs,
    Overlay,
    Other(i64),
}

impl FsKind {
    pub fn name(self) -> String {
        match self {
            FsKind::Btrfs => "btrfs".into(),
            FsKind::Xfs => "xfs".into(),
            FsKind::Ext4 => "ext4".into(),
            FsKind::Tmpfs => "tmpfs".into(),
            FsKind::Overlay => "overlay".into(),
            FsKind::Other(magic) => format!("unknown (magic {magic:#x})"),
        }
    }
}

/// The type of the filesystem holding `path` (statfs f_type).
pub fn filesystem_kind(path: &Path) -> io::Result<FsKind> {
    use nix::sys::statfs::{
        BTRFS_SUPER_MAGIC, EXT4_SUPER_MAGIC, OVERLAYFS_SUPER_MAGIC, TMPFS_MAGIC, XFS_SUPER_MAGIC,
        statfs,
    };
    let kind = statfs(path)?.filesystem_type();
    Ok(match kind {
        k if k == BTRFS_SUPER_MAGIC => FsKind::Btrfs,
        k if k == XFS_SUPER_MAGIC => FsKind::Xfs,
        k if k == EXT4_SUPER_MAGIC => FsKind::Ext4,
        k if k == TMPFS_MAGIC => FsKind::Tmpfs,
        k if k == OVERLAYFS_SUPER_MAGIC => FsKind::Overlay,
        other => FsKind::Other(other.0),
    })
}

/// Whether files in `dir` can share extents (FICLONE), probed with two scratch files.
pub fn supports_reflink(dir: &Path) -> io::Result<bool> {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    // _IOW(0x94, 9, int) from linux/fs.h.
    const FICLONE: libc::c_ulong = 0x4004_9409;
    let source_path = dir.join(format!(".reflink-probe-{}", std::process::id()));
    let clone_path = dir.join(format!(".reflink-probe-{}.clone", std::process::id()));
    let result = (|| {
        // FICLONE reads the source: a write-only descriptor is EBADF, which read as "no".
        let mut source = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&source_path)?;
        source.write_all(&[0u8; 4096])?;
        source.sync_all()?;
        let clone = std::fs::File::create(&clone_path)?;
        // SAFETY: both descriptors are open; FICLONE takes the source fd as its argument.
        let rc = unsafe { libc::ioctl(clone.as_raw_fd(), FICLONE, source.as_raw_fd()) };
        Ok(rc == 0)
    })();
    let _ = std::fs::remove_file(&source_path);
    let _ = std::fs::remove_file(&clone_path);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_a_mount_root_and_its_subdirectories_are_not() {
        assert!(lstat(Path::new("/")).unwrap().is_mount_root);
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let stat = lstat(dir.path()).unwrap();
        assert!(stat.is_dir());
        assert!(!stat.is_mount_root);
    }

    #[test]
    fn symlinks_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/", &link).unwrap();
        assert!(lstat(&link).unwrap().is_symlink());
        assert_eq!(lstat_if_exists(&dir.path().join("missing")).unwrap(), None);
    }

    #[test]
    fn canonical_follows_symlinks_like_realpath_and_misses_what_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        std::fs::create_dir_all(&deep).unwrap();
        let link = dir.path().join("to-b");
        std::os::unix::fs::symlink("a/b", &link).unwrap();
        let through_link = link.join("c");
        assert_eq!(
            canonical(&through_link).unwrap(),
            through_link.canonicalize().unwrap()
        );
        assert!(canonical(&through_link).unwrap().ends_with("a/b/c"));
        assert_eq!(canonical(Path::new("/")).unwrap(), Path::new("/"));
        let missing = canonical(&dir.path().join("a/missing")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        // What the kernel would call ".../c (deleted)" is gone, not a path.
        let opened = std::fs::File::open(&deep).unwrap();
        std::fs::remove_dir(&deep).unwrap();
        let fd_path = PathBuf::from(format!("/proc/self/fd/{}", opened.as_raw_fd()));
        assert_eq!(
            canonical(&fd_path).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    /// A tmpfs mounted over a fresh directory, unmounted when dropped (also after a panic).
    struct Tmpfs(tempfile::TempDir);

    impl Tmpfs {
        fn mount() -> Tmpfs {
            use nix::mount::{MsFlags, mount};
            let dir = tempfile::tempdir().unwrap();
            mount(
                Some("tmpfs"),
                dir.path(),
                Some("tmpfs"),
                MsFlags::empty(),
                Some("size=4m"),
            )
            .expect("mounting a tmpfs (the unit tests run as root)");
            Tmpfs(dir)
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(self.0.path(), nix::mount::MntFlags::MNT_DETACH);
        }
    }

    /// The kind is read from the filesystem actually there, and the reflink probe answers
    /// "no" (not an error) where FICLONE is not supported, leaving no probe file behind. The
    /// "yes" side (XFS and btrfs answer true with the probe's FICLONE) is asserted against real
    /// filesystems in tests/host_copy.rs.
    #[test]
    fn filesystem_kind_and_reflink_probe_answer() {
        let tmpfs = Tmpfs::mount();
        let dir = tmpfs.0.path();
        assert_eq!(filesystem_kind(dir).unwrap(), FsKind::Tmpfs);
        assert_eq!(filesystem_kind(dir).unwrap().name(), "tmpfs");
        assert!(
            !supports_reflink(dir).unwrap(),
            "tmpfs cannot share extents"
        );
        assert_eq!(
            std::fs::read_dir(dir).unwrap().count(),
            0,
            "probe files left behind"
        );
        // A filesystem we have no kind for is named by its magic (procfs: 0x9fa0).
        assert_eq!(
            filesystem_kind(Path::new("/proc")).unwrap().name(),
            "unknown (magic 0x9fa0)"
        );
    }

    #[test]
    fn space_reports_something_plausible() {
        let space = space(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
        assert!(space.total_bytes >= space.available_bytes);
        assert!(space.total_bytes > 0);
    }
}
