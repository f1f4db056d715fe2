//! What a faithful copy keeps of an inode besides its data (owner, mode, nanosecond times,
//! xattrs with ACLs and security labels, device numbers), read from one inode and applied to
//! another. Shared by `copy` (snapshots, restores, clones) and `archive` (export streams).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

use nix::fcntl::AtFlags;
use nix::sys::stat::{
    FchmodatFlags, Mode, UtimensatFlags, fchmod, fchmodat, fstat, fstatat, futimens, utimensat,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, fchown, fchownat};

use super::fsstat::Stat;

fn unsupported(err: &io::Error) -> bool {
    err.raw_os_error() == Some(libc::EOPNOTSUPP)
}

/// An inode to read or change: an open file, or a name in an open directory (never followed).
#[derive(Clone, Copy)]
pub(super) enum Node<'a> {
    Open(BorrowedFd<'a>),
    At(BorrowedFd<'a>, &'a CStr),
}

/// What is copied about an inode besides its data.
pub(super) struct Meta {
    pub(super) ino: u64,
    pub(super) mode: u32,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) rdev: u64,
    pub(super) size: u64,
    pub(super) allocated: u64,
    pub(super) atime: TimeSpec,
    pub(super) mtime: TimeSpec,
    pub(super) xattrs: Vec<(CString, Vec<u8>)>,
}

impl Meta {
    /// Still the inode the walk reported (not replaced in between)?
    pub(super) fn is(&self, stat: &Stat) -> bool {
        self.ino == stat.ino && self.mode & libc::S_IFMT == stat.mode & libc::S_IFMT
    }
}

/// The most xattr bytes (names and values) read from one inode. Linux lets one inode carry
/// far more on some filesystems (XFS: thousands of 64 KiB values); a copy or an export holds
/// one inode's at a time, so this bounds what a pod's xattrs can make us hold.
pub const MAX_XATTR_BYTES: usize = 1 << 20;

/// A directory's metadata while its entries are copied or exported, without its xattrs: held
/// for every level from the root down, they could cost `MAX_XATTR_BYTES` each. Its times are
/// the ones read before the listing (which moves atime); the rest is read again when the
/// directory is done.
pub(super) struct HeldMeta(Meta);

impl HeldMeta {
    pub(super) fn hold(mut meta: Meta) -> HeldMeta {
        meta.xattrs = Vec::new();
        HeldMeta(meta)
    }

    /// The directory's metadata once its entries are done: read again from `name` in
    /// `parent` if that is still the same directory, with the held times; else what is held.
    pub(super) fn complete(self, parent: BorrowedFd<'_>, name: &CStr) -> io::Result<Meta> {
        let held = self.0;
        match read_meta(Node::At(parent, name)) {
            Ok(mut now)
                if now.ino == held.ino && now.mode & libc::S_IFMT == held.mode & libc::S_IFMT =>
            {
                (now.atime, now.mtime) = (held.atime, held.mtime);
                Ok(now)
            }
            Ok(_) => Ok(held),
            Err(err) if matches!(err.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                Ok(held)
            }
            Err(err) => Err(err),
        }
    }
}

pub(super) fn read_meta(node: Node<'_>) -> io::Result<Meta> {
    let st = match node {
        Node::Open(fd) => fstat(fd),
        Node::At(dir, name) => fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW),
    }?;
    Ok(Meta {
        ino: st.st_ino,
        mode: st.st_mode,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev,
        size: st.st_size as u64,
        allocated: (st.st_blocks as u64).saturating_mul(512),
        atime: TimeSpec::new(st.st_atime, st.st_atime_nsec),
        mtime: TimeSpec::new(st.st_mtime, st.st_mtime_nsec),
        xattrs: read_xattrs(node)?,
    })
}

/// Sets owner, xattrs, mode and times, in that order: chown clears setuid/setgid and file
/// capabilities, an ACL rewrites the mode, and each change moves ctime but not atime/mtime.
pub(super) fn apply_meta(node: Node<'_>, meta: &Meta) -> io::Result<()> {
    let (uid, gid) = (Some(Uid::from_raw(meta.uid)), Some(Gid::from_raw(meta.gid)));
    match node {
        Node::Open(fd) => fchown(fd, uid, gid),
        Node::At(dir, name) => fchownat(dir, name, uid, gid, AtFlags::AT_SYMLINK_NOFOLLOW),
    }?;
    let xattrs = XattrTarget::of(node);
    for (name, value) in &meta.xattrs {
        match xattrs.set(name, value) {
            // A filesystem without ACLs or a security module's labels cannot hold these.
            Err(err) if unsupported(&err) && optional_xattr(name.to_bytes()) => {}
            other => other?,
        }
    }
    let perm = Mode::from_bits_truncate(meta.mode & 0o7777);
    match node {
        Node::Open(fd) => fchmod(fd, perm)?,
        // Linux keeps no mode on symlinks.
        Node::At(..) if meta.mode & libc::S_IFMT == libc::S_IFLNK => {}
        // Not followed in practice: we created this name ourselves, and not as a symlink.
        Node::At(dir, name) => fchmodat(dir, name, perm, FchmodatFlags::FollowSymlink)?,
    }
    match node {
        Node::Open(fd) => futimens(fd, &meta.atime, &meta.mtime),
        Node::At(dir, name) => utimensat(
            dir,
            name,
            &meta.atime,
            &meta.mtime,
            UtimensatFlags::NoFollowSymlink,
        ),
    }?;
    Ok(())
}

/// The xattr namespaces we copy: user data, privileged data, security labels and capabilities,
/// and POSIX ACLs.
pub(super) fn copied_xattr(name: &[u8]) -> bool {
    [&b"user."[..], b"trusted.", b"security."]
        .iter()
        .any(|prefix| name.starts_with(prefix))
        || name == b"system.posix_acl_access"
        || name == b"system.posix_acl_default"
}

/// Xattrs a destination filesystem may lack support for without the copy failing.
fn optional_xattr(name: &[u8]) -> bool {
    name.starts_with(b"security.") || name.starts_with(b"system.")
}

fn read_xattrs(node: Node<'_>) -> io::Result<Vec<(CString, Vec<u8>)>> {
    let target = XattrTarget::of(node);
    let names = match target.list() {
        Err(err) if unsupported(&err) => return Ok(Vec::new()),
        names => names?,
    };
    let mut xattrs = Vec::new();
    let mut held = names.len();
    for name in names.split(|&byte| byte == 0) {
        if name.is_empty() || !copied_xattr(name) {
            continue;
        }
        let name = CString::new(name).expect("split at every NUL");
        match target.get(&name) {
            Ok(value) => {
                held += value.len();
                if held > MAX_XATTR_BYTES {
                    return Err(super::tree::beyond_limit(format!(
                        "its xattrs hold more than {MAX_XATTR_BYTES} bytes, more than stickyvol copies"
                    )));
                }
                xattrs.push((name, value))
            }
            Err(err) if err.raw_os_error() == Some(libc::ENODATA) => {} // removed meanwhile
            Err(err) => return Err(err),
        }
    }
    Ok(xattrs)
}

/// Where xattr calls go: an open descriptor, or a name in an open directory reached through
/// /proc/self/fd (there is no *at form of the xattr calls before Linux 6.13), whose last
/// component the l*xattr calls do not follow.
enum XattrTarget {
    Fd(RawFd),
    Path(CString),
}

impl XattrTarget {
    fn of(node: Node<'_>) -> XattrTarget {
        match node {
            Node::Open(fd) => XattrTarget::Fd(fd.as_raw_fd()),
            Node::At(dir, name) => {
                let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
                path.extend_from_slice(name.to_bytes());
                XattrTarget::Path(CString::new(path).expect("a C string holds no NUL"))
            }
        }
    }

    /// The names, each followed by a NUL.
    fn list(&self) -> io::Result<Vec<u8>> {
        read_sized(|buf, len| match self {
            // SAFETY: buf is null with len 0 (a size query) or points to len writable bytes;
            // the descriptor is open for the call.
            XattrTarget::Fd(fd) => unsafe { libc::flistxattr(*fd, buf.cast(), len) },
            // SAFETY: as above; path is a valid C string.
            XattrTarget::Path(path) => unsafe { libc::llistxattr(path.as_ptr(), buf.cast(), len) },
        })
    }

    fn get(&self, name: &CStr) -> io::Result<Vec<u8>> {
        read_sized(|buf, len| match self {
            // SAFETY: buf is null with len 0 (a size query) or points to len writable bytes;
            // name is a valid C string and the descriptor is open for the call.
            XattrTarget::Fd(fd) => unsafe { libc::fgetxattr(*fd, name.as_ptr(), buf.cast(), len) },
            // SAFETY: as above; path is a valid C string.
            XattrTarget::Path(path) => unsafe {
                libc::lgetxattr(path.as_ptr(), name.as_ptr(), buf.cast(), len)
            },
        })
    }

    fn set(&self, name: &CStr, value: &[u8]) -> io::Result<()> {
        let (data, len) = (value.as_ptr().cast(), value.len());
        let rc = match self {
            // SAFETY: data points to len readable bytes, name is a valid C string and the
            // descriptor is open for the call.
            XattrTarget::Fd(fd) => unsafe { libc::fsetxattr(*fd, name.as_ptr(), data, len, 0) },
            // SAFETY: as above; path is a valid C string.
            XattrTarget::Path(path) => unsafe {
                libc::lsetxattr(path.as_ptr(), name.as_ptr(), data, len, 0)
            },
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Runs a size query (`call(null, 0)`), then `call` with a buffer that large, again from the
/// start if the value grew in between (ERANGE).
fn read_sized(mut call: impl FnMut(*mut u8, usize) -> isize) -> io::Result<Vec<u8>> {
    loop {
        let size = call(std::ptr::null_mut(), 0);
        if size < 0 {
            return Err(io::Error::last_os_error());
        }
        if size == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; size as usize];
        let got = call(buf.as_mut_ptr(), buf.len());
        if got >= 0 {
            buf.truncate(got as usize);
            return Ok(buf);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ERANGE) {
            return Err(err);
        }
    }
}
