//! A directory-tree walk that never follows a symlink and never crosses a mount point, in
//! memory bounded by constants of ours whatever shape a pod gave the tree.
//!
//! Works on directory file descriptors (openat with O_NOFOLLOW, statx without following), so a
//! symlink swapped in mid-walk cannot redirect it. It holds a single directory open at a time
//! (climbing back through "..", checked against the inode it left), so a pod's deep chain of
//! directories cannot exhaust our file descriptors. A directory's names are read in batches of
//! `BATCH_BYTES` (getdents64), and only the batch of the directory being visited is kept: a
//! level we descend from keeps just the position to resume its listing at (the kernel's
//! cookie), so a directory of millions of names costs no more than one of ten. The walk enters
//! at most `MAX_DEPTH` levels; below that a visitor may deal with the directory itself (see
//! `Visitor::too_deep`), or the walk fails with `WalkError::TooDeep`.
//!
//! Every walk ends, whatever the tree's owner does meanwhile. Resuming a listing at a cookie lets
//! a directory renamed while we walk appear again later in its parent's listing (a tenant told by
//! inotify that we entered a subtree renames it once per visit; seen: a 20,000-entry tree walked
//! 222 times). So a walk never enters a directory inode twice (it remembers up to
//! `MAX_REMEMBERED_DIRS` of them: a directory met again is skipped, as if it had vanished), and it
//! stops with `WalkError::Budget` once it has spent its `Budget` of entries or time.

use std::collections::{HashSet, VecDeque};
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

use super::fsstat::{self, FileId, Stat};

/// How many directory levels below its root a walk enters. Each level held costs a few
/// hundred bytes (its stat and name), so this bounds a walk's memory whatever the depth a pod
/// made; real trees stay far above it (PATH_MAX alone stops paths at ~2,000 levels).
pub const MAX_DEPTH: usize = 4096;

/// Directories a walk remembers having entered, to never enter one twice: ~40 bytes each at
/// most, so ~10 MiB. A tree with more directories is still walked; past this many, its
/// directories are no longer remembered and only the walk's budget bounds it.
pub const MAX_REMEMBERED_DIRS: usize = 1 << 18;

/// What one walk may spend: entries looked at (every name below the root, counted each time it is
/// met) and time. Both are far above what a real tree costs once; a walk that spends either is
/// stopped with `WalkError::Budget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub entries: u64,
    pub time: Duration,
}

impl Budget {
    /// Walks that carry data (copies, exports) or remove it: their time is the data's.
    pub const WHOLE_TREE: Budget = Budget {
        entries: 1 << 25,
        time: Duration::from_secs(24 * 3600),
    };
    /// Usage measurements (NodeGetVolumeStats, the admin listing): a walk holds one of its
    /// pool's few walk slots, so it may take minutes, not hours. (A walk visits ~200,000
    /// entries a second here: 33 million take under 3 minutes.)
    pub const MEASURE: Budget = Budget {
        entries: 1 << 25,
        time: Duration::from_secs(300),
    };
}

/// Bytes of directory entries read per getdents64 call: at most ~1,300 names (of 1 byte) or
/// ~120 (of 255) held at once.
const BATCH_BYTES: usize = 32 * 1024;

/// What to do at a directory that is another mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtMountPoint {
    /// Stop the walk with `WalkError::MountPoint`.
    Refuse,
    /// Report it as an entry but do not descend.
    Skip,
}

/// A tree beyond one of our documented bounds (too many hard links awaiting their names, a
/// file's xattrs too large): an io error the caller can tell from the host's own, since
/// retrying cannot help until the tree changes.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BeyondLimit(pub String);

pub fn beyond_limit(message: String) -> io::Error {
    io::Error::other(BeyondLimit(message))
}

pub fn is_beyond_limit(err: &io::Error) -> bool {
    err.get_ref().is_some_and(|inner| inner.is::<BeyondLimit>())
}

#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    #[error("{0} is a mount point")]
    MountPoint(PathBuf),
    #[error("{path} lies more than {limit} directory levels deep, more than stickyvol walks")]
    TooDeep { path: PathBuf, limit: usize },
    #[error(
        "the walk stopped at {path} after {entries} entries in {seconds} s, its budget: the tree \
         is larger than stickyvol walks, or is being reshaped while it is walked"
    )]
    Budget {
        path: PathBuf,
        entries: u64,
        seconds: u64,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl WalkError {
    /// Why the tree's owner made this walk fail, in short, if they did (deeper or larger than
    /// we walk, or past another bound of ours): walking again fails for as long as they like.
    /// None for the host's own failures, data that is gone, and a directory moved during one
    /// walk (an application's ordinary rename must not count against it).
    pub fn tree_made(&self) -> Option<String> {
        match self {
            WalkError::TooDeep { limit, .. } => Some(format!(
                "holds directories more than {limit} levels deep, more than stickyvol walks"
            )),
            WalkError::Budget {
                entries, seconds, ..
            } => Some(format!(
                "its walk stopped after {entries} entries in {seconds} s, its budget: the tree is \
                 larger than stickyvol walks, or is being reshaped while it is walked"
            )),
            WalkError::Io { source, .. } => is_beyond_limit(source).then(|| source.to_string()),
            // Measurements skip mounts, and a tenant cannot mount in its volume.
            WalkError::MountPoint(_) => None,
        }
    }
}

/// Callbacks of a walk. `parent` is an open descriptor of the directory holding `name`.
pub trait Visitor {
    /// Called for every entry below the root, before descending into it if it is a directory.
    fn entry(&mut self, parent: BorrowedFd<'_>, name: &CStr, stat: &Stat) -> io::Result<()>;
    /// Called after all entries of the directory `name` have been visited.
    fn leave_dir(&mut self, _parent: BorrowedFd<'_>, _name: &CStr) -> io::Result<()> {
        Ok(())
    }
    /// Called instead of descending into the directory `name` (already reported by `entry`)
    /// when it lies `MAX_DEPTH` levels down. True: the visitor dealt with it (e.g. moved it
    /// where a later walk reaches it) and the walk goes on; false: the walk fails with
    /// `WalkError::TooDeep`.
    fn too_deep(&mut self, _parent: BorrowedFd<'_>, _name: &CStr) -> io::Result<bool> {
        Ok(false)
    }
}

/// One directory level: who it is, its name in its parent, where its listing resumes.
struct Level {
    stat: Stat,
    name: Option<CString>,
    /// The cookie after the last entry taken from its listing (None: from the start).
    resume: Option<i64>,
    /// Whether its listing has been read to the end.
    listed: bool,
}

/// Walks everything below `root` (a directory, not followed if it is a symlink) within
/// `Budget::WHOLE_TREE`. Entries that vanish or change while we walk are skipped: the tree may
/// be in use.
pub fn walk(
    root: &Path,
    at_mount: AtMountPoint,
    visitor: &mut dyn Visitor,
) -> Result<(), WalkError> {
    walk_within(root, at_mount, Budget::WHOLE_TREE, visitor)
}

/// [`walk`] within `budget`.
pub fn walk_within(
    root: &Path,
    at_mount: AtMountPoint,
    budget: Budget,
    visitor: &mut dyn Visitor,
) -> Result<(), WalkError> {
    let root_stat = fsstat::lstat(root).map_err(io_error(root, &[]))?;
    if root_stat.is_mount_root && at_mount == AtMountPoint::Refuse {
        return Err(WalkError::MountPoint(root.to_path_buf()));
    }
    let mut current = open_dir(None, root.as_os_str().as_bytes()).map_err(io_error(root, &[]))?;
    let mut levels = vec![Level {
        stat: root_stat,
        name: None,
        resume: None,
        listed: false,
    }];
    // The unvisited names of the deepest level's current batch, with their cookies.
    let mut batch = Batch::new();
    let mut spent = Spending::new(budget);
    spent.enter(&root_stat);

    loop {
        let top = levels
            .last_mut()
            .expect("the root level is never popped early");
        if batch.names.is_empty() && !top.listed {
            let read = batch.read(&current, top.resume);
            let more = read.map_err(io_error(root, &levels))?;
            levels.last_mut().expect("just seen").listed = !more;
            continue;
        }
        let Some((name, cookie)) = batch.names.pop_front() else {
            let done = levels.pop().expect("just seen");
            let (Some(parent), Some(name)) = (levels.last(), done.name) else {
                return Ok(()); // the root is done
            };
            current = climb(&current, &parent.stat).map_err(io_error(root, &levels))?;
            visitor
                .leave_dir(current.as_fd(), &name)
                .map_err(io_error(root, &levels))?;
            continue;
        };
        top.resume = Some(cookie);
        if is_self_or_parent(&name) {
            continue;
        }
        let dir = current.as_fd();
        let visited = visit_entry(root, &levels, dir, &name, at_mount, &mut spent, visitor)?;
        let Some((child, stat)) = visited else {
            continue;
        };
        spent.enter(&stat);
        // The rest of this level's batch is read again from its cookie when we are back.
        batch.names.clear();
        levels.push(Level {
            stat,
            name: Some(name),
            resume: None,
            listed: false,
        });
        current = child;
    }
}

/// Counts the entry `name` against the budget, looks at it and hands it to the visitor. It
/// is in the deepest of the `levels` below `root`, open as `dir`. Returns the directory to
/// descend into, opened, and what it is; None when the walk stays at this level (not a
/// directory, a mount, met before, changed meanwhile, too deep for a visitor that dealt with it).
fn visit_entry(
    root: &Path,
    levels: &[Level],
    dir: BorrowedFd<'_>,
    name: &CStr,
    at_mount: AtMountPoint,
    spent: &mut Spending,
    visitor: &mut dyn Visitor,
) -> Result<Option<(OwnedFd, Stat)>, WalkError> {
    spent.entry(|| shown_path(root, levels, None))?;
    let stat = match fsstat::lstat_at(dir, name) {
        Ok(stat) => stat,
        Err(err) if changed_meanwhile(&err) => return Ok(None),
        Err(err) => return Err(io_error(root, levels)(err)),
    };
    if stat.is_dir() && spent.entered_before(&stat) {
        return Ok(None); // renamed since we walked it: met again at its new name
    }
    let is_mount = stat.is_dir() && stat.is_mount_root;
    if is_mount && at_mount == AtMountPoint::Refuse {
        return Err(WalkError::MountPoint(shown_path(root, levels, Some(name))));
    }
    visitor
        .entry(dir, name, &stat)
        .map_err(io_error(root, levels))?;
    if !stat.is_dir() || is_mount {
        return Ok(None);
    }
    if levels.len() > MAX_DEPTH {
        if visitor
            .too_deep(dir, name)
            .map_err(io_error(root, levels))?
        {
            return Ok(None);
        }
        return Err(WalkError::TooDeep {
            path: shown_path(root, levels, Some(name)),
            limit: MAX_DEPTH,
        });
    }
    let child = open_listed_dir(dir, name, &stat).map_err(io_error(root, levels))?;
    Ok(child.map(|child| (child, stat)))
}

/// Opens the directory `name` of `parent` if it still is the one listed as `listed`; None if it
/// vanished or something else was put in its place between the stat and the open.
pub(super) fn open_listed_dir(
    parent: BorrowedFd<'_>,
    name: &CStr,
    listed: &Stat,
) -> io::Result<Option<OwnedFd>> {
    let child = match open_dir(Some(parent), name.to_bytes()) {
        Ok(child) => child,
        Err(err) if changed_meanwhile(&err) => return Ok(None),
        Err(err) => return Err(err),
    };
    let opened = fsstat::stat_fd(child.as_fd())?;
    Ok(opened.same_file(listed).then_some(child))
}

/// What a walk has spent of its budget, and the directories it entered.
struct Spending {
    budget: Budget,
    started: Instant,
    entries: u64,
    entered: HashSet<FileId>,
}

impl Spending {
    fn new(budget: Budget) -> Spending {
        Spending {
            budget,
            started: Instant::now(),
            entries: 0,
            entered: HashSet::new(),
        }
    }

    /// Counts one entry; `WalkError::Budget` at the walk's current path (`path()`) once the
    /// budget is spent. The clock is read every 1,024 entries: a syscall-free check per entry.
    fn entry(&mut self, path: impl FnOnce() -> PathBuf) -> Result<(), WalkError> {
        self.entries += 1;
        let out_of_time =
            self.entries.is_multiple_of(1024) && self.started.elapsed() > self.budget.time;
        if self.entries > self.budget.entries || out_of_time {
            return Err(WalkError::Budget {
                path: path(),
                entries: self.entries,
                seconds: self.started.elapsed().as_secs(),
            });
        }
        Ok(())
    }

    fn enter(&mut self, dir: &Stat) {
        if self.entered.len() < MAX_REMEMBERED_DIRS {
            self.entered.insert(dir.id());
        }
    }

    fn entered_before(&self, dir: &Stat) -> bool {
        self.entered.contains(&dir.id())
    }
}

/// Names read from a directory, in the order the kernel lists them.
struct Batch {
    names: VecDeque<(CString, i64)>,
    buffer: Vec<u8>,
}

impl Batch {
    fn new() -> Batch {
        Batch {
            names: VecDeque::new(),
            buffer: vec![0; BATCH_BYTES],
        }
    }

    /// Reads the next names of `dir` from `resume` (a cookie of an earlier read of the same
    /// directory, through any descriptor; None: the start). False once the end is reached.
    fn read(&mut self, dir: &OwnedFd, resume: Option<i64>) -> io::Result<bool> {
        // SAFETY: lseek on a descriptor we own; a directory takes the cookies it handed out.
        if unsafe { libc::lseek(dir.as_raw_fd(), resume.unwrap_or(0), libc::SEEK_SET) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the buffer is writable for its length, the descriptor open for the call.
        let read = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir.as_raw_fd(),
                self.buffer.as_mut_ptr(),
                self.buffer.len(),
            )
        };
        if read < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut entries = &self.buffer[..read as usize];
        // struct linux_dirent64: u64 d_ino, i64 d_off, u16 d_reclen, u8 d_type, name NUL-ended.
        while entries.len() >= 19 {
            let cookie = i64::from_ne_bytes(entries[8..16].try_into().expect("8 bytes"));
            let length = usize::from(u16::from_ne_bytes([entries[16], entries[17]]));
            if length < 19 || length > entries.len() {
                return Err(io::Error::other(
                    "malformed directory entry from getdents64",
                ));
            }
            let name = CStr::from_bytes_until_nul(&entries[19..length])
                .map_err(|_| io::Error::other("unterminated name from getdents64"))?;
            // "." and ".." too: skipping them here would leave no cookie to resume after them.
            self.names.push_back((name.to_owned(), cookie));
            entries = &entries[length..];
        }
        Ok(read > 0)
    }
}

/// Opens ".." of `dir` and checks it is the directory we came from (not a moved-in stranger).
fn climb(dir: &OwnedFd, expected: &Stat) -> io::Result<OwnedFd> {
    let parent = open_dir(Some(dir.as_fd()), b"..")?;
    if fsstat::stat_fd(parent.as_fd())?.same_file(expected) {
        Ok(parent)
    } else {
        Err(io::Error::other(
            "a directory was moved out of the tree during the walk",
        ))
    }
}

/// Errors that mean "this entry changed since we listed it", not "the walk failed".
fn changed_meanwhile(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
    )
}

/// Whether `path` is a directory (not a symlink to one) without entries.
pub fn is_empty_dir(path: &Path) -> io::Result<bool> {
    match open_dir(None, path.as_os_str().as_bytes()) {
        Ok(fd) => has_no_entries(fd.as_fd()),
        Err(err) if matches!(err.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => Ok(false),
        Err(err) => Err(err),
    }
}

/// Whether the directory open at `dir` has no entries (listed from its start, through a
/// descriptor of its own).
pub fn has_no_entries(dir: BorrowedFd<'_>) -> io::Result<bool> {
    let mut dir = Dir::from_fd(open_dir(Some(dir), b".")?)?;
    for entry in dir.iter() {
        if !is_self_or_parent(entry?.file_name()) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// "." or "..", which every directory lists.
fn is_self_or_parent(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

fn open_dir(parent: Option<BorrowedFd<'_>>, name: &[u8]) -> io::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd: Result<OwnedFd, Errno> = match parent {
        Some(parent) => openat(parent, name, flags, Mode::empty()),
        None => nix::fcntl::open(name, flags, Mode::empty()),
    };
    fd.map_err(io::Error::from)
}

fn io_error<'a>(root: &'a Path, levels: &'a [Level]) -> impl FnOnce(io::Error) -> WalkError + 'a {
    move |source| WalkError::Io {
        path: shown_path(root, levels, None),
        source,
    }
}

/// The path of the current directory (and `leaf`) for messages, shortened in deep trees.
fn shown_path(root: &Path, levels: &[Level], leaf: Option<&CStr>) -> PathBuf {
    const SHOWN_LEVELS: usize = 8;
    let names: Vec<&CStr> = levels
        .iter()
        .filter_map(|l| l.name.as_deref())
        .chain(leaf)
        .collect();
    let mut path = root.to_path_buf();
    if names.len() > SHOWN_LEVELS {
        path.push(format!("…{} levels…", names.len() - SHOWN_LEVELS));
    }
    let skip = names.len().saturating_sub(SHOWN_LEVELS);
    for name in &names[skip..] {
        path.push(OsStr::from_bytes(name.to_bytes()));
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// Records how many entries it saw and the highest descriptor number it was handed.
    #[derive(Default)]
    struct Probe {
        entries: usize,
        highest_fd: i32,
    }

    impl Visitor for Probe {
        fn entry(&mut self, parent: BorrowedFd<'_>, _: &CStr, _: &Stat) -> io::Result<()> {
            self.entries += 1;
            self.highest_fd = self.highest_fd.max(parent.as_raw_fd());
            Ok(())
        }
    }

    /// A chain of `depth` directories below `root`, made relative to each level (no PATH_MAX).
    fn chain(root: &Path, depth: usize) {
        let mut dir = open_dir(None, root.as_os_str().as_bytes()).unwrap();
        for _ in 0..depth {
            nix::sys::stat::mkdirat(dir.as_fd(), "d", Mode::from_bits_truncate(0o755)).unwrap();
            dir = open_dir(Some(dir.as_fd()), b"d").unwrap();
        }
        std::fs::write(format!("/proc/self/fd/{}/leaf", dir.as_raw_fd()), b"x").unwrap();
    }

    /// A directory of `files` empty files.
    fn flat(files: usize) -> tempfile::TempDir {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        for i in 0..files {
            std::fs::write(dir.path().join(i.to_string()), b"").unwrap();
        }
        dir
    }

    #[test]
    fn a_walk_stops_once_it_has_spent_its_entries() {
        let dir = flat(100);
        let budget = Budget {
            entries: 10,
            time: Duration::from_secs(60),
        };
        let mut probe = Probe::default();
        let err = walk_within(dir.path(), AtMountPoint::Refuse, budget, &mut probe).unwrap_err();
        let WalkError::Budget { entries, .. } = err else {
            panic!("expected a spent budget, got {err}");
        };
        assert_eq!(entries, 11, "the entry past the budget stops it");
        assert!(
            probe.entries <= 10,
            "the visitor saw {} entries",
            probe.entries
        );
        let whole = Budget {
            entries: 100,
            ..budget
        };
        walk_within(
            dir.path(),
            AtMountPoint::Refuse,
            whole,
            &mut Probe::default(),
        )
        .expect("100 names fit a budget of 100 ('.' and '..' are not counted)");
    }

    #[test]
    fn a_walk_stops_once_it_has_spent_its_time() {
        let dir = flat(3000);
        let budget = Budget {
            entries: u64::MAX,
            time: Duration::ZERO,
        };
        let err = walk_within(
            dir.path(),
            AtMountPoint::Refuse,
            budget,
            &mut Probe::default(),
        )
        .unwrap_err();
        assert!(
            matches!(err, WalkError::Budget { entries: 1024, .. }),
            "the clock is read every 1,024 entries: {err}"
        );
        assert!(err.to_string().contains("its budget"), "{err}");
    }

    #[test]
    fn only_an_empty_directory_itself_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(is_empty_dir(&empty).unwrap());
        std::os::unix::fs::symlink(&empty, dir.path().join("link")).unwrap();
        assert!(
            !is_empty_dir(&dir.path().join("link")).unwrap(),
            "not followed"
        );
        std::fs::write(empty.join("file"), b"x").unwrap();
        assert!(!is_empty_dir(&empty).unwrap());
        assert!(!is_empty_dir(&empty.join("file")).unwrap(), "a file");
        assert!(is_empty_dir(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn deep_trees_use_one_descriptor_not_one_per_level() {
        let dir = tempfile::tempdir().unwrap();
        chain(dir.path(), 3000);
        let mut probe = Probe::default();
        walk(dir.path(), AtMountPoint::Refuse, &mut probe).unwrap();
        assert_eq!(probe.entries, 3001);
        // One descriptor per level would reach past 3000.
        assert!(
            probe.highest_fd < 1000,
            "descriptor {} in use",
            probe.highest_fd
        );
        super::super::safe_delete::remove_all(&dir.path().join("d")).unwrap();
        assert!(!dir.path().join("d").exists());
    }

    /// Every entry's path below the root, in visiting order.
    #[derive(Default)]
    struct Paths {
        stack: Vec<String>,
        seen: Vec<String>,
        left: Vec<String>,
    }

    impl Visitor for Paths {
        fn entry(&mut self, _: BorrowedFd<'_>, name: &CStr, stat: &Stat) -> io::Result<()> {
            let mut path = self.stack.join("/");
            if !path.is_empty() {
                path.push('/');
            }
            path.push_str(name.to_str().unwrap());
            self.seen.push(path);
            if stat.is_dir() {
                self.stack.push(name.to_str().unwrap().to_owned());
            }
            Ok(())
        }
        fn leave_dir(&mut self, _: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
            assert_eq!(self.stack.pop().as_deref(), name.to_str().ok());
            self.left.push(name.to_str().unwrap().to_owned());
            Ok(())
        }
    }

    #[test]
    fn wide_directories_are_listed_in_batches_and_every_name_is_met_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let long = "n".repeat(200);
        let mut expected = Vec::new();
        // Far more names than one batch holds, with directories among them, so the walk leaves
        // the wide directory's listing mid-batch many times and resumes it from its cookie.
        for i in 0..3000 {
            let name = format!("{i}-{long}");
            if i % 10 == 0 {
                std::fs::create_dir(root.join(&name)).unwrap();
                std::fs::write(root.join(&name).join("inner"), b"x").unwrap();
                expected.push(format!("{name}/inner"));
            } else {
                std::fs::write(root.join(&name), b"x").unwrap();
            }
            expected.push(name);
        }
        let mut paths = Paths::default();
        walk(root, AtMountPoint::Refuse, &mut paths).unwrap();
        assert_eq!(paths.left.len(), 300);
        let mut seen = paths.seen;
        seen.sort();
        expected.sort();
        assert_eq!(seen, expected);
    }

    /// Counts the directories it was handed below the depth limit; moves each aside if asked.
    struct TooDeep {
        met: usize,
        move_to: Option<OwnedFd>,
    }

    impl Visitor for TooDeep {
        fn entry(&mut self, _: BorrowedFd<'_>, _: &CStr, _: &Stat) -> io::Result<()> {
            Ok(())
        }
        fn too_deep(&mut self, parent: BorrowedFd<'_>, name: &CStr) -> io::Result<bool> {
            self.met += 1;
            let Some(to) = &self.move_to else {
                return Ok(false);
            };
            nix::fcntl::renameat(parent, name, to.as_fd(), "moved")?;
            Ok(true)
        }
    }

    #[test]
    fn walks_stop_at_the_depth_limit_unless_the_visitor_deals_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        chain(&root, MAX_DEPTH + 3);
        let mut refuse = TooDeep {
            met: 0,
            move_to: None,
        };
        let err = walk(&root, AtMountPoint::Refuse, &mut refuse).unwrap_err();
        assert!(
            matches!(
                err,
                WalkError::TooDeep {
                    limit: MAX_DEPTH,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(refuse.met, 1);

        let aside = dir.path().join("aside");
        std::fs::create_dir(&aside).unwrap();
        let mut move_aside = TooDeep {
            met: 0,
            move_to: Some(open_dir(None, aside.as_os_str().as_bytes()).unwrap()),
        };
        walk(&root, AtMountPoint::Refuse, &mut move_aside).unwrap();
        assert_eq!(move_aside.met, 1);
        // What lay below the limit is now a short chain of its own.
        let mut probe = Probe::default();
        walk(&aside, AtMountPoint::Refuse, &mut probe).unwrap();
        assert_eq!(
            probe.entries, 4,
            "moved, its 2 levels below and the leaf file"
        );
        super::super::safe_delete::remove_all(dir.path()).unwrap();
    }

    #[test]
    fn error_paths_are_shortened_in_deep_trees() {
        let levels: Vec<Level> = (0..20)
            .map(|i| Level {
                stat: fsstat::lstat(Path::new("/")).unwrap(),
                name: (i > 0).then(|| CString::new(format!("d{i}")).unwrap()),
                resume: None,
                listed: false,
            })
            .collect();
        let shown = shown_path(Path::new("/v"), &levels, Some(c"leaf"));
        assert!(shown.starts_with("/v"));
        assert!(shown.ends_with("d19/leaf"));
        assert!(shown.as_os_str().len() < 80, "{}", shown.display());
    }
}
