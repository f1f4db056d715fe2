//! Bind mounts with mount(2), through sys-mount.
//!
//! A bind mount ignores per-mount flags on its first call and starts with its source mount's
//! flags, so other flags such as read-only take a second call (MS_BIND | MS_REMOUNT | flags).
//! Until that second call succeeds the mount is read-write; on failure we unmount again rather
//! than leave it so.

use std::io;
use std::path::Path;

use nix::sys::statvfs::FsFlags;
use sys_mount::{Mount, MountFlags, UnmountFlags, unmount as sys_unmount};

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

/// Bind-mounts `source` onto `target` and applies `flags` (RDONLY etc.) to the new mount.
pub fn bind(source: &Path, target: &Path, flags: MountFlags) -> io::Result<()> {
    Mount::builder()
        .fstype("none")
        .flags(MountFlags::BIND)
        .mount(source, target)?;
    if flags.is_empty() {
        return Ok(());
    }
    // The remount takes the filesystem's superblock lock for writing, which every other
    // publish on that filesystem then waits for; a statvfs tells when it would change nothing.
    let applied = has_flags(target, flags).and_then(|same| match same {
        true => Ok(()),
        false => set_flags(target, flags),
    });
    if let Err(err) = applied {
        let _ = unmount(target);
        return Err(err);
    }
    Ok(())
}

/// Replaces the per-mount flags of the bind mount at `target`.
pub fn set_flags(target: &Path, flags: MountFlags) -> io::Result<()> {
    Mount::builder()
        .fstype("none")
        .flags(MountFlags::BIND | MountFlags::REMOUNT | flags)
        .mount("none", target)
        .map(drop)
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
