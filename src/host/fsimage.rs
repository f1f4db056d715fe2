//! Filesystems inside image files: making one (mkfs), checking one (fsck, before an imported
//! image is first mounted), mounting it from a loop device, growing it while mounted, freezing
//! it for a consistent copy, and asking it whether it saw errors.
//!
//! The mkfs, check and grow tools are run as child processes (e2fsprogs, xfsprogs): their on-disk
//! formats are theirs to know. Everything else is a system call.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};
use sys_mount::MountFlags;

/// The filesystems an image volume may hold (the StorageClass key `csi.storage.k8s.io/fstype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsType {
    Ext4,
    Xfs,
}

/// mkfs.xfs refuses filesystems below 300 MiB (xfsprogs 5.19 and later).
const XFS_MIN_BYTES: u64 = 300 << 20;
/// Below this an ext4 journal leaves little room for data.
const EXT4_MIN_BYTES: u64 = 16 << 20;

impl FsType {
    pub const ALL: [FsType; 2] = [FsType::Ext4, FsType::Xfs];

    /// The name mount(2), mkfs and Kubernetes use.
    pub fn name(self) -> &'static str {
        match self {
            FsType::Ext4 => "ext4",
            FsType::Xfs => "xfs",
        }
    }

    pub fn parse(name: &str) -> Option<FsType> {
        FsType::ALL.into_iter().find(|fs| fs.name() == name)
    }

    /// The smallest image this filesystem can be made in.
    pub fn min_bytes(self) -> u64 {
        match self {
            FsType::Ext4 => EXT4_MIN_BYTES,
            FsType::Xfs => XFS_MIN_BYTES,
        }
    }

    /// The programs making and growing this filesystem needs.
    pub fn tools(self) -> &'static [&'static str] {
        match self {
            FsType::Ext4 => &["mkfs.ext4", "resize2fs"],
            FsType::Xfs => &["mkfs.xfs", "xfs_growfs"],
        }
    }

    /// The first of `tools()` this host lacks, if any.
    pub fn missing_tool(self) -> Option<&'static str> {
        self.tools()
            .iter()
            .copied()
            .find(|tool| find_tool(tool).is_none())
    }
}

/// Where `tool` is on PATH (the image's PATH has the sbin directories).
pub fn find_tool(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(tool))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Makes filesystem `fs` in the image file `image`, which must be new (all zeroes, sparse).
///
/// Nothing is discarded or zeroed: the file reads as zeroes already, and writing them would
/// allocate the whole image (ext4's inode tables would otherwise be zeroed by the kernel in
/// the background after the first mount, allocating ~1.6 % of the image). Neither tool is
/// forced: both refuse to overwrite a filesystem they find, a last guard against formatting
/// data.
///
/// Blocks and sectors are 4 KiB whatever the image's size: a loop device with direct I/O takes
/// the backing file's direct-I/O alignment as its logical block size, which XFS raises to its
/// block size once a file shares extents (a snapshot's reflink), and a filesystem with smaller
/// blocks (mkfs.ext4 picks 1 KiB below 512 MiB) would then no longer mount ("bad block size").
pub fn format(image: &Path, fs: FsType) -> io::Result<()> {
    let args: &[&str] = match fs {
        // -m 0: the claim's size is the pod's, with no blocks kept for root; no journal
        // zeroing and no inode tables to initialise on a prezeroed file.
        FsType::Ext4 => &[
            "-q",
            "-b",
            "4096",
            "-m",
            "0",
            "-E",
            "nodiscard,lazy_itable_init=1,lazy_journal_init=1,assume_storage_prezeroed=1",
        ],
        // -K: no discard.
        FsType::Xfs => &["-q", "-K", "-s", "size=4096"],
    };
    let program = match fs {
        FsType::Ext4 => "mkfs.ext4",
        FsType::Xfs => "mkfs.xfs",
    };
    run(
        program,
        args.iter().map(OsStr::new).chain([image.as_os_str()]),
    )
}

/// Grows the filesystem mounted at `mount_point` from `device` to the device's size.
/// ext4 grows online through an ioctl the kernel allows only with CAP_SYS_RESOURCE: without
/// it this says so (PermissionDenied) rather than resize2fs's bare "Permission denied".
pub fn grow(fs: FsType, device: &Path, mount_point: &Path) -> io::Result<()> {
    match fs {
        FsType::Ext4 if !has_sys_resource() => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "growing a mounted ext4 needs CAP_SYS_RESOURCE, which this process lacks (run the node plugin privileged)",
        )),
        FsType::Ext4 => run("resize2fs", [device.as_os_str()]),
        FsType::Xfs => run("xfs_growfs", [OsStr::new("-d"), mount_point.as_os_str()]),
    }
}

/// Whether filesystem `fs` on `device` is smaller than the device, from its superblock (ext4:
/// `s_blocks_count` and `s_log_block_size`; XFS: `sb_dblocks` and `sb_blocksize`): what decides
/// whether a stage has growing to do, without running a tool for nothing.
pub fn smaller_than_device(fs: FsType, device: &Path) -> io::Result<bool> {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::FileExt;
    let mut file = std::fs::File::open(device)?;
    let device_bytes = file.seek(SeekFrom::End(0))?;
    let fs_bytes = match fs {
        FsType::Ext4 => {
            let mut sb = [0u8; 1024];
            file.read_exact_at(&mut sb, 1024)?;
            let word = |at: usize| u32::from_le_bytes(sb[at..at + 4].try_into().unwrap());
            // The high half counts only with the 64bit feature (incompat 0x80).
            let high = if word(0x60) & 0x80 != 0 {
                word(0x150)
            } else {
                0
            };
            let blocks = u64::from(word(0x4)) | (u64::from(high) << 32);
            blocks << (10 + word(0x18).min(6))
        }
        FsType::Xfs => {
            let mut sb = [0u8; 16];
            file.read_exact_at(&mut sb, 0)?;
            let block = u32::from_be_bytes(sb[4..8].try_into().unwrap());
            let blocks = u64::from_be_bytes(sb[8..16].try_into().unwrap());
            blocks.saturating_mul(u64::from(block))
        }
    };
    Ok(fs_bytes < device_bytes)
}

/// Checks the filesystem `fs` in the image file `image` with its own checker, changing
/// nothing (`e2fsck -n -f`, `xfs_repair -n -f`): an error names what the checker found. Run on
/// bytes the kernel has not mounted yet (an imported image), in user space, where a crafted
/// filesystem can only fail the check.
pub fn check(fs: FsType, image: &Path) -> io::Result<()> {
    let (program, args): (&str, &[&str]) = match fs {
        FsType::Ext4 => ("e2fsck", &["-n", "-f"]),
        FsType::Xfs => ("xfs_repair", &["-n", "-f"]),
    };
    run(
        program,
        args.iter().map(OsStr::new).chain([image.as_os_str()]),
    )
}

/// Whether this process has CAP_SYS_RESOURCE in its effective set (/proc/self/status).
pub fn has_sys_resource() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

/// Runs `program` with `args`, its output captured: a failure carries what it printed.
fn run<'a>(program: &str, args: impl IntoIterator<Item = &'a OsStr>) -> io::Result<()> {
    let path = find_tool(program).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{program} is not installed on this node"),
        )
    })?;
    let output = Command::new(&path)
        .args(args)
        .stdin(Stdio::null())
        .env("LC_ALL", "C")
        .output()?;
    if output.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&output.stderr);
    let said = said.trim();
    let said = if said.is_empty() {
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    } else {
        said.to_string()
    };
    Err(io::Error::other(format!(
        "{program} failed ({}): {}",
        output.status,
        said.chars().take(2000).collect::<String>()
    )))
}

/// Mounts filesystem `fs` of `device` on the directory `target` (an open descriptor: the
/// mount lands on that very directory, whatever its path has become).
///
/// XFS refuses a second filesystem with the UUID of one already mounted, and a snapshot's
/// restore or a clone is a copy of the image, UUID and all: `nouuid` lets a volume and its
/// copies be used side by side (ext4 does not check).
pub fn mount(
    device: &Path,
    fs: FsType,
    target: BorrowedFd<'_>,
    flags: MountFlags,
) -> io::Result<()> {
    let on = super::dirfd::fd_path(target);
    let flags = nix::mount::MsFlags::from_bits_truncate(flags.bits() as libc::c_ulong);
    let options = match fs {
        FsType::Ext4 => None,
        FsType::Xfs => Some("nouuid"),
    };
    nix::mount::mount(Some(device), &on, Some(fs.name()), flags, options)?;
    Ok(())
}

// _IOWR('X', 119, int) and _IOWR('X', 120, int) from linux/fs.h.
const FIFREEZE: libc::c_ulong = 0xC004_5877;
const FITHAW: libc::c_ulong = 0xC004_5878;

/// Freezes the filesystem whose mount root `root` is: writes block and everything written
/// so far is on the device, until `thaw`. Errors with EBUSY if it is frozen already.
pub fn freeze(root: BorrowedFd<'_>) -> io::Result<()> {
    fs_ioctl(root, FIFREEZE)
}

pub fn thaw(root: BorrowedFd<'_>) -> io::Result<()> {
    fs_ioctl(root, FITHAW)
}

/// A filesystem frozen for as long as this lives: dropped, it thaws, on every way out of the
/// frozen work, a panic included (a filesystem left frozen hangs every writer of it until
/// someone runs `fsfreeze -u`). `thaw` says whether the thaw worked; a drop can only log.
#[derive(Debug)]
pub struct Frozen {
    root: std::fs::File,
    thawed: bool,
}

impl Frozen {
    /// Freezes the filesystem whose mount root `root` is (a real descriptor, not O_PATH:
    /// FIFREEZE is an ioctl on it).
    pub fn freeze(root: std::fs::File) -> io::Result<Frozen> {
        freeze(root.as_fd())?;
        Ok(Frozen {
            root,
            thawed: false,
        })
    }

    pub fn thaw(mut self) -> io::Result<()> {
        self.thawed = true;
        thaw(self.root.as_fd())
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if !self.thawed
            && let Err(err) = thaw(self.root.as_fd())
        {
            tracing::error!(error = %err, "could not thaw a filesystem frozen for a copy that did not finish; its writers are blocked until `fsfreeze -u` is run on the node or the driver restarts");
        }
    }
}

fn fs_ioctl(root: BorrowedFd<'_>, request: libc::c_ulong) -> io::Result<()> {
    let mut unused: libc::c_int = 0;
    // SAFETY: FIFREEZE/FITHAW take a pointer to an int they ignore; the fd is open.
    let rc = unsafe { libc::ioctl(root.as_raw_fd(), request, &mut unused) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Errors the filesystem on block device `device` (e.g. "loop7") recorded since it was
/// mounted, where the kernel tells (ext4's errors_count); None where it does not.
pub fn error_count(fs: FsType, device: &str) -> Option<u64> {
    match fs {
        FsType::Ext4 => std::fs::read_to_string(format!("/sys/fs/ext4/{device}/errors_count"))
            .ok()?
            .trim()
            .parse()
            .ok(),
        // XFS shuts down on metadata corruption: statfs then fails with EIO, which stats sees.
        FsType::Xfs => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_superblock_says_whether_the_image_grew_past_its_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        for fs in FsType::ALL {
            let image = dir.path().join(fs.name());
            let file = std::fs::File::create(&image).unwrap();
            file.set_len(fs.min_bytes()).unwrap();
            format(&image, fs).unwrap();
            assert!(!smaller_than_device(fs, &image).unwrap(), "{}", fs.name());
            file.set_len(fs.min_bytes() + (16 << 20)).unwrap();
            assert!(smaller_than_device(fs, &image).unwrap(), "{}", fs.name());
        }
    }

    #[test]
    fn names_round_trip_and_nothing_else_parses() {
        for fs in FsType::ALL {
            assert_eq!(FsType::parse(fs.name()), Some(fs));
        }
        for other in ["", "EXT4", "ext3", "btrfs", "xfs ", "vfat"] {
            assert_eq!(FsType::parse(other), None, "{other:?}");
        }
    }
}
