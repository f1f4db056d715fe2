//! Loop block devices, driven directly through the kernel's ioctl interface.
//!
//! A volume is a regular file exposed as a block device. Attaching uses one `LOOP_CONFIGURE`
//! call (atomic, unlike the older `LOOP_SET_FD` + `LOOP_SET_STATUS64` pair), and the read-only
//! queries go through sysfs so they never need to open (and thereby hold) the device — except
//! [`backing_file_id`], which only LOOP_GET_STATUS64 answers.
//!
//! Loop devices are kernel-wide, mount namespaces are not: every process on the kernel sees every
//! device, and each device's backing path as it reads in the namespace that holds the file. Two
//! nodes of a test cluster on one kernel (every multi-node kind cluster) keep their files at the
//! same paths, so a path never proves a device is ours; the backing file's identity does.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::stat::{Mode, SFlag, makedev, mknod};

use super::fsstat::{self, FileId};
use uapi::{LO_FLAGS_DIRECT_IO, LO_FLAGS_READ_ONLY, LoopConfig, LoopInfo64};

const LOOP_CONTROL: &str = "/dev/loop-control";

/// How many free devices `attach` tries before giving up when other processes keep taking
/// the device it was offered.
const MAX_ATTACH_ATTEMPTS: usize = 16;

/// The sysfs block layer always counts sizes in 512-byte sectors, whatever the block size.
const SYSFS_SECTOR_SIZE: u64 = 512;

/// A loop block device such as /dev/loop7.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LoopDevice {
    /// Always "loop" followed by the device number without leading zeros, as the kernel names it.
    name: String,
}

impl LoopDevice {
    /// Accepts only kernel-style names ("loop" + digits). Leading zeros are refused because the
    /// kernel never produces them, so "loop07" could only ever refer to a nonexistent device.
    pub fn from_name(name: &str) -> Option<LoopDevice> {
        let digits = name.strip_prefix("loop")?;
        let canonical = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'))
            && digits.parse::<u32>().is_ok();
        canonical.then(|| LoopDevice {
            name: name.to_owned(),
        })
    }

    /// Accepts only "/dev/loop" + digits, compared textually: other spellings of the same
    /// path are not what the kernel or kubelet hand us.
    pub fn from_path(path: &Path) -> Option<LoopDevice> {
        let name = path.to_str()?.strip_prefix("/dev/")?;
        LoopDevice::from_name(name)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> PathBuf {
        Path::new("/dev").join(&self.name)
    }

    fn from_number(number: u32) -> LoopDevice {
        LoopDevice {
            name: format!("loop{number}"),
        }
    }

    fn number(&self) -> u32 {
        self.name["loop".len()..]
            .parse()
            .expect("LoopDevice names are validated on construction")
    }

    fn sysfs_attribute(&self, attribute: &str) -> PathBuf {
        Path::new("/sys/block").join(&self.name).join(attribute)
    }
}

/// Attach `backing_file` to a free loop device: /dev/loop-control LOOP_CTL_GET_FREE, then one
/// LOOP_CONFIGURE with LO_FLAGS_DIRECT_IO (and LO_FLAGS_READ_ONLY when `read_only`, the file
/// then being opened O_RDONLY).
///
/// Direct I/O keeps the backing file's data out of the page cache a second time (the loop
/// device has its own). A kernel that cannot use direct I/O for the file either drops it
/// silently (see [`uses_direct_io`]) or refuses with EINVAL; then we retry once buffered.
/// EBUSY means another process configured the device between GET_FREE and CONFIGURE, so we
/// ask for another one, a bounded number of times. LO_FLAGS_AUTOCLEAR is never set: the
/// device must outlive this process, because the driver may restart while the volume stays
/// mounted.
pub fn attach(backing_file: &Path, read_only: bool) -> io::Result<LoopDevice> {
    let backing = OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(backing_file)?;
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open(LOOP_CONTROL)?;
    let mut flags = LO_FLAGS_DIRECT_IO;
    if read_only {
        flags |= LO_FLAGS_READ_ONLY;
    }
    retry_attach(flags, |flags| {
        let dev = free_device(&control)?;
        ensure_device_node(&dev)?;
        let device = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(dev.path())?;
        configure(&device, &backing, flags)?;
        Ok(dev)
    })
}

/// The retry policy of [`attach`], kept apart from the ioctls so tests can play the kernel.
/// `attach_once` grabs a free device and configures it with the given flags.
fn retry_attach(
    mut flags: u32,
    mut attach_once: impl FnMut(u32) -> io::Result<LoopDevice>,
) -> io::Result<LoopDevice> {
    for _ in 0..MAX_ATTACH_ATTEMPTS {
        match attach_once(flags) {
            // Someone else configured the device we were offered; ask for another one.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            // Direct I/O refused; buffered I/O is slower but works on any file system.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && flags & LO_FLAGS_DIRECT_IO != 0 => {
                flags &= !LO_FLAGS_DIRECT_IO;
            }
            result => return result,
        }
    }
    Err(io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!("every free loop device was taken by someone else ({MAX_ATTACH_ATTEMPTS} tries)"),
    ))
}

/// The backing file of a device from /sys/block/<name>/loop/backing_file, None when the device
/// has none (not attached, or the device does not exist at all).
///
/// The path is returned as the kernel prints it minus the trailing newline, so a backing file
/// that was deleted while attached keeps the kernel's " (deleted)" suffix.
pub fn backing_file(dev: &LoopDevice) -> io::Result<Option<PathBuf>> {
    let mut printed = match fs::read(dev.sysfs_attribute("loop/backing_file")) {
        Ok(bytes) => bytes,
        Err(e) if detached_meanwhile(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    if printed.last() == Some(&b'\n') {
        printed.pop();
    }
    Ok(Some(PathBuf::from(std::ffi::OsStr::from_bytes(&printed))))
}

/// Whether reading a device's `loop/` attribute failed because the device is not (or no longer)
/// attached: the attribute is missing (NotFound), or the detach removed it between our open and
/// read (sysfs then answers ENODEV). Seen with concurrent block unpublishes.
fn detached_meanwhile(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::NotFound || err.raw_os_error() == Some(libc::ENODEV)
}

/// All attached loop devices with their backing files (scan /sys/block/loop*), ordered by
/// device number.
pub fn list_attached() -> io::Result<Vec<(LoopDevice, PathBuf)>> {
    let mut attached = Vec::new();
    for entry in fs::read_dir("/sys/block")? {
        let entry = entry?;
        let Some(dev) = entry.file_name().to_str().and_then(LoopDevice::from_name) else {
            continue;
        };
        // A device detached after read_dir saw it simply reports no backing file.
        if let Some(file) = backing_file(&dev)? {
            attached.push((dev, file));
        }
    }
    attached.sort_by_key(|(dev, _)| dev.number());
    Ok(attached)
}

/// Devices attached to the very file `file` names (symlinks followed), by identity: see
/// [`backing_file_id`]. Only devices whose backing path ends in the same file name are asked
/// (the directories may differ: the kernel prints the path as it reads in the namespace that
/// holds the file, e.g. a driver container's view before a restart). Fails if `file` does not
/// exist: a device over a deleted file cannot be told apart from another namespace's.
pub fn find_by_backing_file(file: &Path) -> io::Result<Vec<LoopDevice>> {
    let wanted = fsstat::file_id(file)?;
    let name = fsstat::canonical(file)?.file_name().map(ToOwned::to_owned);
    let mut found = Vec::new();
    for (dev, backing) in list_attached()? {
        if backing.file_name() == name.as_deref() && backing_file_id(&dev)? == Some(wanted) {
            found.push(dev);
        }
    }
    Ok(found)
}

/// Whether `dev` is attached to the very file `file` names (symlinks followed), by identity.
/// False when either is gone.
pub fn is_attached_to(dev: &LoopDevice, file: &Path) -> io::Result<bool> {
    let Some(backing) = backing_file_id(dev)? else {
        return Ok(false);
    };
    match fsstat::file_id(file) {
        Ok(id) => Ok(id == backing),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Which file backs `dev`: LOOP_GET_STATUS64 has the kernel stat the file it holds (`lo_device`,
/// `lo_inode`); None when `dev` is not attached (or does not exist).
///
/// Compare it with [`fsstat::file_id`] of a file of ours, never [`backing_file`] with its path:
/// another mount namespace on this kernel may hold a different file at the same path (two
/// nodes of a test cluster on one kernel), and its device must never be taken for ours.
pub fn backing_file_id(dev: &LoopDevice) -> io::Result<Option<FileId>> {
    let device = match open_for_control(dev) {
        Ok(device) => device,
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut info = LoopInfo64::with_flags(0);
    // SAFETY: `info` is a writable struct loop_info64 that outlives the call; the fd is a valid
    // open loop device.
    match unsafe { uapi::loop_get_status64(device.as_raw_fd(), &mut info) } {
        Ok(_) => Ok(Some(FileId {
            dev: decode_dev(info.lo_device),
            ino: info.lo_inode,
        })),
        Err(Errno::ENXIO) => Ok(None),
        Err(errno) => Err(errno.into()),
    }
}

/// (major, minor) of a device number as LOOP_GET_STATUS64 encodes it: the kernel's
/// `huge_encode_dev`, which is `new_encode_dev` (minor's low 8 bits, then the 12-bit major, then
/// the minor's upper 12 bits), the same as stat(2)'s `st_dev` on 64-bit. statx, which
/// [`fsstat`] uses, gives major and minor apart, so we decode rather than compare encodings.
fn decode_dev(encoded: u64) -> (u32, u32) {
    let major = (encoded & 0xf_ff00) >> 8;
    let minor = (encoded & 0xff) | ((encoded >> 12) & 0xf_ff00);
    // Both fit: masked to 12 and 20 bits.
    (major as u32, minor as u32)
}

/// /sys/block/<name>/ro
pub fn is_read_only(dev: &LoopDevice) -> io::Result<bool> {
    Ok(read_sysfs_number(&dev.sysfs_attribute("ro"))? != 0)
}

/// /sys/block/<name>/loop/dio. Fails with NotFound when the device is not attached.
pub fn uses_direct_io(dev: &LoopDevice) -> io::Result<bool> {
    Ok(read_sysfs_number(&dev.sysfs_attribute("loop/dio"))? != 0)
}

/// Size in bytes the device currently exposes (/sys/block/<name>/size * 512).
pub fn size_bytes(dev: &LoopDevice) -> io::Result<u64> {
    Ok(read_sysfs_number(&dev.sysfs_attribute("size"))? * SYSFS_SECTOR_SIZE)
}

/// The device's number (major, minor), as a filesystem mounted from it reports its st_dev.
pub fn device_number(dev: &LoopDevice) -> io::Result<(u32, u32)> {
    let text = std::fs::read_to_string(dev.sysfs_attribute("dev"))?;
    let invalid = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: dev {text:?}", dev.name),
        )
    };
    let (major, minor) = text.trim().split_once(':').ok_or_else(invalid)?;
    Ok((
        major.parse().map_err(|_| invalid())?,
        minor.parse().map_err(|_| invalid())?,
    ))
}

/// Tell the device its backing file changed size (LOOP_SET_CAPACITY); the kernel does not
/// notice on its own.
pub fn refresh_capacity(dev: &LoopDevice) -> io::Result<()> {
    let device = open_for_control(dev)?;
    // SAFETY: LOOP_SET_CAPACITY takes no argument; the fd is a valid open loop device.
    unsafe { uapi::loop_set_capacity(device.as_raw_fd()) }?;
    Ok(())
}

/// LOOP_CLR_FD. A device that is not attached (ENXIO) counts as success, so callers can
/// retry freely.
///
/// While anyone else still has the device open (a mounted file system, for instance) the
/// kernel only marks it for clearing and detaches it on the last close; this still returns Ok.
pub fn detach(dev: &LoopDevice) -> io::Result<()> {
    let device = match open_for_control(dev) {
        Ok(device) => device,
        // The kernel has no such device, so it is certainly not attached.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Ok(()),
        Err(e) => return Err(e),
    };
    // SAFETY: LOOP_CLR_FD takes no argument; the fd is a valid open loop device.
    match unsafe { uapi::loop_clr_fd(device.as_raw_fd()) } {
        Ok(_) | Err(Errno::ENXIO) => Ok(()),
        Err(errno) => Err(errno.into()),
    }
}

fn free_device(control: &File) -> io::Result<LoopDevice> {
    // SAFETY: LOOP_CTL_GET_FREE takes no argument; the fd is /dev/loop-control.
    let number = unsafe { uapi::loop_ctl_get_free(control.as_raw_fd()) }?;
    // A successful ioctl never returns a negative device number.
    Ok(LoopDevice::from_number(number as u32))
}

fn configure(device: &File, backing: &File, flags: u32) -> io::Result<()> {
    let config = LoopConfig {
        // Open file descriptors are never negative.
        fd: backing.as_raw_fd() as u32,
        // 0 lets the kernel pick: the backing file system's block size when using direct I/O.
        block_size: 0,
        info: LoopInfo64::with_flags(flags),
        reserved: [0; 8],
    };
    // SAFETY: `config` is a fully initialised struct loop_config that outlives the call, and
    // the kernel only reads it.
    unsafe { uapi::loop_configure(device.as_raw_fd(), &config) }?;
    Ok(())
}

/// Opens the device read-only: enough for root to clear or resize it, and it also works
/// on devices attached read-only, which refuse to be opened for writing.
fn open_for_control(dev: &LoopDevice) -> io::Result<File> {
    ensure_device_node(dev)?;
    File::open(dev.path())
}

/// The kernel creates the device node in devtmpfs, but a container with a static /dev never
/// sees nodes for loop devices created after it started, so we make the node ourselves.
fn ensure_device_node(dev: &LoopDevice) -> io::Result<()> {
    let path = dev.path();
    if path.try_exists()? {
        return Ok(());
    }
    create_device_node(dev, &path)
}

/// Creates a block special file for `dev` at `at`, using the numbers sysfs reports rather than
/// assuming minor = N, which is wrong when the loop module was loaded with max_part > 0.
/// Losing a race with another creator is fine.
fn create_device_node(dev: &LoopDevice, at: &Path) -> io::Result<()> {
    let (major, minor) = device_numbers(dev)?;
    match mknod(
        at,
        SFlag::S_IFBLK,
        Mode::from_bits_truncate(0o600),
        makedev(major, minor),
    ) {
        Ok(()) | Err(Errno::EEXIST) => Ok(()),
        Err(errno) => Err(errno.into()),
    }
}

/// Major and minor number from /sys/block/<name>/dev, which reads like "7:3\n". A device the
/// kernel does not know fails with ENXIO, as opening its node would.
fn device_numbers(dev: &LoopDevice) -> io::Result<(u64, u64)> {
    let path = dev.sysfs_attribute("dev");
    let text = fs::read_to_string(&path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => io::Error::from_raw_os_error(libc::ENXIO),
        _ => e,
    })?;
    text.trim()
        .split_once(':')
        .and_then(|(major, minor)| Some((major.parse().ok()?, minor.parse().ok()?)))
        .ok_or_else(|| invalid_sysfs_data(&path, &text))
}

fn read_sysfs_number(path: &Path) -> io::Result<u64> {
    let text = fs::read_to_string(path)?;
    text.trim()
        .parse()
        .map_err(|_| invalid_sysfs_data(path, &text))
}

fn invalid_sysfs_data(path: &Path, text: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unexpected content {text:?} in {}", path.display()),
    )
}

/// Hand-written mirror of the parts of <linux/loop.h> we use. Kept in a private module so the
/// `pub` functions generated by nix's ioctl macros do not leak into this module's API.
mod uapi {
    pub const LO_FLAGS_READ_ONLY: u32 = 1;
    /// Only referenced by tests: we never set it, but its value is part of the checked ABI.
    #[cfg(test)]
    pub const LO_FLAGS_AUTOCLEAR: u32 = 4;
    pub const LO_FLAGS_DIRECT_IO: u32 = 16;

    const LO_NAME_SIZE: usize = 64;
    const LO_KEY_SIZE: usize = 32;

    pub const LOOP_CLR_FD: u32 = 0x4C01;
    pub const LOOP_GET_STATUS64: u32 = 0x4C05;
    pub const LOOP_SET_CAPACITY: u32 = 0x4C07;
    pub const LOOP_CONFIGURE: u32 = 0x4C0A;
    pub const LOOP_CTL_GET_FREE: u32 = 0x4C82;

    /// struct loop_info64. Only `lo_flags` is set by us; LOOP_GET_STATUS64 fills it in, and we
    /// read `lo_device` and `lo_inode` of it.
    #[repr(C)]
    #[allow(dead_code, reason = "most fields are only read by the kernel")]
    pub struct LoopInfo64 {
        pub lo_device: u64,
        pub lo_inode: u64,
        pub lo_rdevice: u64,
        pub lo_offset: u64,
        pub lo_sizelimit: u64,
        pub lo_number: u32,
        pub lo_encrypt_type: u32,
        pub lo_encrypt_key_size: u32,
        pub lo_flags: u32,
        pub lo_file_name: [u8; LO_NAME_SIZE],
        pub lo_crypt_name: [u8; LO_NAME_SIZE],
        pub lo_encrypt_key: [u8; LO_KEY_SIZE],
        pub lo_init: [u64; 2],
    }

    impl LoopInfo64 {
        pub fn with_flags(lo_flags: u32) -> LoopInfo64 {
            LoopInfo64 {
                lo_device: 0,
                lo_inode: 0,
                lo_rdevice: 0,
                lo_offset: 0,
                lo_sizelimit: 0,
                lo_number: 0,
                lo_encrypt_type: 0,
                lo_encrypt_key_size: 0,
                lo_flags,
                lo_file_name: [0; LO_NAME_SIZE],
                lo_crypt_name: [0; LO_NAME_SIZE],
                lo_encrypt_key: [0; LO_KEY_SIZE],
                lo_init: [0; 2],
            }
        }
    }

    /// struct loop_config, the argument of LOOP_CONFIGURE.
    #[repr(C)]
    #[allow(dead_code, reason = "fields are read by the kernel, not by Rust")]
    pub struct LoopConfig {
        pub fd: u32,
        pub block_size: u32,
        pub info: LoopInfo64,
        pub reserved: [u64; 8],
    }

    nix::ioctl_none_bad!(loop_clr_fd, LOOP_CLR_FD);
    nix::ioctl_none_bad!(loop_set_capacity, LOOP_SET_CAPACITY);
    nix::ioctl_read_bad!(loop_get_status64, LOOP_GET_STATUS64, LoopInfo64);
    nix::ioctl_write_ptr_bad!(loop_configure, LOOP_CONFIGURE, LoopConfig);
    nix::ioctl_none_bad!(loop_ctl_get_free, LOOP_CTL_GET_FREE);
}

#[cfg(test)]
mod tests {
    use super::uapi::*;
    use super::*;
    use std::collections::HashSet;
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::mem::{offset_of, size_of};
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    use std::sync::{Arc, Barrier};
    use std::time::Instant;
    use tempfile::TempDir;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn struct_layouts_match_linux_loop_h() {
        // Expected values: sizeof/offsetof from a C program including <linux/loop.h>. Every
        // field is fixed-size and naturally aligned, so they hold on all architectures.
        assert_eq!(size_of::<LoopInfo64>(), 232);
        assert_eq!(offset_of!(LoopInfo64, lo_device), 0);
        assert_eq!(offset_of!(LoopInfo64, lo_inode), 8);
        assert_eq!(offset_of!(LoopInfo64, lo_flags), 52);
        assert_eq!(offset_of!(LoopInfo64, lo_file_name), 56);
        assert_eq!(offset_of!(LoopInfo64, lo_init), 216);
        assert_eq!(size_of::<LoopConfig>(), 304);
        assert_eq!(offset_of!(LoopConfig, block_size), 4);
        assert_eq!(offset_of!(LoopConfig, info), 8);
        assert_eq!(offset_of!(LoopConfig, reserved), 240);
    }

    #[test]
    fn ioctl_numbers_are_io_l_requests() {
        // <linux/loop.h> spells these as plain numbers; they are _IO('L', nr).
        use nix::sys::ioctl::ioctl_num_type;
        let io_l = |nr: u32| nix::request_code_none!(b'L', nr);
        assert_eq!(LOOP_CLR_FD as ioctl_num_type, io_l(0x01));
        assert_eq!(LOOP_GET_STATUS64 as ioctl_num_type, io_l(0x05));
        assert_eq!(LOOP_SET_CAPACITY as ioctl_num_type, io_l(0x07));
        assert_eq!(LOOP_CONFIGURE as ioctl_num_type, io_l(0x0A));
        assert_eq!(LOOP_CTL_GET_FREE as ioctl_num_type, io_l(0x82));
        assert_eq!(
            (
                LOOP_CLR_FD,
                LOOP_GET_STATUS64,
                LOOP_SET_CAPACITY,
                LOOP_CONFIGURE,
                LOOP_CTL_GET_FREE
            ),
            (0x4C01, 0x4C05, 0x4C07, 0x4C0A, 0x4C82)
        );
    }

    #[test]
    fn device_numbers_decode_as_the_kernel_encodes_them() {
        // The kernel's new_encode_dev: (minor & 0xff) | (major << 8) | ((minor & ~0xff) << 12).
        assert_eq!(decode_dev(0xfe00), (254, 0));
        assert_eq!(decode_dev(0x0803), (8, 3));
        // tmpfs and btrfs subvolumes get anonymous devices: major 0, minors past 255.
        assert_eq!(decode_dev(0x1230_0045), (0, 0x12345));
        assert_eq!(decode_dev(0x0010_3f42), (0x3f, 0x142));
        // The largest the kernel has: a 12-bit major, a 20-bit minor.
        assert_eq!(decode_dev(0xffff_ffff), (0xfff, 0xf_ffff));
        // Every (major, minor) round-trips through glibc's encoding (stat(2)'s st_dev).
        for (major, minor) in [(0, 0), (7, 3), (259, 0x1_0001), (0xfff, 0xf_ffff)] {
            assert_eq!(decode_dev(libc::makedev(major, minor)), (major, minor));
        }
    }

    #[test]
    fn flag_values_match_linux_loop_h() {
        assert_eq!(
            (LO_FLAGS_READ_ONLY, LO_FLAGS_AUTOCLEAR, LO_FLAGS_DIRECT_IO),
            (1, 4, 16)
        );
    }

    /// Plays the kernel for `retry_attach`: answers each attempt with the next scripted errno
    /// (0 = success) and records the flags it was called with.
    fn run_retry_policy(answers: &[i32]) -> (io::Result<LoopDevice>, Vec<u32>) {
        let mut answers = answers.iter();
        let mut seen_flags = Vec::new();
        let result = retry_attach(LO_FLAGS_DIRECT_IO | LO_FLAGS_READ_ONLY, |flags| {
            seen_flags.push(flags);
            match *answers.next().expect("more attempts than scripted") {
                0 => Ok(LoopDevice::from_number(seen_flags.len() as u32)),
                errno => Err(io::Error::from_raw_os_error(errno)),
            }
        });
        (result, seen_flags)
    }

    #[test]
    fn busy_devices_are_skipped() {
        let (result, flags) = run_retry_policy(&[libc::EBUSY, libc::EBUSY, 0]);
        assert_eq!(result.unwrap().name(), "loop3");
        assert_eq!(flags, vec![LO_FLAGS_DIRECT_IO | LO_FLAGS_READ_ONLY; 3]);
    }

    #[test]
    fn busy_retries_are_bounded() {
        let (result, flags) = run_retry_policy(&[libc::EBUSY; MAX_ATTACH_ATTEMPTS]);
        assert_eq!(result.unwrap_err().kind(), io::ErrorKind::ResourceBusy);
        assert_eq!(flags.len(), MAX_ATTACH_ATTEMPTS);
    }

    #[test]
    fn refused_direct_io_falls_back_to_buffered_once() {
        let (result, flags) = run_retry_policy(&[libc::EINVAL, 0]);
        assert!(result.is_ok());
        assert_eq!(
            flags,
            vec![LO_FLAGS_DIRECT_IO | LO_FLAGS_READ_ONLY, LO_FLAGS_READ_ONLY]
        );

        let (result, flags) = run_retry_policy(&[libc::EINVAL, libc::EINVAL]);
        assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::EINVAL));
        assert_eq!(flags.len(), 2);
    }

    #[test]
    fn other_errors_are_returned_at_once() {
        let (result, flags) = run_retry_policy(&[libc::ENOENT]);
        assert_eq!(result.unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(flags.len(), 1);
    }

    #[test]
    fn names_must_be_loop_followed_by_a_canonical_number() {
        let dev = LoopDevice::from_name("loop7").unwrap();
        assert_eq!(dev.name(), "loop7");
        assert_eq!(dev.path(), Path::new("/dev/loop7"));
        assert_eq!(dev.number(), 7);
        assert!(LoopDevice::from_name("loop0").is_some());
        assert!(LoopDevice::from_name("loop4294967295").is_some());
        for bad in [
            "",
            "loop",
            "loop-1",
            "loop+1",
            "loop07",
            "loop7p1",
            "loop 7",
            "Loop7",
            "xloop7",
            "loop4294967296",
            "loop-control",
            "/dev/loop7",
        ] {
            assert_eq!(LoopDevice::from_name(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn paths_must_be_dev_loop_followed_by_a_number() {
        assert_eq!(
            LoopDevice::from_path(Path::new("/dev/loop12")),
            LoopDevice::from_name("loop12")
        );
        for bad in [
            "loop12",
            "/dev/loop",
            "/dev/loop-control",
            "/dev/loop12p1",
            "/dev//loop12",
            "/dev/loop12/",
            "/sys/block/loop12",
            "dev/loop12",
        ] {
            assert_eq!(LoopDevice::from_path(Path::new(bad)), None, "{bad:?}");
        }
    }

    // ---- tests against real loop devices (need root) ----

    /// A device attached by a test and the identity of the file it serves. Detaches on drop so a
    /// failing assert does not leak a device.
    struct Attached(LoopDevice, FileId);

    impl Attached {
        fn over(dev: LoopDevice, file: &Path) -> Attached {
            Attached(
                dev,
                fsstat::file_id(file).expect("identity of the backing file"),
            )
        }
    }

    impl Drop for Attached {
        fn drop(&mut self) {
            // A test may have detached it already, and a parallel test may own the number now.
            // The identity holds also when a test deleted the file.
            if backing_file_id(&self.0).ok().flatten() != Some(self.1) {
                return;
            }
            if let Err(e) = detach(&self.0) {
                eprintln!("could not detach {}: {e}", self.0.name());
            }
        }
    }

    fn attach_guarded(file: &Path, read_only: bool) -> Attached {
        let started = Instant::now();
        let dev = attach(file, read_only).expect("attach");
        eprintln!(
            "attached {} to {} in {:?} (direct I/O: {:?})",
            file.display(),
            dev.name(),
            started.elapsed(),
            uses_direct_io(&dev).ok()
        );
        Attached::over(dev, file)
    }

    fn have_root() -> bool {
        let root = nix::unistd::geteuid().is_root();
        if !root {
            eprintln!("skipping: loop device tests need root");
        }
        root
    }

    /// A directory on a disk file system (not tmpfs), so direct I/O can really be used.
    fn disk_dir() -> TempDir {
        tempfile::Builder::new()
            .prefix("stickyvol-loopdev-")
            .tempdir_in("/var/tmp")
            .unwrap()
    }

    fn sized_file(dir: &Path, name: &str, len: u64) -> PathBuf {
        let path = dir.join(name);
        File::create(&path).unwrap().set_len(len).unwrap();
        path
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
    }

    fn write_at(file: &mut File, offset: u64, data: &[u8]) {
        file.seek(SeekFrom::Start(offset)).unwrap();
        file.write_all(data).unwrap();
    }

    fn read_at(file: &mut File, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        file.seek(SeekFrom::Start(offset)).unwrap();
        file.read_exact(&mut buf).unwrap();
        buf
    }

    /// Writes through the device, flushes, and checks the bytes arrived in the backing file.
    fn assert_writes_reach_backing_file(dev: &LoopDevice, backing: &Path) {
        let data = pattern(64 * 1024, 0x5a);
        let mut device = OpenOptions::new()
            .read(true)
            .write(true)
            .open(dev.path())
            .unwrap();
        write_at(&mut device, 0, &data);
        write_at(&mut device, MIB, &data);
        device.sync_all().unwrap();
        let mut file = File::open(backing).unwrap();
        assert_eq!(read_at(&mut file, 0, data.len()), data);
        assert_eq!(read_at(&mut file, MIB, data.len()), data);
    }

    #[test]
    fn attach_read_write_round_trips_data_and_is_discoverable() {
        if !have_root() {
            return;
        }
        let dir = disk_dir();
        let file = sized_file(dir.path(), "disk.img", 4 * MIB);
        let attached = attach_guarded(&file, false);
        let dev = &attached.0;
        let canonical = file.canonicalize().unwrap();

        assert_eq!(backing_file(dev).unwrap(), Some(canonical.clone()));
        assert!(!is_read_only(dev).unwrap());
        assert_eq!(size_bytes(dev).unwrap(), 4 * MIB);
        assert!(
            uses_direct_io(dev).unwrap(),
            "a file on /var/tmp (a disk file system) should be attached with direct I/O"
        );
        assert!(
            metadata_is_block_device(&dev.path()),
            "{} is not a block device",
            dev.path().display()
        );
        assert_writes_reach_backing_file(dev, &file);

        assert_eq!(find_by_backing_file(&file).unwrap(), vec![dev.clone()]);
        assert!(is_attached_to(dev, &file).unwrap());
        // Any spelling of the path (or a symlink to it) names the same file.
        let roundabout = dir.path().join(".").join("disk.img");
        assert_eq!(
            find_by_backing_file(&roundabout).unwrap(),
            vec![dev.clone()]
        );
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(find_by_backing_file(&link).unwrap(), vec![dev.clone()]);
        assert!(is_attached_to(dev, &link).unwrap());
        assert!(
            list_attached()
                .unwrap()
                .contains(&(dev.clone(), canonical.clone()))
        );
    }

    fn metadata_is_block_device(path: &Path) -> bool {
        fs::metadata(path).unwrap().file_type().is_block_device()
    }

    #[test]
    fn read_only_attach_rejects_writes() {
        if !have_root() {
            return;
        }
        let dir = disk_dir();
        let file = sized_file(dir.path(), "ro.img", 4 * MIB);
        let data = pattern(4096, 0xa5);
        {
            let mut f = OpenOptions::new().write(true).open(&file).unwrap();
            write_at(&mut f, 8192, &data);
            f.sync_all().unwrap();
        }
        let attached = attach_guarded(&file, true);
        let dev = &attached.0;

        assert!(is_read_only(dev).unwrap());
        let mut device = File::open(dev.path()).unwrap();
        assert_eq!(read_at(&mut device, 8192, data.len()), data);

        let refused = OpenOptions::new()
            .write(true)
            .open(dev.path())
            .and_then(|mut d| d.write_all(&data).and_then(|()| d.sync_all()))
            .expect_err("writing to a read-only loop device must fail");
        eprintln!("write to read-only device refused with: {refused}");
        assert!(
            matches!(
                refused.raw_os_error(),
                Some(libc::EROFS | libc::EPERM | libc::EACCES)
            ),
            "unexpected error {refused:?}"
        );
    }

    #[test]
    fn detach_is_idempotent() {
        if !have_root() {
            return;
        }
        let dir = disk_dir();
        let file = sized_file(dir.path(), "detach.img", 4 * MIB);
        let attached = attach_guarded(&file, false);
        let dev = attached.0.clone();

        detach(&dev).unwrap();
        detach(&dev).unwrap();
        // Another test may grab the freed device at once, so only check it is no longer ours.
        let canonical = file.canonicalize().unwrap();
        assert_ne!(backing_file(&dev).unwrap(), Some(canonical));
        assert!(find_by_backing_file(&file).unwrap().is_empty());
    }

    #[test]
    fn refresh_capacity_picks_up_a_grown_backing_file() {
        if !have_root() {
            return;
        }
        let dir = disk_dir();
        let file = sized_file(dir.path(), "grow.img", 4 * MIB);
        let attached = attach_guarded(&file, false);
        let dev = &attached.0;

        File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(12 * MIB)
            .unwrap();
        assert_eq!(
            size_bytes(dev).unwrap(),
            4 * MIB,
            "the size should only change when asked to"
        );
        refresh_capacity(dev).unwrap();
        assert_eq!(size_bytes(dev).unwrap(), 12 * MIB);
    }

    #[test]
    fn concurrent_attaches_get_distinct_devices() {
        if !have_root() {
            return;
        }
        const THREADS: usize = 6;
        let dir = disk_dir();
        let barrier = Arc::new(Barrier::new(THREADS));
        let attached: Vec<Attached> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|i| {
                    let file = sized_file(dir.path(), &format!("c{i}.img"), MIB);
                    let barrier = Arc::clone(&barrier);
                    scope.spawn(move || {
                        barrier.wait();
                        attach(&file, false).map(|dev| Attached::over(dev, &file))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<io::Result<_>>()
                .expect("every concurrent attach succeeds")
        });
        let names: HashSet<&str> = attached.iter().map(|a| a.0.name()).collect();
        assert_eq!(names.len(), THREADS, "devices handed out twice: {names:?}");
        for (i, a) in attached.iter().enumerate() {
            let expected = dir.path().join(format!("c{i}.img")).canonicalize().unwrap();
            assert_eq!(backing_file(&a.0).unwrap(), Some(expected));
        }
    }

    #[test]
    fn tmpfs_backing_file_is_usable() {
        if !have_root() {
            return;
        }
        let on_tmpfs = nix::sys::statfs::statfs("/dev/shm")
            .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
        if !on_tmpfs {
            eprintln!("skipping: /dev/shm is not tmpfs");
            return;
        }
        let dir = tempfile::Builder::new()
            .prefix("stickyvol-loopdev-")
            .tempdir_in("/dev/shm")
            .unwrap();
        let file = sized_file(dir.path(), "shm.img", 4 * MIB);
        let attached = attach_guarded(&file, false);
        let dev = &attached.0;
        eprintln!(
            "tmpfs backing file: direct I/O {}",
            uses_direct_io(dev).unwrap()
        );
        assert_writes_reach_backing_file(dev, &file);
    }

    #[test]
    fn attaching_a_missing_file_fails_with_not_found() {
        let dir = disk_dir();
        let err = attach(&dir.path().join("absent.img"), false).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn backing_file_is_reported_verbatim() {
        if !have_root() {
            return;
        }
        let dir = disk_dir();
        let file = sized_file(dir.path(), "odd name\nwith newline\\.img", MIB);
        let attached = attach_guarded(&file, true);
        let dev = &attached.0;
        let canonical = file.canonicalize().unwrap();
        assert_eq!(backing_file(dev).unwrap(), Some(canonical.clone()));
        assert_eq!(find_by_backing_file(&file).unwrap(), vec![dev.clone()]);

        fs::remove_file(&file).unwrap();
        let mut deleted = canonical.into_os_string();
        deleted.push(" (deleted)");
        assert_eq!(backing_file(dev).unwrap(), Some(PathBuf::from(deleted)));
    }

    /// LOOP_GET_STATUS64's lo_device decodes to what statx says of the file, on a disk file
    /// system and on tmpfs (an anonymous device), and its raw value is stat(2)'s st_dev.
    #[test]
    fn backing_file_id_is_what_stat_says_of_the_file() {
        if !have_root() {
            return;
        }
        let disk = disk_dir();
        let shm = tempfile::Builder::new()
            .prefix("stickyvol-loopdev-")
            .tempdir_in("/dev/shm")
            .unwrap();
        for dir in [disk.path(), shm.path()] {
            let file = sized_file(dir, "id.img", MIB);
            let attached = attach_guarded(&file, false);
            let id = backing_file_id(&attached.0).unwrap().expect("attached");
            let stat = fs::metadata(&file).unwrap();
            eprintln!("{}: {id:?}, st_dev {:#x}", file.display(), stat.dev());
            assert_eq!(id, fsstat::file_id(&file).unwrap());
            assert_eq!(
                (libc::makedev(id.dev.0, id.dev.1), id.ino),
                (stat.dev(), stat.ino())
            );
            assert!(is_attached_to(&attached.0, &file).unwrap());
        }
    }

    /// A new file at the path of a deleted backing file is another file.
    #[test]
    fn a_new_file_at_the_path_is_not_the_backing_file() {
        if !have_root() {
            return;
        }
        let dir = disk_dir();
        let file = sized_file(dir.path(), "replaced.img", MIB);
        let attached = attach_guarded(&file, false);
        let dev = &attached.0;
        fs::remove_file(&file).unwrap();
        assert!(!is_attached_to(dev, &file).unwrap(), "the file is gone");
        sized_file(dir.path(), "replaced.img", MIB);
        assert!(!is_attached_to(dev, &file).unwrap());
        assert!(find_by_backing_file(&file).unwrap().is_empty());
        assert_eq!(backing_file_id(dev).unwrap(), Some(attached.1));
    }

    #[test]
    fn a_device_detached_during_the_read_counts_as_unattached() {
        assert!(detached_meanwhile(&io::Error::from_raw_os_error(
            libc::ENODEV
        )));
        assert!(detached_meanwhile(&io::Error::from(
            io::ErrorKind::NotFound
        )));
        assert!(!detached_meanwhile(&io::Error::from_raw_os_error(
            libc::EIO
        )));
    }

    #[test]
    fn backing_file_of_an_unattached_device_is_none() {
        // No loop module would ever create this many devices.
        let dev = LoopDevice::from_name("loop4000000000").unwrap();
        assert_eq!(backing_file(&dev).unwrap(), None);
        assert_eq!(backing_file_id(&dev).unwrap(), None);
        detach(&dev).expect("detaching a nonexistent device is a no-op");
    }

    #[test]
    fn created_device_node_refers_to_the_same_device() {
        if !have_root() {
            return;
        }
        let dir = disk_dir();
        let file = sized_file(dir.path(), "node.img", MIB);
        let attached = attach_guarded(&file, false);
        let dev = &attached.0;

        let node = dir.path().join("node");
        create_device_node(dev, &node).unwrap();
        create_device_node(dev, &node).expect("an existing node is fine");
        let created = fs::metadata(&node).unwrap();
        assert!(created.file_type().is_block_device());
        assert_eq!(created.rdev(), fs::metadata(dev.path()).unwrap().rdev());
    }
}
