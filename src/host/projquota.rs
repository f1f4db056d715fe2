//! XFS/ext4 project quotas: a volume's directory gets its own project id (inherited by
//! everything created below it), and a hard block limit on that project enforces its size.
//!
//! The project id lives in the inode (FS_IOC_FSGETXATTR/FSSETXATTR); limits and usage go through
//! quotactl_fd(2) on a descriptor of any directory of the filesystem, so we never need the
//! block device's path. Ids are handed out by [`ProjectIds`], so two volumes never share one.
//!
//! Measured on Linux 6.18, built without XFS quota and without ext4's quota format (mounting
//! with prjquota, or ext4 with the `project` feature at all, fails): quotactl_fd answers ESRCH
//! on ext4 (quota code present, quota off) and ENOSYS on XFS, btrfs and tmpfs (no quota
//! support). FS_IOC_FSGETXATTR works on all four. Setting a project id with FSSETXATTR works
//! on XFS without quota; btrfs and tmpfs refuse any change of projid or PROJINHERIT with
//! EOPNOTSUPP; ext4 without the `project` feature refuses a non-zero id with EOPNOTSUPP (after
//! having set PROJINHERIT). Limits, usage and EDQUOT are tested where a kernel allows
//! (tests/host_quota.rs) and otherwise rest on the UAPI facts pinned in the unit tests.

use std::collections::BTreeSet;
use std::io;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::sys::stat::Mode;

use uapi::*;
pub use uapi::{FsXattr, IfDqblk, IfDqinfo, IfNextDqblk};

/// Project ids [`ProjectIds::new`] hands out unless configured otherwise. Administrators
/// number their projects from 1 upwards (/etc/projid), and systemd takes 2^31 and above for
/// its exec directories; one billion sits far from both, and below 2^31 so tools that print
/// ids as signed integers show them correctly. Needs 32-bit project ids (XFS: projid32bit,
/// the mkfs.xfs default for years; ext4: always).
pub const DEFAULT_PROJECT_ID_RANGE: Range<u32> = 1_000_000_000..1_100_000_000;

/// The project id of `dir` and whether new entries below it inherit it (FS_XFLAG_PROJINHERIT).
/// `dir` is not followed if it is a symlink.
pub fn project_of(dir: &Path) -> io::Result<(u32, bool)> {
    let fd = open_dir(dir)?;
    let attr = get_xattr(fd.as_fd())?;
    Ok((attr.fsx_projid, attr.fsx_xflags & FS_XFLAG_PROJINHERIT != 0))
}

/// Puts `dir` into project `project_id` and makes everything created below it inherit the id
/// (FS_XFLAG_PROJINHERIT). Entries already inside keep their old id: call this on a fresh,
/// empty directory. `dir` is not followed if it is a symlink. Works without quota enabled on
/// XFS and on ext4 with the `project` feature; elsewhere a non-zero id fails with EOPNOTSUPP.
pub fn assign_project(dir: &Path, project_id: u32) -> io::Result<()> {
    let fd = open_dir(dir)?;
    let mut attr = get_xattr(fd.as_fd())?;
    attr.fsx_projid = project_id;
    attr.fsx_xflags |= FS_XFLAG_PROJINHERIT;
    // SAFETY: `attr` is a complete struct fsxattr, as returned by the kernel, that outlives
    // the call and that the kernel only reads.
    unsafe { fs_ioc_fssetxattr(fd.as_raw_fd(), &attr) }?;
    Ok(())
}

/// Whether project quota limits are enforced on the filesystem holding `path`: accounted and
/// enforced (FS_QUOTA_PDQ_ACCT and FS_QUOTA_PDQ_ENFD from Q_XGETQSTATV). Accounting alone is
/// not enough: ext4 with the quota feature accounts projects at every mount but enforces their
/// limits only when mounted with prjquota (seen on Debian's 6.1 kernel: limits stored, writes
/// past them accepted), and XFS mounted with pqnoenforce accounts without enforcing. "No"
/// answers from the kernel are Ok(false): ESRCH (quota support present but off), ENOSYS (no
/// quota support in the filesystem or the kernel: tmpfs, btrfs, XFS without CONFIG_XFS_QUOTA,
/// or a kernel before 5.14 without quotactl_fd) and EOPNOTSUPP/ENOTTY (refused by the
/// filesystem).
pub fn project_quota_enabled(path: &Path) -> io::Result<bool> {
    let mut state = FsQuotaStatv {
        qs_version: FS_QSTATV_VERSION1,
        ..FsQuotaStatv::default()
    };
    match quotactl(path, Q_XGETQSTATV, 0, (&raw mut state).cast()) {
        Ok(()) => {
            let both = FS_QUOTA_PDQ_ACCT | FS_QUOTA_PDQ_ENFD;
            Ok(state.qs_flags & both == both)
        }
        Err(Errno::ESRCH | Errno::ENOSYS | Errno::EOPNOTSUPP | Errno::ENOTTY) => Ok(false),
        Err(errno) => Err(errno.into()),
    }
}

/// Sets project `project_id`'s hard block limit to `hard_limit_bytes`, rounded up to the quota
/// block unit (1 KiB), and clears its soft limit (Q_SETQUOTA with QIF_BLIMITS). 0 is refused
/// (the kernel reads a 0 limit as "unlimited"); so is project 0, which holds every file that
/// belongs to no project.
pub fn set_project_limit(
    path_in_fs: &Path,
    project_id: u32,
    hard_limit_bytes: u64,
) -> io::Result<()> {
    if hard_limit_bytes == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a project quota limit of 0 bytes would mean \"unlimited\"",
        ));
    }
    set_block_limit(path_in_fs, project_id, quota_blocks(hard_limit_bytes))
}

/// Removes project `project_id`'s block limits (both 0, "unlimited"); usage stays accounted.
pub fn clear_project_limit(path_in_fs: &Path, project_id: u32) -> io::Result<()> {
    set_block_limit(path_in_fs, project_id, 0)
}

fn set_block_limit(path_in_fs: &Path, project_id: u32, hard_blocks: u64) -> io::Result<()> {
    if project_id == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "project 0 is the default project of every file; refusing to limit it",
        ));
    }
    let mut dq = IfDqblk {
        dqb_bhardlimit: hard_blocks,
        dqb_bsoftlimit: 0,
        dqb_valid: QIF_BLIMITS,
        ..IfDqblk::default()
    };
    quotactl(path_in_fs, Q_SETQUOTA, project_id, (&raw mut dq).cast())?;
    Ok(())
}

/// A project's usage and limit, from the quota subsystem: exact at all times, O(1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProjectUsage {
    pub used_bytes: u64,
    pub inodes: u64,
    /// The hard block limit, None when unlimited.
    pub hard_limit_bytes: Option<u64>,
}

/// Usage of project `project_id` (Q_GETQUOTA). A project the filesystem has never seen (XFS
/// answers ENOENT) has no usage and no limit.
pub fn project_usage(path_in_fs: &Path, project_id: u32) -> io::Result<ProjectUsage> {
    let dq = get_quota(path_in_fs, project_id)?;
    Ok(ProjectUsage {
        used_bytes: dq.dqb_curspace,
        inodes: dq.dqb_curinodes,
        hard_limit_bytes: (dq.dqb_bhardlimit != 0)
            .then(|| dq.dqb_bhardlimit.saturating_mul(QIF_DQBLKSIZE)),
    })
}

/// Whether anything on the filesystem uses project `project_id`: space or inodes charged to
/// it, or any limit (block or inode, hard or soft) set on it.
pub fn project_in_use(path_in_fs: &Path, project_id: u32) -> io::Result<bool> {
    Ok(project_use(path_in_fs, project_id)? != IdUse::Unused)
}

/// How the filesystem uses project `project_id`: the probe for [`ProjectIds::allocate`].
pub fn project_use(path_in_fs: &Path, project_id: u32) -> io::Result<IdUse> {
    Ok(use_of(&get_quota(path_in_fs, project_id)?))
}

fn use_of(dq: &IfDqblk) -> IdUse {
    if dq.dqb_bhardlimit != 0
        || dq.dqb_bsoftlimit != 0
        || dq.dqb_ihardlimit != 0
        || dq.dqb_isoftlimit != 0
    {
        IdUse::Limited
    } else if dq.dqb_curspace != 0 || dq.dqb_curinodes != 0 {
        IdUse::Charged
    } else {
        IdUse::Unused
    }
}

/// The projects of `range` the filesystem uses (usage or a limit), lowest first, at most
/// `at_most` of them (Q_GETNEXTQUOTA: one call per project found, however sparse the range).
pub fn projects_in_use(
    path_in_fs: &Path,
    range: Range<u32>,
    at_most: usize,
) -> io::Result<Vec<u32>> {
    let mut found = Vec::new();
    let mut next = range.start;
    while next < range.end && found.len() < at_most {
        let mut dq = IfNextDqblk::default();
        match quotactl(path_in_fs, Q_GETNEXTQUOTA, next, (&raw mut dq).cast()) {
            Ok(()) => {}
            Err(Errno::ENOENT) => break,
            Err(errno) => return Err(errno.into()),
        }
        if dq.dqb_id >= range.end || dq.dqb_id < next {
            break;
        }
        let quota = IfDqblk {
            dqb_bhardlimit: dq.dqb_bhardlimit,
            dqb_bsoftlimit: dq.dqb_bsoftlimit,
            dqb_curspace: dq.dqb_curspace,
            dqb_ihardlimit: dq.dqb_ihardlimit,
            dqb_isoftlimit: dq.dqb_isoftlimit,
            dqb_curinodes: dq.dqb_curinodes,
            ..IfDqblk::default()
        };
        if use_of(&quota) != IdUse::Unused {
            found.push(dq.dqb_id);
        }
        match dq.dqb_id.checked_add(1) {
            Some(after) => next = after,
            None => break,
        }
    }
    Ok(found)
}

/// The project id of the open file `fd` and whether it carries the inherit flag.
pub fn project_of_fd(fd: BorrowedFd<'_>) -> io::Result<(u32, bool)> {
    let attr = get_xattr(fd)?;
    Ok((attr.fsx_projid, attr.fsx_xflags & FS_XFLAG_PROJINHERIT != 0))
}

/// Puts the open file `fd` into project `project_id`, with the inherit flag if `inherit`
/// (directories); its other flags stay. The quota subsystem moves its charges to the new
/// project, whatever the old one's limit.
pub fn set_project_of_fd(fd: BorrowedFd<'_>, project_id: u32, inherit: bool) -> io::Result<()> {
    let mut attr = get_xattr(fd)?;
    attr.fsx_projid = project_id;
    if inherit {
        attr.fsx_xflags |= FS_XFLAG_PROJINHERIT;
    }
    // SAFETY: `attr` is a complete struct fsxattr, as returned by the kernel, that outlives
    // the call and that the kernel only reads.
    unsafe { fs_ioc_fssetxattr(fd.as_raw_fd(), &attr) }?;
    Ok(())
}

fn get_quota(path_in_fs: &Path, project_id: u32) -> io::Result<IfDqblk> {
    let mut dq = IfDqblk::default();
    match quotactl(path_in_fs, Q_GETQUOTA, project_id, (&raw mut dq).cast()) {
        Ok(()) => Ok(dq),
        Err(Errno::ENOENT) => Ok(IfDqblk::default()),
        Err(errno) => Err(errno.into()),
    }
}

/// Bytes to quota blocks (QIF_DQBLKSIZE), rounded up so the limit is never below the request.
fn quota_blocks(bytes: u64) -> u64 {
    bytes.div_ceil(QIF_DQBLKSIZE)
}

/// quotactl_fd(fd, QCMD(cmd, PRJQUOTA), id, addr) on a directory of the filesystem.
fn quotactl(
    path_in_fs: &Path,
    cmd: libc::c_int,
    id: u32,
    addr: *mut libc::c_void,
) -> Result<(), Errno> {
    let fd = open_dir(path_in_fs).map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(0)))?;
    let qcmd = libc::QCMD(cmd, PRJQUOTA) as libc::c_uint;
    // SAFETY: quotactl_fd reads or fills `addr`, which the callers point at the struct the
    // command expects (if_dqinfo for Q_GETINFO, if_dqblk for Q_GETQUOTA/Q_SETQUOTA,
    // if_nextdqblk for Q_GETNEXTQUOTA, fs_quota_statv for Q_XGETQSTATV), alive for the
    // duration of the call.
    let rc = unsafe {
        libc::syscall(
            SYS_QUOTACTL_FD,
            fd.as_raw_fd() as libc::c_uint,
            qcmd,
            id as libc::c_uint,
            addr,
        )
    };
    if rc == 0 { Ok(()) } else { Err(Errno::last()) }
}

fn get_xattr(fd: BorrowedFd<'_>) -> io::Result<FsXattr> {
    let mut attr = FsXattr::default();
    // SAFETY: `attr` is a complete struct fsxattr the kernel fills in; it outlives the call.
    unsafe { fs_ioc_fsgetxattr(fd.as_raw_fd(), &mut attr) }?;
    Ok(attr)
}

fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?)
}

/// Hands out project ids from a range so that no two volumes ever share one: an id is taken
/// while a volume record holds it or a [`ProjectIdLease`] reserves it. Cheap to clone (the
/// clones share one state) and safe to use from many threads.
///
/// Ids are drawn at random from the range, so a tenant cannot guess a neighbour's id from its
/// own (the owner of a file may set its project id without privilege; see `volume::audit`).
///
/// Exhaustion is not a tenant's to cause. Our records (and leases) are the authority on which
/// ids are taken. Beyond them the filesystem is asked ([`IdUse`]): an id carrying a limit was
/// set up by someone with CAP_SYS_ADMIN (a crash's leftover, another tool) and is skipped; an id
/// merely charged with usage may be a tenant's tagging of its own files, which cannot reserve
/// anything: it is avoided while unused ids are found, and taken otherwise (the audit of the
/// tagging tenant's volume moves those files back to that volume's id).
#[derive(Debug, Clone)]
pub struct ProjectIds {
    range: Range<u32>,
    state: Arc<Mutex<IdState>>,
}

#[derive(Debug)]
struct IdState {
    /// Held by a record or a lease; may include ids outside the range (old records).
    held: BTreeSet<u32>,
    /// The subset of `held` reserved by leases not yet committed.
    leased: BTreeSet<u32>,
    /// Draws the probe answered with a limit nobody here set, over this instance's life.
    foreign: u64,
}

/// How the filesystem uses a project id, as [`ProjectIds::allocate`]'s probe reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdUse {
    /// No usage, no limit.
    Unused,
    /// Space or inodes are charged to it, no limit: files tagged with it, perhaps by a tenant.
    Charged,
    /// A limit is set on it: only a privileged process does that.
    Limited,
}

/// Random draws [`ProjectIds::allocate`] makes before settling for a charged id, or giving up
/// when every draw carries a limit (then someone else allocates from our range).
const DRAWS_PER_ALLOCATION: usize = 64;

impl ProjectIds {
    /// `ids_in_use_by_our_records`: the project ids of the volumes that exist (from their
    /// records); ids outside `range` are accepted and ignored. Panics if `range` contains
    /// project 0, the default project of every file.
    pub fn new(
        range: Range<u32>,
        ids_in_use_by_our_records: impl IntoIterator<Item = u32>,
    ) -> ProjectIds {
        assert!(range.start > 0, "project 0 cannot be handed out");
        let held: BTreeSet<u32> = ids_in_use_by_our_records.into_iter().collect();
        ProjectIds {
            state: Arc::new(Mutex::new(IdState {
                held,
                leased: BTreeSet::new(),
                foreign: 0,
            })),
            range,
        }
    }

    pub fn range(&self) -> Range<u32> {
        self.range.clone()
    }

    /// Reserves a random id that is not held, preferring one `probe` (e.g. [`project_use`] on
    /// the volume's filesystem) reports unused, never one it reports limited. The reservation
    /// lasts until the lease is committed (the id now belongs to a record) or dropped (the id
    /// is free again). A probe error is returned as is. Fails with StorageFull when the range
    /// is exhausted by held ids, or every draw carries a limit.
    pub fn allocate(&self, probe: impl Fn(u32) -> io::Result<IdUse>) -> io::Result<ProjectIdLease> {
        let mut state = self.lock();
        let mut charged = None;
        for _ in 0..DRAWS_PER_ALLOCATION {
            let Some(id) = state.draw(&self.range)? else {
                return Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    format!(
                        "no free project id left in {}..{}: all held by volumes",
                        self.range.start, self.range.end
                    ),
                ));
            };
            match probe(id)? {
                IdUse::Unused => return Ok(self.lease(&mut state, id)),
                IdUse::Charged => {
                    charged.get_or_insert(id);
                }
                IdUse::Limited => state.foreign += 1,
            }
        }
        match charged {
            Some(id) => Ok(self.lease(&mut state, id)),
            None => Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "{DRAWS_PER_ALLOCATION} random project ids of {}..{} all carry a limit no \
                     volume of ours set ({} such draws so far); is another tool allocating \
                     from this range?",
                    self.range.start, self.range.end, state.foreign
                ),
            )),
        }
    }

    fn lease(&self, state: &mut IdState, id: u32) -> ProjectIdLease {
        state.held.insert(id);
        state.leased.insert(id);
        ProjectIdLease {
            id,
            state: Some(Arc::clone(&self.state)),
        }
    }

    /// The volume holding `id` is gone: the id may be handed out again. Ids reserved by a
    /// live lease (its drop releases them) are left alone.
    pub fn release(&self, id: u32) {
        let mut state = self.lock();
        if !state.leased.contains(&id) {
            state.held.remove(&id);
        }
    }

    /// Reserves `id` itself, if it is in the range and neither held nor leased: e.g. the id of
    /// data a crash left, until that data and its quota are gone. None otherwise.
    pub fn reserve(&self, id: u32) -> Option<ProjectIdLease> {
        let mut state = self.lock();
        if !self.range.contains(&id) || state.held.contains(&id) {
            return None;
        }
        Some(self.lease(&mut state, id))
    }

    /// Whether `id` is held by a record or a lease.
    pub fn is_held(&self, id: u32) -> bool {
        self.lock().held.contains(&id)
    }

    fn lock(&self) -> MutexGuard<'_, IdState> {
        // Every update leaves the state consistent, so a panic elsewhere cannot corrupt it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl IdState {
    /// A random id of `range` that is not held; None when all are.
    fn draw(&self, range: &Range<u32>) -> io::Result<Option<u32>> {
        let size = range.end.saturating_sub(range.start);
        if size as usize <= self.held.range(range.clone()).count() {
            return Ok(None);
        }
        for _ in 0..16 {
            let id = range.start + random_below(size)?;
            if !self.held.contains(&id) {
                return Ok(Some(id));
            }
        }
        // A crowded range: the first free id from a random point on, wrapping around.
        let from = range.start + random_below(size)?;
        Ok((from..range.end)
            .chain(range.start..from)
            .find(|id| !self.held.contains(id)))
    }
}

/// A uniformly random number below `bound` (> 0), from the kernel's generator. The modulo's
/// bias is below 2^-32 for a 32-bit bound.
fn random_below(bound: u32) -> io::Result<u32> {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into the buffer it is given.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got != bytes.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok((u64::from_ne_bytes(bytes) % u64::from(bound)) as u32)
}

/// A project id reserved by [`ProjectIds::allocate`]: released on drop unless committed.
#[derive(Debug)]
pub struct ProjectIdLease {
    id: u32,
    /// None once committed.
    state: Option<Arc<Mutex<IdState>>>,
}

impl ProjectIdLease {
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The id now belongs to a volume record; only [`ProjectIds::release`] frees it.
    pub fn commit(mut self) -> u32 {
        if let Some(state) = self.state.take() {
            lock(&state).leased.remove(&self.id);
        }
        self.id
    }
}

impl Drop for ProjectIdLease {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            let mut state = lock(&state);
            state.leased.remove(&self.id);
            state.held.remove(&self.id);
        }
    }
}

fn lock(state: &Mutex<IdState>) -> MutexGuard<'_, IdState> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Hand-written mirror of the parts of <linux/fs.h> and <linux/quota.h> we use. The quota
/// command numbers and QCMD come from libc, which has them; the tests pin their values.
mod uapi {
    use nix::sys::ioctl::ioctl_num_type;

    pub use libc::{Q_GETQUOTA, Q_SETQUOTA, QIF_BLIMITS};

    /// Q_GETNEXTQUOTA (<linux/quota.h>, Linux 4.6+): the quota of the first id at or above the
    /// one asked for that has one.
    pub const Q_GETNEXTQUOTA: libc::c_int = 0x80_0009;

    /// Q_XGETQSTATV (<linux/dqblk_xfs.h>: XQM_CMD(8)), served by XFS and by the VFS quota code
    /// (ext4) alike; its answer's version must be set on the way in.
    pub const Q_XGETQSTATV: libc::c_int = (b'X' as libc::c_int) << 8 | 8;
    pub const FS_QSTATV_VERSION1: i8 = 1;
    pub const FS_QUOTA_PDQ_ACCT: u16 = 1 << 4;
    pub const FS_QUOTA_PDQ_ENFD: u16 = 1 << 5;

    pub const FS_XFLAG_PROJINHERIT: u32 = 0x0000_0200;
    pub const PRJQUOTA: libc::c_int = 2;
    /// Quota block size of if_dqblk's limits (1 << QIF_DQBLKSIZE_BITS).
    pub const QIF_DQBLKSIZE: u64 = 1024;
    /// quotactl_fd(2), Linux 5.14+: the same number on every architecture using the generic
    /// syscall table, x86_64 and aarch64 included.
    pub const SYS_QUOTACTL_FD: libc::c_long = libc::SYS_quotactl_fd;

    /// struct fsxattr, the argument of FS_IOC_FSGETXATTR / FS_IOC_FSSETXATTR.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct FsXattr {
        pub fsx_xflags: u32,
        pub fsx_extsize: u32,
        pub fsx_nextents: u32,
        pub fsx_projid: u32,
        pub fsx_cowextsize: u32,
        pub fsx_pad: [u8; 8],
    }

    /// struct if_dqblk, the argument of Q_GETQUOTA / Q_SETQUOTA. Limits are in QIF_DQBLKSIZE
    /// blocks, dqb_curspace in bytes; dqb_valid says which groups of fields count (QIF_*).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct IfDqblk {
        pub dqb_bhardlimit: u64,
        pub dqb_bsoftlimit: u64,
        pub dqb_curspace: u64,
        pub dqb_ihardlimit: u64,
        pub dqb_isoftlimit: u64,
        pub dqb_curinodes: u64,
        pub dqb_btime: u64,
        pub dqb_itime: u64,
        pub dqb_valid: u32,
    }

    /// struct if_nextdqblk, the argument of Q_GETNEXTQUOTA: an if_dqblk and the id it is of.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct IfNextDqblk {
        pub dqb_bhardlimit: u64,
        pub dqb_bsoftlimit: u64,
        pub dqb_curspace: u64,
        pub dqb_ihardlimit: u64,
        pub dqb_isoftlimit: u64,
        pub dqb_curinodes: u64,
        pub dqb_btime: u64,
        pub dqb_itime: u64,
        pub dqb_valid: u32,
        pub dqb_id: u32,
    }

    /// struct if_dqinfo, the argument of Q_GETINFO.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct IfDqinfo {
        pub dqi_bgrace: u64,
        pub dqi_igrace: u64,
        pub dqi_flags: u32,
        pub dqi_valid: u32,
    }

    /// struct fs_qfilestatv, part of fs_quota_statv.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct FsQfilestatv {
        pub qfs_ino: u64,
        pub qfs_nblks: u64,
        pub qfs_nextents: u32,
        pub qfs_pad: u32,
    }

    /// struct fs_quota_statv, the argument of Q_XGETQSTATV.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct FsQuotaStatv {
        pub qs_version: i8,
        pub qs_pad1: u8,
        pub qs_flags: u16,
        pub qs_incoredqs: u32,
        pub qs_uquota: FsQfilestatv,
        pub qs_gquota: FsQfilestatv,
        pub qs_pquota: FsQfilestatv,
        pub qs_btimelimit: i32,
        pub qs_itimelimit: i32,
        pub qs_rtbtimelimit: i32,
        pub qs_bwarnlimit: u16,
        pub qs_iwarnlimit: u16,
        pub qs_rtbwarnlimit: u16,
        pub qs_pad3: u16,
        pub qs_pad4: u32,
        pub qs_pad2: [u64; 7],
    }

    pub const FS_IOC_FSGETXATTR: ioctl_num_type =
        nix::request_code_read!(b'X', 31, size_of::<FsXattr>());
    pub const FS_IOC_FSSETXATTR: ioctl_num_type =
        nix::request_code_write!(b'X', 32, size_of::<FsXattr>());

    nix::ioctl_read_bad!(fs_ioc_fsgetxattr, FS_IOC_FSGETXATTR, FsXattr);
    nix::ioctl_write_ptr_bad!(fs_ioc_fssetxattr, FS_IOC_FSSETXATTR, FsXattr);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::mem::offset_of;
    use std::sync::Barrier;

    #[test]
    fn struct_layouts_match_the_kernel_uapi() {
        // Expected values: sizeof/_Alignof/offsetof from a C program including <linux/fs.h>
        // and <linux/quota.h>; fixed-size fields, so they hold on every architecture.
        assert_eq!((size_of::<FsXattr>(), align_of::<FsXattr>()), (28, 4));
        assert_eq!(offset_of!(FsXattr, fsx_extsize), 4);
        assert_eq!(offset_of!(FsXattr, fsx_nextents), 8);
        assert_eq!(offset_of!(FsXattr, fsx_projid), 12);
        assert_eq!(offset_of!(FsXattr, fsx_cowextsize), 16);
        assert_eq!(offset_of!(FsXattr, fsx_pad), 20);

        assert_eq!((size_of::<IfDqblk>(), align_of::<IfDqblk>()), (72, 8));
        assert_eq!(offset_of!(IfDqblk, dqb_bsoftlimit), 8);
        assert_eq!(offset_of!(IfDqblk, dqb_curspace), 16);
        assert_eq!(offset_of!(IfDqblk, dqb_curinodes), 40);
        assert_eq!(offset_of!(IfDqblk, dqb_itime), 56);
        assert_eq!(offset_of!(IfDqblk, dqb_valid), 64);
        // libc's `dqblk` is the same struct under glibc's name.
        assert_eq!(size_of::<IfDqblk>(), size_of::<libc::dqblk>());
        assert_eq!(
            offset_of!(IfDqblk, dqb_valid),
            offset_of!(libc::dqblk, dqb_valid)
        );

        assert_eq!(
            (size_of::<FsQuotaStatv>(), align_of::<FsQuotaStatv>()),
            (160, 8)
        );
        assert_eq!(offset_of!(FsQuotaStatv, qs_flags), 2);
        assert_eq!(offset_of!(FsQuotaStatv, qs_uquota), 8);
        assert_eq!(offset_of!(FsQuotaStatv, qs_pquota), 56);
        assert_eq!(offset_of!(FsQuotaStatv, qs_btimelimit), 80);
        assert_eq!(offset_of!(FsQuotaStatv, qs_bwarnlimit), 92);
        assert_eq!(offset_of!(FsQuotaStatv, qs_pad4), 100);
        assert_eq!(offset_of!(FsQuotaStatv, qs_pad2), 104);

        assert_eq!((size_of::<IfDqinfo>(), align_of::<IfDqinfo>()), (24, 8));
        assert_eq!(offset_of!(IfDqinfo, dqi_flags), 16);
        assert_eq!(offset_of!(IfDqinfo, dqi_valid), 20);
    }

    #[test]
    fn constants_match_the_kernel_uapi() {
        assert_eq!(FS_XFLAG_PROJINHERIT, 0x200);
        assert_eq!(PRJQUOTA, 2);
        assert_eq!(
            (libc::Q_GETINFO, Q_GETQUOTA, Q_SETQUOTA),
            (0x80_0005, 0x80_0007, 0x80_0008)
        );
        assert_eq!(QIF_BLIMITS, 1);
        assert_eq!(QIF_DQBLKSIZE, 1 << 10);
        // QCMD(cmd, type) = cmd << 8 | type, as an int: the top bit of 0x800000 makes it negative.
        assert_eq!(libc::QCMD(Q_GETQUOTA, PRJQUOTA) as u32, 0x8000_0702);
        assert_eq!(libc::QCMD(Q_SETQUOTA, PRJQUOTA) as u32, 0x8000_0802);
        assert_eq!(libc::QCMD(libc::Q_GETINFO, PRJQUOTA) as u32, 0x8000_0502);
        assert_eq!(Q_XGETQSTATV, 0x5808);
        assert_eq!(libc::QCMD(Q_XGETQSTATV, PRJQUOTA) as u32, 0x0058_0802);
        assert_eq!((FS_QUOTA_PDQ_ACCT, FS_QUOTA_PDQ_ENFD), (0x10, 0x20));
    }

    #[test]
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn syscall_and_ioctl_numbers_match_the_kernel_uapi() {
        assert_eq!(SYS_QUOTACTL_FD, 443);
        assert_eq!(FS_IOC_FSGETXATTR, 0x801C_581F);
        assert_eq!(FS_IOC_FSSETXATTR, 0x401C_5820);
    }

    #[test]
    fn limits_round_up_to_whole_quota_blocks() {
        assert_eq!(quota_blocks(1), 1);
        assert_eq!(quota_blocks(1024), 1);
        assert_eq!(quota_blocks(1025), 2);
        assert_eq!(quota_blocks(10 << 20), 10 << 10);
        assert_eq!(quota_blocks(u64::MAX), u64::MAX / 1024 + 1);
    }

    #[test]
    fn zero_limits_and_project_zero_are_refused() {
        // Checked before any file is opened, so the path does not matter.
        let nowhere = Path::new("/nonexistent");
        let err = set_project_limit(nowhere, 7, 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let err = set_project_limit(nowhere, 0, 4096).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let err = clear_project_limit(nowhere, 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    fn never_used(_: u32) -> io::Result<IdUse> {
        Ok(IdUse::Unused)
    }

    #[test]
    fn struct_if_nextdqblk_matches_the_kernel_uapi() {
        assert_eq!(
            (size_of::<IfNextDqblk>(), align_of::<IfNextDqblk>()),
            (72, 8)
        );
        assert_eq!(offset_of!(IfNextDqblk, dqb_valid), 64);
        assert_eq!(offset_of!(IfNextDqblk, dqb_id), 68);
        assert_eq!(libc::QCMD(Q_GETNEXTQUOTA, PRJQUOTA) as u32, 0x8000_0902);
    }

    #[test]
    fn usage_and_limits_classify_an_id() {
        let with = |f: fn(&mut IfDqblk)| {
            let mut dq = IfDqblk::default();
            f(&mut dq);
            use_of(&dq)
        };
        assert_eq!(with(|_| {}), IdUse::Unused);
        assert_eq!(with(|d| d.dqb_curinodes = 1), IdUse::Charged);
        assert_eq!(with(|d| d.dqb_curspace = 4096), IdUse::Charged);
        assert_eq!(with(|d| d.dqb_bhardlimit = 1), IdUse::Limited);
        assert_eq!(with(|d| d.dqb_isoftlimit = 1), IdUse::Limited);
        let both = |d: &mut IfDqblk| {
            d.dqb_curspace = 1;
            d.dqb_bsoftlimit = 1;
        };
        assert_eq!(with(both), IdUse::Limited);
    }

    #[test]
    fn ids_are_drawn_at_random_never_held_ones() {
        let ids = ProjectIds::new(DEFAULT_PROJECT_ID_RANGE, [DEFAULT_PROJECT_ID_RANGE.start]);
        let got: Vec<u32> = (0..200)
            .map(|_| ids.allocate(never_used).unwrap().commit())
            .collect();
        let unique: HashSet<u32> = got.iter().copied().collect();
        assert_eq!(unique.len(), got.len());
        assert!(got.iter().all(|id| DEFAULT_PROJECT_ID_RANGE.contains(id)));
        assert!(!unique.contains(&DEFAULT_PROJECT_ID_RANGE.start));
        // Lowest-first would give start+1, start+2, …: a neighbour's id is one more than yours.
        let neighbours = got
            .windows(2)
            .filter(|w| w[1].abs_diff(w[0]) < 1000)
            .count();
        assert!(
            neighbours < 5,
            "{neighbours} draws next to the previous one: {got:?}"
        );
        let (low, high) = (got.iter().min().unwrap(), got.iter().max().unwrap());
        let size = DEFAULT_PROJECT_ID_RANGE.end - DEFAULT_PROJECT_ID_RANGE.start;
        assert!(
            high - low > size / 2,
            "{low}..{high}: not spread over the range"
        );
        assert!(got.iter().all(|id| ids.is_held(*id)));
    }

    #[test]
    fn a_crowded_range_still_finds_its_last_free_id() {
        let ids = ProjectIds::new(10..1010, (10..1010).filter(|id| *id != 777));
        assert_eq!(ids.allocate(never_used).unwrap().commit(), 777);
        let err = ids.allocate(never_used).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        assert!(err.to_string().contains("10..1010"), "{err}");
        ids.release(500);
        assert!(!ids.is_held(500));
        assert_eq!(ids.allocate(never_used).unwrap().commit(), 500);
        // Releasing what nobody holds changes nothing.
        ids.release(5000);
        assert!(ids.allocate(never_used).is_err());
    }

    #[test]
    fn limited_ids_are_skipped_and_charged_ones_taken_only_for_want_of_unused_ones() {
        let ids = ProjectIds::new(1..1000, []);
        let odd_limited = |id: u32| {
            Ok(if !id.is_multiple_of(2) {
                IdUse::Limited
            } else {
                IdUse::Unused
            })
        };
        for _ in 0..50 {
            assert_eq!(ids.allocate(odd_limited).unwrap().commit() % 2, 0);
        }
        let even_charged = |id: u32| {
            Ok(if id.is_multiple_of(2) {
                IdUse::Charged
            } else {
                IdUse::Unused
            })
        };
        for _ in 0..50 {
            assert_eq!(ids.allocate(even_charged).unwrap().commit() % 2, 1);
        }
        // A tenant tagging every id cannot stop a create: tags reserve nothing.
        let all_charged = |_| Ok(IdUse::Charged);
        let id = ids.allocate(all_charged).unwrap().commit();
        assert!((1..1000).contains(&id));
        // Limits everywhere: someone else allocates from the range, and we say so.
        let err = ids.allocate(|_| Ok(IdUse::Limited)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        assert!(err.to_string().contains("another tool"), "{err}");
    }

    #[test]
    fn a_probe_error_is_returned_and_the_id_stays_available() {
        let ids = ProjectIds::new(1..2, []);
        let err = ids
            .allocate(|_| Err(io::Error::from_raw_os_error(libc::EIO)))
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO));
        assert!(!ids.is_held(1));
        assert_eq!(ids.allocate(never_used).unwrap().commit(), 1);
    }

    #[test]
    fn a_reserved_id_is_not_handed_out_until_its_lease_goes() {
        let ids = ProjectIds::new(1..4, [2]);
        assert!(ids.reserve(2).is_none(), "held by a record");
        assert!(ids.reserve(4).is_none(), "outside the range");
        let lease = ids.reserve(1).unwrap();
        assert!(ids.reserve(1).is_none(), "reserved twice");
        assert_eq!(ids.allocate(never_used).unwrap().commit(), 3);
        assert!(ids.allocate(never_used).is_err(), "1 is reserved");
        drop(lease);
        assert_eq!(ids.allocate(never_used).unwrap().id(), 1);
    }

    #[test]
    fn a_lease_dropped_without_commit_is_reusable() {
        let ids = ProjectIds::new(1..3, []);
        let lease = ids.allocate(never_used).unwrap();
        let first = lease.id();
        assert!(ids.is_held(first));
        // A live lease keeps its id, even against a stray release.
        ids.release(first);
        assert!(ids.is_held(first));
        let other = ids.allocate(never_used).unwrap().id(); // dropped at once
        assert_ne!(other, first);
        assert!(!ids.is_held(other));
        drop(lease);
        assert!(!ids.is_held(first));
        let both: HashSet<u32> = (0..2)
            .map(|_| ids.allocate(never_used).unwrap().commit())
            .collect();
        assert_eq!(both, HashSet::from([1, 2]));
    }

    #[test]
    fn concurrent_callers_never_get_the_same_id() {
        const THREADS: usize = 8;
        const EACH: usize = 200;
        let ids = ProjectIds::new(
            DEFAULT_PROJECT_ID_RANGE,
            [DEFAULT_PROJECT_ID_RANGE.start + 3],
        );
        let barrier = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let ids = ids.clone();
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut mine = Vec::new();
                    for i in 0..EACH {
                        let lease = ids.allocate(never_used).unwrap();
                        // Some leases are abandoned, some committed and later released.
                        match (t + i) % 4 {
                            0 => drop(lease),
                            1 => ids.release(lease.commit()),
                            _ => mine.push(lease.commit()),
                        }
                    }
                    mine
                })
            })
            .collect();
        let all: Vec<u32> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        let unique: HashSet<u32> = all.iter().copied().collect();
        assert_eq!(unique.len(), all.len(), "an id was handed out twice");
        assert!(!unique.contains(&(DEFAULT_PROJECT_ID_RANGE.start + 3)));
        assert!(all.iter().all(|id| ids.is_held(*id)));
    }

    #[test]
    #[should_panic(expected = "project 0")]
    fn project_zero_is_never_in_the_range() {
        ProjectIds::new(0..10, []);
    }
}
