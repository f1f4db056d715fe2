//! btrfs subvolumes and their qgroup limits, through the kernel's ioctls (no btrfs-progs).
//!
//! A volume on btrfs is a subvolume of the pool directory; its size is enforced by a limit on
//! its level-0 qgroup ("0/<subvolume id>"), which makes writes past it fail with EDQUOT.
//!
//! Facts measured on Linux 6.18 (tests/host_btrfs.rs checks them and prints the numbers):
//! - A write(2) or fallocate(2) past the limit fails with EDQUOT, at the limit to within a few
//!   pages. Raising the limit lets writes continue at once.
//! - Qgroup numbers (`referenced`, `exclusive`) only change when a transaction commits: right
//!   after a write they still show the old value. [`sync`] commits. The limit itself is
//!   enforced at write time regardless, through reservations.
//! - SNAP_DESTROY removes a subvolume with all its files in one call (no need to empty it), but
//!   fails with ENOTEMPTY while it contains another subvolume.
//! - The level-0 qgroup of a deleted subvolume stays until the cleaner thread has dropped the
//!   subvolume's tree, which happens on the periodic transaction commit (mount option
//!   `commit`, 30 s by default); then the kernel removes the qgroup by itself. Destroying it
//!   earlier fails with EBUSY (see [`remove_qgroup`]).

use std::ffi::{CStr, CString};
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, open, openat};
use nix::sys::stat::Mode;
use nix::sys::statfs::{BTRFS_SUPER_MAGIC, fstatfs};

use super::fsstat::{self, Stat};
use uapi::*;

/// The inode number of every subvolume's root directory (BTRFS_FIRST_FREE_OBJECTID).
pub const SUBVOLUME_ROOT_INODE: u64 = 256;

/// Longest name a directory entry can have; the kernel's lookup refuses anything longer, so
/// the ioctls' own bound (BTRFS_PATH_NAME_MAX, 4087) is never the one that matters.
const NAME_MAX: usize = 255;

/// Creates the subvolume `parent/name` (BTRFS_IOC_SUBVOL_CREATE). `parent` must be a directory
/// on btrfs and is not followed if it is a symlink. Fails with EEXIST if `name` exists.
pub fn create_subvolume(parent: &Path, name: &str) -> io::Result<()> {
    let args = VolArgs::named(validate_name(name)?);
    let parent = open_dir(parent)?;
    // SAFETY: the fd is an open directory; `args` is a complete struct btrfs_ioctl_vol_args
    // that outlives the call and that the kernel only reads.
    unsafe { btrfs_ioc_subvol_create(parent.as_raw_fd(), &args) }?;
    Ok(())
}

/// Snapshots the subvolume rooted at `source` as `parent/name` (BTRFS_IOC_SNAP_CREATE_V2): O(1)
/// and atomic, so it is crash-consistent even while the source is written. `read_only` makes
/// it immutable (a snapshot); otherwise it is a writable copy (a restore or clone). The new
/// subvolume shares every extent with its source and gets a level-0 qgroup of its own when
/// quota is on (no limit: callers set one). Nested subvolumes are not included: they appear as
/// empty directories. Fails with EEXIST if `name` exists, EXDEV across filesystems.
pub fn snapshot_subvolume(
    source: &Path,
    parent: &Path,
    name: &str,
    read_only: bool,
) -> io::Result<()> {
    let name = validate_name(name)?;
    let source_fd = open_dir(source)?;
    if !is_subvolume_root(&fsstat::stat_fd(source_fd.as_fd())?) {
        return Err(not_a_subvolume(source));
    }
    let parent_fd = open_dir(parent)?;
    let mut args = VolArgsV2::named(name);
    args.fd = i64::from(source_fd.as_raw_fd());
    if read_only {
        args.flags = BTRFS_SUBVOL_RDONLY;
    }
    // SAFETY: both fds are open directories; `args` is a complete struct
    // btrfs_ioctl_vol_args_v2 that outlives the call and that the kernel only reads.
    unsafe { btrfs_ioc_snap_create_v2(parent_fd.as_raw_fd(), &args) }?;
    Ok(())
}

/// Whether `path` itself (a symlink is not followed) is the root of a btrfs subvolume: a
/// directory on btrfs whose inode number is 256. The top-level subvolume (id 5) counts.
pub fn is_subvolume(path: &Path) -> io::Result<bool> {
    // O_PATH opens a symlink itself rather than its target, and needs no read permission.
    let fd = open(
        path,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let stat = fsstat::stat_fd(fd.as_fd())?;
    Ok(is_subvolume_root(&stat) && is_btrfs(&fd)?)
}

/// Deletes the subvolume `parent/name` with everything in it (BTRFS_IOC_SNAP_DESTROY).
///
/// Refuses, deleting nothing, when `name` is not a subvolume root (a plain directory, a symlink
/// even to a subvolume, a file): InvalidInput. A missing `name` is NotFound. The kernel fails
/// with ENOTEMPTY while the subvolume contains another subvolume: delete those first (rmdir(2)
/// of an empty nested subvolume, which `safe_delete::remove_all` does, also works) and retry.
/// The space is freed in the background by the kernel's cleaner thread.
pub fn delete_subvolume(parent: &Path, name: &str) -> io::Result<()> {
    let c_name = CString::new(validate_name(name)?).expect("validated names have no NUL");
    let parent_fd = open_dir(parent)?;
    let stat = fsstat::lstat_at(parent_fd.as_fd(), &c_name)?;
    if !is_subvolume_root(&stat) || !is_btrfs(&parent_fd)? {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is not a btrfs subvolume; refusing to delete it",
                parent.join(name).display()
            ),
        ));
    }
    // The kernel looks `name` up again and refuses anything but a subvolume root itself, so a
    // swap after our check cannot make it delete a plain directory or follow a symlink.
    let args = VolArgs::named(name);
    // SAFETY: the fd is an open directory; `args` is a complete struct btrfs_ioctl_vol_args
    // that outlives the call and that the kernel only reads.
    unsafe { btrfs_ioc_snap_destroy(parent_fd.as_raw_fd(), &args) }?;
    Ok(())
}

/// Sets or clears the read-only flag of the subvolume whose root is `path`
/// (BTRFS_IOC_SUBVOL_SETFLAGS). A pod may make a subvolume it created inside its volume
/// read-only: its files could then never be deleted.
pub fn set_read_only(path: &Path, read_only: bool) -> io::Result<()> {
    let fd = open_dir(path)?;
    if !is_subvolume_root(&fsstat::stat_fd(fd.as_fd())?) || !is_btrfs(&fd)? {
        return Err(not_a_subvolume(path));
    }
    set_read_only_flag(&fd, read_only).map(|_| ())
}

/// Makes the entry `name` of `parent` writable if it is a read-only btrfs subvolume; true if
/// it was. Anything else is left alone (false).
pub fn make_writable_at(parent: BorrowedFd<'_>, name: &CStr) -> io::Result<bool> {
    let fd = openat(parent, name, DIR_FLAGS, Mode::empty())?;
    if !is_subvolume_root(&fsstat::stat_fd(fd.as_fd())?) || !is_btrfs(&fd)? {
        return Ok(false);
    }
    set_read_only_flag(&fd, false)
}

/// Sets the flag; true if that changed it.
fn set_read_only_flag(fd: &OwnedFd, read_only: bool) -> io::Result<bool> {
    let mut flags = 0u64;
    // SAFETY: fd is an open subvolume root; the kernel writes one u64 into `flags`.
    unsafe { btrfs_ioc_subvol_getflags(fd.as_raw_fd(), &mut flags) }?;
    let wanted = if read_only {
        flags | BTRFS_SUBVOL_RDONLY
    } else {
        flags & !BTRFS_SUBVOL_RDONLY
    };
    if wanted == flags {
        return Ok(false);
    }
    // SAFETY: as above; the kernel reads one u64.
    unsafe { btrfs_ioc_subvol_setflags(fd.as_raw_fd(), &wanted) }?;
    Ok(true)
}

/// The id of the subvolume whose root is `path` (BTRFS_IOC_INO_LOOKUP of inode 256 in the
/// fd's own tree). Refuses a directory that is not a subvolume root, which would otherwise
/// answer with the id of the subvolume containing it.
pub fn subvolume_id(path: &Path) -> io::Result<u64> {
    let fd = open_dir(path)?;
    if !is_subvolume_root(&fsstat::stat_fd(fd.as_fd())?) {
        return Err(not_a_subvolume(path));
    }
    lookup_subvolume_id(&fd)
}

/// BTRFS_IOC_INO_LOOKUP of inode 256 in the fd's own tree (treeid 0): the fd's subvolume id.
fn lookup_subvolume_id(fd: &OwnedFd) -> io::Result<u64> {
    let mut args = InoLookupArgs {
        treeid: 0,
        objectid: BTRFS_FIRST_FREE_OBJECTID,
        name: [0; BTRFS_INO_LOOKUP_PATH_MAX],
    };
    // SAFETY: `args` is a complete struct btrfs_ioctl_ino_lookup_args the kernel reads and
    // fills in; it outlives the call.
    unsafe { btrfs_ioc_ino_lookup(fd.as_raw_fd(), &mut args) }?;
    Ok(args.treeid)
}

/// The filesystem's UUID as the kernel names its /sys/fs/btrfs/<uuid> directory
/// (BTRFS_IOC_FS_INFO `fsid`, lower-case, hyphenated). `path` is any directory on it.
pub fn filesystem_id(path: &Path) -> io::Result<String> {
    let fsid = fs_info(&open_dir(path)?)?.fsid;
    Ok(uuid::Uuid::from_bytes(fsid).hyphenated().to_string())
}

fn fs_info(fd: &OwnedFd) -> io::Result<FsInfoArgs> {
    let mut args = FsInfoArgs::zeroed();
    // SAFETY: `args` is a zeroed struct btrfs_ioctl_fs_info_args (flags 0 asks for nothing
    // optional) that the kernel fills in; it outlives the call.
    unsafe { btrfs_ioc_fs_info(fd.as_raw_fd(), &mut args) }?;
    Ok(args)
}

/// Whether quota (qgroup accounting) is enabled on the filesystem holding `path`, read from
/// sysfs: the kernel only has /sys/fs/btrfs/<uuid>/qgroups while quota is on.
pub fn quota_enabled(path: &Path) -> io::Result<bool> {
    let qgroups = sysfs_dir(path)?.join("qgroups");
    match fs::read_to_string(qgroups.join("enabled")) {
        Ok(text) => Ok(text.trim() != "0"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => qgroups.try_exists(),
        Err(e) => Err(e),
    }
}

/// Enables quota on the filesystem holding `path` (BTRFS_IOC_QUOTA_CTL, ENABLE), then waits for
/// the rescan that enabling starts (BTRFS_IOC_QUOTA_RESCAN_WAIT): until it ends, the qgroups
/// of existing subvolumes show incomplete numbers. The rescan reads every extent of the
/// filesystem, so on a big one this takes a while, and qgroup accounting slows every later
/// transaction commit a little: callers should make enabling a deliberate, logged step.
/// Enabling an enabled quota is a no-op.
pub fn enable_quota(path: &Path) -> io::Result<()> {
    let fd = open_dir(path)?;
    let mut args = QuotaCtlArgs {
        cmd: BTRFS_QUOTA_CTL_ENABLE,
        status: 0,
    };
    // SAFETY: `args` is a complete struct btrfs_ioctl_quota_ctl_args that outlives the call.
    unsafe { btrfs_ioc_quota_ctl(fd.as_raw_fd(), &mut args) }?;
    // SAFETY: RESCAN_WAIT takes no argument; it returns at once when no rescan runs.
    unsafe { btrfs_ioc_quota_rescan_wait(fd.as_raw_fd()) }?;
    Ok(())
}

/// Limits the bytes the subvolume rooted at `subvolume` may reference (its level-0 qgroup's
/// max_rfer; BTRFS_IOC_QGROUP_LIMIT with qgroupid 0 = the fd's subvolume). Raising and
/// lowering both work; a limit below current usage only stops further writes. 0 is refused
/// (nothing could be written) and so is u64::MAX, which the kernel reads as "remove the
/// limit" (see [`clear_limit`]). Needs quota enabled (ENOTCONN otherwise).
pub fn set_limit(subvolume: &Path, max_referenced_bytes: u64) -> io::Result<()> {
    if max_referenced_bytes == 0 || max_referenced_bytes == QGROUP_CLEAR_VALUE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{max_referenced_bytes} is not a usable qgroup limit"),
        ));
    }
    limit(subvolume, max_referenced_bytes)
}

/// Removes the subvolume's referenced-bytes limit (max_rfer set to the kernel's clear value).
pub fn clear_limit(subvolume: &Path) -> io::Result<()> {
    limit(subvolume, QGROUP_CLEAR_VALUE)
}

fn limit(subvolume: &Path, max_rfer: u64) -> io::Result<()> {
    let fd = open_dir(subvolume)?;
    // qgroupid 0 means "the fd's subvolume", so a plain directory would limit its parent.
    if !is_subvolume_root(&fsstat::stat_fd(fd.as_fd())?) {
        return Err(not_a_subvolume(subvolume));
    }
    match qgroup_limit(&fd, 0, max_rfer) {
        // The ioctl runs a transaction in the fd's subvolume, which the kernel refuses with
        // EDQUOT once that subvolume is over its limit (after lowering it, say): exactly when
        // the limit most needs changing. The parent directory is in another subvolume, so
        // going through it with the explicit qgroup id works.
        Err(e) if e.raw_os_error() == Some(libc::EDQUOT) => {
            let id = lookup_subvolume_id(&fd)?;
            let parent = openat_dir(&fd, c"..")?;
            // The root of the mount has a parent outside this filesystem.
            if fs_info(&parent).ok().map(|p| p.fsid) != Some(fs_info(&fd)?.fsid) {
                return Err(e);
            }
            qgroup_limit(&parent, id, max_rfer)
        }
        result => result,
    }
}

fn qgroup_limit(fd: &OwnedFd, qgroupid: u64, max_rfer: u64) -> io::Result<()> {
    let mut args = QgroupLimitArgs {
        qgroupid,
        lim: QgroupLimit {
            flags: BTRFS_QGROUP_LIMIT_MAX_RFER,
            max_rfer,
            max_excl: 0,
            rsv_rfer: 0,
            rsv_excl: 0,
        },
    };
    // SAFETY: `args` is a complete struct btrfs_ioctl_qgroup_limit_args that outlives the call.
    unsafe { btrfs_ioc_qgroup_limit(fd.as_raw_fd(), &mut args) }?;
    Ok(())
}

/// A level-0 qgroup's numbers as of the last transaction commit (see [`sync`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QgroupUsage {
    /// Bytes of all extents the subvolume references, shared ones included.
    pub referenced: u64,
    /// Bytes referenced by this subvolume only (what deleting it would free).
    pub exclusive: u64,
    /// The max_rfer limit, None when no limit is set.
    pub max_referenced: Option<u64>,
}

/// Usage of subvolume `subvolume_id`'s qgroup, read from
/// /sys/fs/btrfs/<uuid>/qgroups/0_<id>/: a few small files, O(1) whatever the subvolume holds
/// (the quota tree via TREE_SEARCH would give the same numbers for much more code). sysfs
/// prints max_referenced as 0 when there is no limit, so `limit_flags` decides. NotFound when
/// quota is off or the qgroup does not exist.
pub fn usage(path_in_fs: &Path, subvolume_id: u64) -> io::Result<QgroupUsage> {
    let dir = sysfs_dir(path_in_fs)?
        .join("qgroups")
        .join(format!("0_{subvolume_id}"));
    let read = |attribute: &str| read_sysfs_number(&dir.join(attribute));
    let limited = read("limit_flags")? & BTRFS_QGROUP_LIMIT_MAX_RFER != 0;
    Ok(QgroupUsage {
        referenced: read("referenced")?,
        exclusive: read("exclusive")?,
        max_referenced: if limited {
            Some(read("max_referenced")?)
        } else {
            None
        },
    })
}

/// Commits the running transaction of the filesystem holding `path` (syncfs(2)), after which
/// [`usage`] is exact. It writes back every dirty page of the whole filesystem, so its cost is
/// that of all pending writes (any volume's) plus one commit: fine before a usage report,
/// not on every stats call.
pub fn sync(path: &Path) -> io::Result<()> {
    let fd = open_dir(path)?;
    // SAFETY: syncfs only takes an open fd.
    if unsafe { libc::syncfs(fd.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Destroys the level-0 qgroup of a deleted subvolume (BTRFS_IOC_QGROUP_CREATE, create = 0),
/// best effort. Ok when the qgroup is already gone: this kernel removes it by itself once the
/// cleaner has dropped the subvolume, so this only matters on kernels that leave it behind.
/// Fails with EBUSY while the subvolume exists or is still being dropped, ENOTCONN when quota
/// is off.
pub fn remove_qgroup(path_in_fs: &Path, subvolume_id: u64) -> io::Result<()> {
    let fd = open_dir(path_in_fs)?;
    let args = QgroupCreateArgs {
        create: 0,
        qgroupid: subvolume_id, // level 0 in the top 16 bits
    };
    // SAFETY: `args` is a complete struct btrfs_ioctl_qgroup_create_args that outlives the call.
    match unsafe { btrfs_ioc_qgroup_create(fd.as_raw_fd(), &args) } {
        Ok(_) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(errno) => Err(errno.into()),
    }
}

/// Names the ioctls take: one directory entry, not a path.
fn validate_name(name: &str) -> io::Result<&str> {
    let valid = !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= NAME_MAX
        && !name.bytes().any(|b| b == b'/' || b == 0);
    if valid {
        Ok(name)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a valid subvolume name"),
        ))
    }
}

fn is_subvolume_root(stat: &Stat) -> bool {
    stat.is_dir() && stat.ino == SUBVOLUME_ROOT_INODE
}

fn is_btrfs(fd: &OwnedFd) -> io::Result<bool> {
    Ok(fstatfs(fd)?.filesystem_type() == BTRFS_SUPER_MAGIC)
}

fn not_a_subvolume(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{} is not a btrfs subvolume", path.display()),
    )
}

/// Ioctls need a real (not O_PATH) descriptor; O_NOFOLLOW keeps a symlink from redirecting us.
fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(open(path, DIR_FLAGS, Mode::empty())?)
}

fn openat_dir(dir: &OwnedFd, name: &CStr) -> io::Result<OwnedFd> {
    Ok(openat(dir, name, DIR_FLAGS, Mode::empty())?)
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

fn sysfs_dir(path_in_fs: &Path) -> io::Result<PathBuf> {
    Ok(Path::new("/sys/fs/btrfs").join(filesystem_id(path_in_fs)?))
}

fn read_sysfs_number(path: &Path) -> io::Result<u64> {
    let text = fs::read_to_string(path)?;
    text.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected content {text:?} in {}", path.display()),
        )
    })
}

/// Subvolumes nested anywhere below the subvolume at `path`, as (path, subvolume id). Anyone
/// who may write a directory can make a subvolume there, and its data is charged to its own
/// qgroup, not to the enclosing volume's: callers add it to the volume's usage.
/// GET_SUBVOL_ROOTREF lists the children of an fd's subvolume; INO_LOOKUP_USER names them.
pub fn nested_subvolumes(path: &Path) -> io::Result<Vec<(PathBuf, u64)>> {
    let mut found = Vec::new();
    let mut pending = vec![path.to_path_buf()];
    while let Some(parent) = pending.pop() {
        let fd = open_dir(&parent)?;
        for (treeid, dirid) in child_refs(&fd)? {
            let mut args = InoLookupUserArgs {
                dirid,
                treeid,
                name: [0; BTRFS_VOL_NAME_MAX + 1],
                path: [0; BTRFS_INO_LOOKUP_USER_PATH_MAX],
            };
            // SAFETY: a complete struct btrfs_ioctl_ino_lookup_user_args that outlives the call.
            unsafe { btrfs_ioc_ino_lookup_user(fd.as_raw_fd(), &mut args) }?;
            let child = parent.join(c_text(&args.path)?).join(c_text(&args.name)?);
            pending.push(child.clone());
            found.push((child, treeid));
        }
    }
    Ok(found)
}

/// (subvolume id, directory inode) of every subvolume directly inside the fd's subvolume.
fn child_refs(fd: &OwnedFd) -> io::Result<Vec<(u64, u64)>> {
    let mut refs = Vec::new();
    let mut args = Box::new(SubvolRootrefArgs {
        min_treeid: 0,
        rootref: [RootRef {
            treeid: 0,
            dirid: 0,
        }; BTRFS_MAX_ROOTREF_BUFFER_NUM],
        num_items: 0,
        align: [0; 7],
    });
    loop {
        args.num_items = 0;
        // SAFETY: a complete struct btrfs_ioctl_get_subvol_rootref_args that outlives the call.
        let result = unsafe { btrfs_ioc_get_subvol_rootref(fd.as_raw_fd(), &mut *args) };
        let items = &args.rootref[..usize::from(args.num_items).min(BTRFS_MAX_ROOTREF_BUFFER_NUM)];
        refs.extend(items.iter().map(|r| (r.treeid, r.dirid)));
        match result {
            Ok(_) => return Ok(refs),
            // More than one buffer's worth: the kernel moved min_treeid on; ask again.
            Err(nix::errno::Errno::EOVERFLOW) => continue,
            Err(errno) => return Err(errno.into()),
        }
    }
}

/// A NUL-terminated name the kernel filled in.
fn c_text(bytes: &[u8]) -> io::Result<&str> {
    CStr::from_bytes_until_nul(bytes)
        .ok()
        .and_then(|c| c.to_str().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unterminated name"))
}

/// Hand-written mirror of the parts of <linux/btrfs.h> we use, private so that the functions
/// nix's ioctl macros generate stay out of this module's API.
mod uapi {
    use nix::sys::ioctl::ioctl_num_type;

    const BTRFS_IOCTL_MAGIC: u8 = 0x94;
    pub const BTRFS_PATH_NAME_MAX: usize = 4087;
    pub const BTRFS_INO_LOOKUP_PATH_MAX: usize = 4080;
    pub const BTRFS_FIRST_FREE_OBJECTID: u64 = 256;
    pub const BTRFS_QUOTA_CTL_ENABLE: u64 = 1;
    pub const BTRFS_QGROUP_LIMIT_MAX_RFER: u64 = 1;
    /// A limit of (u64)-1 makes the kernel drop the limit rather than set it (qgroup.c).
    pub const QGROUP_CLEAR_VALUE: u64 = u64::MAX;

    /// struct btrfs_ioctl_vol_args
    #[repr(C)]
    pub struct VolArgs {
        pub fd: i64,
        pub name: [u8; BTRFS_PATH_NAME_MAX + 1],
    }

    impl VolArgs {
        /// `name` must be shorter than the buffer and free of NUL bytes (validate_name).
        pub fn named(name: &str) -> VolArgs {
            let mut args = VolArgs {
                fd: 0,
                name: [0; BTRFS_PATH_NAME_MAX + 1],
            };
            args.name[..name.len()].copy_from_slice(name.as_bytes());
            args
        }
    }

    /// struct btrfs_ioctl_ino_lookup_args
    pub const BTRFS_SUBVOL_NAME_MAX: usize = 4039;
    pub const BTRFS_SUBVOL_RDONLY: u64 = 1 << 1;

    #[repr(C)]
    pub struct VolArgsV2 {
        pub fd: i64,
        pub transid: u64,
        pub flags: u64,
        /// The size/qgroup_inherit union; unused (no qgroup inheritance asked for).
        pub unused: [u64; 4],
        pub name: [u8; BTRFS_SUBVOL_NAME_MAX + 1],
    }

    impl VolArgsV2 {
        pub fn named(name: &str) -> VolArgsV2 {
            let mut args = VolArgsV2 {
                fd: 0,
                transid: 0,
                flags: 0,
                unused: [0; 4],
                name: [0; BTRFS_SUBVOL_NAME_MAX + 1],
            };
            args.name[..name.len()].copy_from_slice(name.as_bytes());
            args
        }
    }

    #[repr(C)]
    pub struct InoLookupArgs {
        pub treeid: u64,
        pub objectid: u64,
        pub name: [u8; BTRFS_INO_LOOKUP_PATH_MAX],
    }

    /// struct btrfs_ioctl_fs_info_args
    #[repr(C)]
    #[allow(dead_code, reason = "filled in by the kernel; only fsid is read")]
    pub struct FsInfoArgs {
        pub max_id: u64,
        pub num_devices: u64,
        pub fsid: [u8; 16],
        pub nodesize: u32,
        pub sectorsize: u32,
        pub clone_alignment: u32,
        pub csum_type: u16,
        pub csum_size: u16,
        pub flags: u64,
        pub generation: u64,
        pub metadata_uuid: [u8; 16],
        pub reserved: [u8; 944],
    }

    impl FsInfoArgs {
        pub fn zeroed() -> FsInfoArgs {
            FsInfoArgs {
                max_id: 0,
                num_devices: 0,
                fsid: [0; 16],
                nodesize: 0,
                sectorsize: 0,
                clone_alignment: 0,
                csum_type: 0,
                csum_size: 0,
                flags: 0,
                generation: 0,
                metadata_uuid: [0; 16],
                reserved: [0; 944],
            }
        }
    }

    /// struct btrfs_ioctl_quota_ctl_args
    #[repr(C)]
    pub struct QuotaCtlArgs {
        pub cmd: u64,
        pub status: u64,
    }

    /// struct btrfs_ioctl_qgroup_create_args
    #[repr(C)]
    pub struct QgroupCreateArgs {
        pub create: u64,
        pub qgroupid: u64,
    }

    /// struct btrfs_qgroup_limit
    #[repr(C)]
    pub struct QgroupLimit {
        pub flags: u64,
        pub max_rfer: u64,
        pub max_excl: u64,
        pub rsv_rfer: u64,
        pub rsv_excl: u64,
    }

    /// struct btrfs_ioctl_qgroup_limit_args
    #[repr(C)]
    pub struct QgroupLimitArgs {
        pub qgroupid: u64,
        pub lim: QgroupLimit,
    }

    pub const BTRFS_MAX_ROOTREF_BUFFER_NUM: usize = 255;
    pub const BTRFS_VOL_NAME_MAX: usize = 255;
    pub const BTRFS_INO_LOOKUP_USER_PATH_MAX: usize = 4080 - BTRFS_VOL_NAME_MAX - 1;

    /// struct btrfs_ioctl_get_subvol_rootref_args's entries
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct RootRef {
        pub treeid: u64,
        pub dirid: u64,
    }

    /// struct btrfs_ioctl_get_subvol_rootref_args
    #[repr(C)]
    pub struct SubvolRootrefArgs {
        pub min_treeid: u64,
        pub rootref: [RootRef; BTRFS_MAX_ROOTREF_BUFFER_NUM],
        pub num_items: u8,
        pub align: [u8; 7],
    }

    /// struct btrfs_ioctl_ino_lookup_user_args
    #[repr(C)]
    pub struct InoLookupUserArgs {
        pub dirid: u64,
        pub treeid: u64,
        pub name: [u8; BTRFS_VOL_NAME_MAX + 1],
        pub path: [u8; BTRFS_INO_LOOKUP_USER_PATH_MAX],
    }

    pub const BTRFS_IOC_GET_SUBVOL_ROOTREF: ioctl_num_type =
        nix::request_code_readwrite!(BTRFS_IOCTL_MAGIC, 61, size_of::<SubvolRootrefArgs>());
    pub const BTRFS_IOC_INO_LOOKUP_USER: ioctl_num_type =
        nix::request_code_readwrite!(BTRFS_IOCTL_MAGIC, 62, size_of::<InoLookupUserArgs>());
    nix::ioctl_readwrite_bad!(
        btrfs_ioc_get_subvol_rootref,
        BTRFS_IOC_GET_SUBVOL_ROOTREF,
        SubvolRootrefArgs
    );
    nix::ioctl_readwrite_bad!(
        btrfs_ioc_ino_lookup_user,
        BTRFS_IOC_INO_LOOKUP_USER,
        InoLookupUserArgs
    );

    pub const BTRFS_IOC_SUBVOL_CREATE: ioctl_num_type =
        nix::request_code_write!(BTRFS_IOCTL_MAGIC, 14, size_of::<VolArgs>());
    pub const BTRFS_IOC_SNAP_DESTROY: ioctl_num_type =
        nix::request_code_write!(BTRFS_IOCTL_MAGIC, 15, size_of::<VolArgs>());
    pub const BTRFS_IOC_INO_LOOKUP: ioctl_num_type =
        nix::request_code_readwrite!(BTRFS_IOCTL_MAGIC, 18, size_of::<InoLookupArgs>());
    pub const BTRFS_IOC_FS_INFO: ioctl_num_type =
        nix::request_code_read!(BTRFS_IOCTL_MAGIC, 31, size_of::<FsInfoArgs>());
    pub const BTRFS_IOC_QUOTA_CTL: ioctl_num_type =
        nix::request_code_readwrite!(BTRFS_IOCTL_MAGIC, 40, size_of::<QuotaCtlArgs>());
    pub const BTRFS_IOC_QGROUP_CREATE: ioctl_num_type =
        nix::request_code_write!(BTRFS_IOCTL_MAGIC, 42, size_of::<QgroupCreateArgs>());
    /// Declared _IOR in the header although the kernel only reads the argument.
    pub const BTRFS_IOC_QGROUP_LIMIT: ioctl_num_type =
        nix::request_code_read!(BTRFS_IOCTL_MAGIC, 43, size_of::<QgroupLimitArgs>());
    pub const BTRFS_IOC_QUOTA_RESCAN_WAIT: ioctl_num_type =
        nix::request_code_none!(BTRFS_IOCTL_MAGIC, 46);

    pub const BTRFS_IOC_SUBVOL_GETFLAGS: ioctl_num_type =
        nix::request_code_read!(BTRFS_IOCTL_MAGIC, 25, size_of::<u64>());
    pub const BTRFS_IOC_SUBVOL_SETFLAGS: ioctl_num_type =
        nix::request_code_write!(BTRFS_IOCTL_MAGIC, 26, size_of::<u64>());
    nix::ioctl_read_bad!(btrfs_ioc_subvol_getflags, BTRFS_IOC_SUBVOL_GETFLAGS, u64);
    nix::ioctl_write_ptr_bad!(btrfs_ioc_subvol_setflags, BTRFS_IOC_SUBVOL_SETFLAGS, u64);

    pub const BTRFS_IOC_SNAP_CREATE_V2: ioctl_num_type =
        nix::request_code_write!(BTRFS_IOCTL_MAGIC, 23, size_of::<VolArgsV2>());
    nix::ioctl_write_ptr_bad!(
        btrfs_ioc_snap_create_v2,
        BTRFS_IOC_SNAP_CREATE_V2,
        VolArgsV2
    );
    nix::ioctl_write_ptr_bad!(btrfs_ioc_subvol_create, BTRFS_IOC_SUBVOL_CREATE, VolArgs);
    nix::ioctl_write_ptr_bad!(btrfs_ioc_snap_destroy, BTRFS_IOC_SNAP_DESTROY, VolArgs);
    nix::ioctl_readwrite_bad!(btrfs_ioc_ino_lookup, BTRFS_IOC_INO_LOOKUP, InoLookupArgs);
    nix::ioctl_read_bad!(btrfs_ioc_fs_info, BTRFS_IOC_FS_INFO, FsInfoArgs);
    nix::ioctl_readwrite_bad!(btrfs_ioc_quota_ctl, BTRFS_IOC_QUOTA_CTL, QuotaCtlArgs);
    nix::ioctl_write_ptr_bad!(
        btrfs_ioc_qgroup_create,
        BTRFS_IOC_QGROUP_CREATE,
        QgroupCreateArgs
    );
    nix::ioctl_read_bad!(
        btrfs_ioc_qgroup_limit,
        BTRFS_IOC_QGROUP_LIMIT,
        QgroupLimitArgs
    );
    nix::ioctl_none_bad!(btrfs_ioc_quota_rescan_wait, BTRFS_IOC_QUOTA_RESCAN_WAIT);
}

#[cfg(test)]
mod tests {
    use super::uapi::*;
    use super::*;
    use nix::sys::ioctl::ioctl_num_type;
    use std::mem::offset_of;

    #[test]
    fn struct_layouts_match_linux_btrfs_h() {
        // Expected values: sizeof/offsetof from a C program including <linux/btrfs.h>. All
        // fields are fixed-size and naturally aligned, so they hold on every architecture.
        assert_eq!(size_of::<VolArgsV2>(), 4096);
        assert_eq!(offset_of!(VolArgsV2, flags), 16);
        assert_eq!(offset_of!(VolArgsV2, name), 56);
        assert_eq!(size_of::<VolArgs>(), 4096);
        assert_eq!(offset_of!(VolArgs, name), 8);
        assert_eq!(size_of::<InoLookupArgs>(), 4096);
        assert_eq!(offset_of!(InoLookupArgs, objectid), 8);
        assert_eq!(offset_of!(InoLookupArgs, name), 16);
        assert_eq!(size_of::<FsInfoArgs>(), 1024);
        assert_eq!(offset_of!(FsInfoArgs, fsid), 16);
        assert_eq!(offset_of!(FsInfoArgs, csum_size), 46);
        assert_eq!(offset_of!(FsInfoArgs, flags), 48);
        assert_eq!(offset_of!(FsInfoArgs, metadata_uuid), 64);
        assert_eq!(size_of::<QuotaCtlArgs>(), 16);
        assert_eq!(size_of::<QgroupCreateArgs>(), 16);
        assert_eq!(size_of::<QgroupLimitArgs>(), 48);
        assert_eq!(offset_of!(QgroupLimitArgs, lim), 8);
        assert_eq!(
            offset_of!(QgroupLimitArgs, lim) + offset_of!(QgroupLimit, max_rfer),
            16
        );
        assert_eq!(align_of::<QgroupLimitArgs>(), 8);
    }

    #[test]
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn ioctl_numbers_match_linux_btrfs_h() {
        // Printed by a C program including <linux/btrfs.h> on x86_64 (aarch64 encodes alike).
        let expected: [(ioctl_num_type, ioctl_num_type); 13] = [
            (BTRFS_IOC_SUBVOL_GETFLAGS, 0x8008_9419),
            (BTRFS_IOC_SUBVOL_SETFLAGS, 0x4008_941A),
            (BTRFS_IOC_GET_SUBVOL_ROOTREF, 0xD000_943D),
            (BTRFS_IOC_INO_LOOKUP_USER, 0xD000_943E),
            (BTRFS_IOC_SUBVOL_CREATE, 0x5000_940E),
            (BTRFS_IOC_SNAP_DESTROY, 0x5000_940F),
            (BTRFS_IOC_SNAP_CREATE_V2, 0x5000_9417),
            (BTRFS_IOC_INO_LOOKUP, 0xD000_9412),
            (BTRFS_IOC_FS_INFO, 0x8400_941F),
            (BTRFS_IOC_QUOTA_CTL, 0xC010_9428),
            (BTRFS_IOC_QGROUP_CREATE, 0x4010_942A),
            (BTRFS_IOC_QGROUP_LIMIT, 0x8030_942B),
            (BTRFS_IOC_QUOTA_RESCAN_WAIT, 0x942E),
        ];
        for (i, (ours, theirs)) in expected.into_iter().enumerate() {
            assert_eq!(ours, theirs, "ioctl #{i}");
        }
    }

    #[test]
    fn nested_subvolume_structs_match_linux_btrfs_h() {
        // sizeof/offsetof printed by a C program including <linux/btrfs.h>.
        assert_eq!(size_of::<SubvolRootrefArgs>(), 4096);
        assert_eq!(offset_of!(SubvolRootrefArgs, rootref), 8);
        assert_eq!(offset_of!(SubvolRootrefArgs, num_items), 4088);
        assert_eq!(size_of::<InoLookupUserArgs>(), 4096);
        assert_eq!(offset_of!(InoLookupUserArgs, name), 16);
        assert_eq!(offset_of!(InoLookupUserArgs, path), 272);
    }

    #[test]
    fn constants_match_linux_btrfs_h() {
        assert_eq!(BTRFS_PATH_NAME_MAX, 4087);
        assert_eq!(BTRFS_INO_LOOKUP_PATH_MAX, 4080);
        assert_eq!(BTRFS_FIRST_FREE_OBJECTID, SUBVOLUME_ROOT_INODE);
        assert_eq!(BTRFS_SUBVOL_RDONLY, 2);
        assert_eq!(
            (BTRFS_QUOTA_CTL_ENABLE, BTRFS_QGROUP_LIMIT_MAX_RFER),
            (1, 1)
        );
    }

    #[test]
    fn names_are_single_directory_entries() {
        for good in ["a", "pvc-1", "...", ".hidden", &"x".repeat(NAME_MAX)] {
            assert!(validate_name(good).is_ok(), "{good:?}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "/a",
            "a/",
            "a\0b",
            &"x".repeat(NAME_MAX + 1),
        ] {
            let err = validate_name(bad).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
    }

    #[test]
    fn vol_args_carry_a_nul_terminated_name() {
        let args = VolArgs::named(&"n".repeat(NAME_MAX));
        assert_eq!(args.fd, 0);
        assert!(args.name[..NAME_MAX].iter().all(|&b| b == b'n'));
        assert!(args.name[NAME_MAX..].iter().all(|&b| b == 0));
    }

    #[test]
    fn limits_that_mean_something_else_are_refused() {
        // Checked before any file is opened, so the path does not matter.
        let nowhere = Path::new("/nonexistent");
        for bad in [0, u64::MAX] {
            let err = set_limit(nowhere, bad).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad}");
        }
    }

    #[test]
    fn plain_directories_and_symlinks_are_not_subvolumes() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_subvolume(dir.path()).unwrap());
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/", &link).unwrap();
        assert!(!is_subvolume(&link).unwrap());
        assert_eq!(
            is_subvolume(&dir.path().join("missing"))
                .unwrap_err()
                .kind(),
            io::ErrorKind::NotFound
        );
    }
}
