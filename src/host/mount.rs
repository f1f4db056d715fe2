//! Bind mounts with the new mount API (open_tree, mount_setattr, move_mount): the copy of the
//! source gets its per-mount flags (read-only etc.) while still detached, then is attached to
//! a directory given by descriptor. mount(2) would need a second, remount call for the flags,
//! leaving the mount read-write in between, and takes the target by path.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::sys::statvfs::FsFlags;
use sys_mount::{MountFlags, UnmountFlags, unmount as sys_unmount};

/// The per-mount flags a bind mount can carry, by their mount(8) option names.
const BIND_FLAGS: &[(&str, MountFlags)] = &[
    ("ro", MountFlags::RDONLY),
    ("nosuid", MountFlags::NOSUID),
    ("nodev", MountFlags::NODEV),
    ("noexec", MountFlags::NOEXEC),
    ("noatime", MountFlags::NOATIME),
    ("nodiratime", MountFlags::NODIRATIME),
    ("relatime", MountFlags::RELATIME),
    ("strictatime", MountFlags::STRICTATIME),
];

/// Options that only restate the default and need no flag.
const NO_OP_OPTIONS: &[&str] = &["rw", "bind", "defaults"];

/// The flag for a mount option, `Some(empty)` for options that are the default anyway,
/// `None` for options a bind mount cannot honour (e.g. "size=1G", "discard").
pub fn bind_flag(option: &str) -> Option<MountFlags> {
    if NO_OP_OPTIONS.contains(&option) {
        return Some(MountFlags::empty());
    }
    BIND_FLAGS
        .iter()
        .find(|(name, _)| *name == option)
        .map(|(_, flag)| *flag)
}

/// Every option name `bind_flag` accepts, for error messages and docs.
pub fn accepted_options() -> Vec<&'static str> {
    NO_OP_OPTIONS
        .iter()
        .copied()
        .chain(BIND_FLAGS.iter().map(|(name, _)| *name))
        .collect()
}

/// Bind-mounts `source` onto the directory `target` with exactly `flags` (RDONLY etc.).
/// `target` is an open descriptor: the mount lands on that very directory, whatever its path
/// has become since it was checked. With the new mount API the flags are set on the detached
/// copy before it is attached, so a read-only bind is never visible read-write.
pub fn bind_onto(source: &Path, target: BorrowedFd<'_>, flags: MountFlags) -> io::Result<()> {
    let source = CString::new(source.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a C string and plain integers; the result is a new descriptor or -1.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            source.as_ptr(),
            libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC as libc::c_uint,
        )
    };
    if tree < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a descriptor nobody else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as libc::c_int) };
    set_flags_on(tree.as_fd(), flags)?;
    // SAFETY: two descriptors and empty C strings (the descriptors themselves are meant).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Replaces the per-mount flags of the mount whose root `mount` is (an open descriptor, or a
/// detached copy from open_tree). Atime flags are kept unless `flags` names one, as a remount does.
pub fn set_flags_on(mount: BorrowedFd<'_>, flags: MountFlags) -> io::Result<()> {
    let mut attr = libc::mount_attr {
        attr_set: 0,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    for (flag, bit) in [
        (MountFlags::RDONLY, libc::MOUNT_ATTR_RDONLY),
        (MountFlags::NOSUID, libc::MOUNT_ATTR_NOSUID),
        (MountFlags::NODEV, libc::MOUNT_ATTR_NODEV),
        (MountFlags::NOEXEC, libc::MOUNT_ATTR_NOEXEC),
    ] {
        match flags.contains(flag) {
            true => attr.attr_set |= bit,
            false => attr.attr_clr |= bit,
        }
    }
    let atime = MountFlags::NOATIME
        | MountFlags::RELATIME
        | MountFlags::STRICTATIME
        | MountFlags::NODIRATIME;
    if flags.intersects(atime) {
        attr.attr_clr |= libc::MOUNT_ATTR__ATIME | libc::MOUNT_ATTR_NODIRATIME;
        if flags.contains(MountFlags::NOATIME) {
            attr.attr_set |= libc::MOUNT_ATTR_NOATIME;
        } else if flags.contains(MountFlags::STRICTATIME) {
            attr.attr_set |= libc::MOUNT_ATTR_STRICTATIME;
        } else {
            attr.attr_set |= libc::MOUNT_ATTR_RELATIME;
        }
        if flags.contains(MountFlags::NODIRATIME) {
            attr.attr_set |= libc::MOUNT_ATTR_NODIRATIME;
        }
    }
    set_attributes(mount, &attr)
}

/// mount_setattr(2) on the mount whose root `mount` is: sets and clears what `attr` says.
pub fn set_attributes(mount: BorrowedFd<'_>, attr: &libc::mount_attr) -> io::Result<()> {
    // SAFETY: a descriptor, an empty C string and a mount_attr of the size we pass.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mount.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Per-mount flags as mount(2) takes them and as statvfs(3) reports them.
const REPORTED_FLAGS: &[(MountFlags, FsFlags)] = &[
    (MountFlags::RDONLY, FsFlags::ST_RDONLY),
    (MountFlags::NOSUID, FsFlags::ST_NOSUID),
    (MountFlags::NODEV, FsFlags::ST_NODEV),
    (MountFlags::NOEXEC, FsFlags::ST_NOEXEC),
    (MountFlags::NOATIME, FsFlags::ST_NOATIME),
    (MountFlags::NODIRATIME, FsFlags::ST_NODIRATIME),
    (MountFlags::RELATIME, FsFlags::ST_RELATIME),
];

/// The per-mount flags (except read-only) of the mount holding `source`. A bind mount starts
/// with them and a remount replaces the whole set, so they must be restated to be kept; in a
/// user namespace the kernel even refuses to drop them.
pub fn inherited_flags(source: &Path) -> io::Result<MountFlags> {
    let current = super::fsstat::mount_flags(source)?;
    Ok(REPORTED_FLAGS
        .iter()
        .filter(|(flag, seen)| *flag != MountFlags::RDONLY && current.contains(*seen))
        .fold(MountFlags::empty(), |acc, (flag, _)| acc | *flag))
}

/// Whether the mount at `target` already carries exactly the flags we would set.
pub fn has_flags(target: &Path, flags: MountFlags) -> io::Result<bool> {
    let current = super::fsstat::mount_flags(target)?;
    Ok(REPORTED_FLAGS
        .iter()
        .all(|(wanted, seen)| flags.contains(*wanted) == current.contains(*seen)))
}

/// Unmounts the topmost mount on `name` in the open directory `dir`, resolved from that
/// descriptor (a symlink there is not followed). Holding the mount itself open instead would
/// keep it busy. (nix's flag: sys-mount's `UnmountFlags::NOFOLLOW` carries O_NOFOLLOW's value,
/// which umount2 refuses.)
pub fn unmount_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let path = super::dirfd::fd_path(dir).join(name);
    Ok(nix::mount::umount2(
        &path,
        nix::mount::MntFlags::UMOUNT_NOFOLLOW,
    )?)
}

/// Unmounts the topmost mount at `target` (no lazy detach: a busy mount is an error to report).
pub fn unmount(target: &Path) -> io::Result<()> {
    sys_unmount(target, UnmountFlags::empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_names_map_to_flags() {
        assert_eq!(bind_flag("ro"), Some(MountFlags::RDONLY));
        assert_eq!(bind_flag("rw"), Some(MountFlags::empty()));
        assert_eq!(bind_flag("size=1G"), None);
        assert_eq!(bind_flag("RO"), None);
        assert!(accepted_options().contains(&"noexec"));
    }
}
