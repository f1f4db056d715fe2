//! Faithful copies of a volume's data, for CSI snapshots, restores and clones: every file type,
//! owners, modes, nanosecond times, xattrs (ACLs included) and hard links, with file data shared
//! copy-on-write (FICLONE) where the filesystem allows and copied hole by hole elsewhere.
//!
//! The source may be in use by a pod, which can plant symlinks and mounts in it: it is read
//! through `tree::walk` (directory descriptors, O_NOFOLLOW, stops at mount points). The copy is
//! written only with *at calls relative to directory descriptors opened from `dest` downwards, so
//! nothing outside `dest` is ever written. Neither side holds more than a few descriptors
//! however deep the tree, and memory is bounded whatever the tree's shape: the walk's own
//! bounds (`tree`), a few words per hard-linked file awaiting its other names (capped, see
//! `links`; later names are linked from a spare name in a stash, never from a path), and one
//! inode's xattrs at a time (`meta::MAX_XATTR_BYTES`).
//!
//! Not copied: inode flags (chattr), the project id and other fsxattr fields (the caller sets
//! those on `dest` for its quota), and ctime/btime, which no call can set.

use std::ffi::{CStr, CString, OsStr};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat, readlinkat};
use nix::sys::stat::{Mode, SFlag, mkdirat, mknodat};
use nix::unistd::{UnlinkatFlags, Whence, lseek, symlinkat, unlinkat};

use super::fsstat::{self, Stat};
use super::links::{LinkBook, LinkStash};
use super::meta::{HeldMeta, Meta, Node, apply_meta, read_meta};
use super::tree::{self, AtMountPoint, Visitor, WalkError};

/// How file data is carried over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataMode {
    /// FICLONE each regular file (shares extents: O(1) per file); where the filesystem refuses
    /// (EOPNOTSUPP, EXDEV, EINVAL, ETXTBSY, ...) for a file, Copy that file instead.
    Reflink,
    /// copy_file_range of the data segments only (SEEK_DATA/SEEK_HOLE): holes stay holes.
    /// Beware: within one btrfs or XFS filesystem the kernel itself answers copy_file_range
    /// with a clone, so the copy shares extents there too (and `copied_bytes` overstates).
    Copy,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CopyReport {
    /// Entries created (all types, hard links included, the destination root not).
    pub files: u64,
    /// Bytes of non-hole data carried (cloned or copied).
    pub data_bytes: u64,
    /// Of which physically copied (not shared by a reflink).
    pub copied_bytes: u64,
}

/// Cancellation / progress hook: return false to stop. Called before each entry and after
/// every 8 MiB of copied data.
pub trait Progress {
    fn keep_going(&mut self, report: &CopyReport) -> bool;
}

/// Never stops a copy.
#[derive(Debug, Clone, Copy, Default)]
pub struct Always;

impl Progress for Always {
    fn keep_going(&mut self, _report: &CopyReport) -> bool {
        true
    }
}

impl<F: FnMut(&CopyReport) -> bool> Progress for F {
    fn keep_going(&mut self, report: &CopyReport) -> bool {
        self(report)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// A mount point in the source, or an I/O error with the path it concerns (ENOSPC and
    /// EDQUOT keep their raw errno).
    #[error(transparent)]
    Walk(#[from] WalkError),
    #[error("copy cancelled")]
    Cancelled,
}

/// How often the progress hook hears about copied data; also the longest single copy call.
const PROGRESS_EVERY: u64 = 8 << 20;
/// The buffer of the read/write fallback, for filesystems without copy_file_range.
const BUFFER_BYTES: usize = 1 << 20;

/// Copies the tree below `source` (a directory, refused if it is a symlink or a mount point)
/// into `dest`, an existing empty directory made by the caller (maybe a btrfs subvolume or one
/// with a project quota id, so it is not recreated: it gets the source root's owner, mode,
/// xattrs and times, last, but keeps its project id). Stops with `WalkError::MountPoint` at a
/// mount point inside the source. Nothing is fsync'ed: call [`sync_filesystem`] afterwards. On
/// error or cancellation the partial copy stays for the caller to remove.
pub fn copy_tree(
    source: &Path,
    dest: &Path,
    mode: DataMode,
    progress: &mut dyn Progress,
) -> Result<CopyReport, CopyError> {
    let mut walker = Naming::new(Copier::new(source, dest, mode, progress)?);
    if let Err(err) = tree::walk(source, AtMountPoint::Refuse, &mut walker) {
        let err = walker.explain(err);
        return Err(walker.visitor.explain(err));
    }
    let copier = &mut walker.visitor;
    copier.finish().map_err(failed_at(dest))?;
    Ok(copier.mover.report)
}

/// Copies one regular file (a block volume's image) to `dest`, which must not exist (it is
/// created with mode 0600; AlreadyExists otherwise). Reflink: one FICLONE of the whole file,
/// falling back to Copy; Copy: the data segments, then the source's length, so size and holes
/// match. The new file is fsync'ed before returning, and removed again on error or
/// cancellation.
pub fn copy_file(
    source: &Path,
    dest: &Path,
    mode: DataMode,
    progress: &mut dyn Progress,
) -> Result<CopyReport, CopyError> {
    let (input, stat) = open_regular(source, OpenOptions::new().read(true), 0)?;
    let mut mover = Mover::new(mode, progress);
    if mover.keep_going().is_err() {
        return Err(CopyError::Cancelled);
    }
    let output = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dest)
        .map_err(failed_at(dest))?;
    let carried = mover
        .carry(
            &input,
            &output,
            stat.len(),
            stat.blocks().saturating_mul(512),
        )
        .and_then(|()| output.sync_all().map_err(|err| (Side::Dest, err)));
    match carried {
        Ok(()) => {
            mover.report.files = 1;
            Ok(mover.report)
        }
        Err((side, err)) => {
            drop(output);
            // We created it (create_new), so it is ours to take back.
            let _ = std::fs::remove_file(dest);
            if mover.cancelled {
                return Err(CopyError::Cancelled);
            }
            let path = match side {
                Side::Source => source,
                Side::Dest => dest,
            };
            Err(failed_at(path)(err).into())
        }
    }
}

/// Flushes everything written below `dir` to disk: syncfs(2) on the filesystem holding `dir`.
pub fn sync_filesystem(dir: &Path) -> io::Result<()> {
    let dir = File::open(dir)?;
    nix::unistd::syncfs(&dir)?;
    Ok(())
}

pub(super) fn failed_at(path: &Path) -> impl FnOnce(io::Error) -> WalkError + '_ {
    move |source| WalkError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Opens `path` with `options` and `flags` (not following a symlink) and checks that it is a
/// regular file.
pub(super) fn open_regular(
    path: &Path,
    options: &mut OpenOptions,
    flags: i32,
) -> Result<(File, std::fs::Metadata), WalkError> {
    let file = options
        .custom_flags(libc::O_NOFOLLOW | flags)
        .open(path)
        .map_err(failed_at(path))?;
    let stat = file.metadata().map_err(failed_at(path))?;
    if !stat.is_file() {
        let err = io::Error::new(io::ErrorKind::InvalidInput, "not a regular file");
        return Err(failed_at(path)(err));
    }
    Ok((file, stat))
}

/// Refuses a destination that already holds something: we would mix two trees.
pub(super) fn check_empty(dir: &OwnedFd) -> io::Result<()> {
    // Through our descriptor, so it is the directory we opened without following links.
    if tree::has_no_entries(dir.as_fd())? {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::ENOTEMPTY))
    }
}

/// Refuses a destination that is the source or lies inside it (the copy would copy itself),
/// checked up front by climbing from the destination to `/`, before anything is written.
fn check_apart(source: &Stat, dest: &OwnedFd) -> io::Result<()> {
    let mut dir = dest.try_clone()?;
    let mut stat = fsstat::stat_fd(dir.as_fd())?;
    loop {
        if source.same_file(&stat) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the destination is the source or inside it",
            ));
        }
        let up = open_dir(Some(dir.as_fd()), OsStr::new(".."))?;
        let up_stat = fsstat::stat_fd(up.as_fd())?;
        if up_stat.same_file(&stat) {
            return Ok(()); // `/` is its own parent
        }
        (dir, stat) = (up, up_stat);
    }
}

/// Opens a directory without following a symlink in its last component.
pub(super) fn open_dir(parent: Option<BorrowedFd<'_>>, name: &OsStr) -> io::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let opened = match parent {
        Some(dir) => openat(dir, name, flags, Mode::empty()),
        None => nix::fcntl::open(name, flags, Mode::empty()),
    };
    Ok(opened?)
}

/// Errors of a source entry that was removed or replaced since the walk listed it.
pub(super) fn vanished(err: &io::Error) -> bool {
    let errno = err.raw_os_error().unwrap_or(0);
    errno == libc::ENOENT || errno == libc::ENOTDIR || errno == libc::ELOOP
}

// ---------------------------------------------------------------------------------------------
// File data

/// Which file an I/O error concerns.
#[derive(Debug, Clone, Copy)]
enum Side {
    Source,
    Dest,
}

type Blamed = (Side, io::Error);

/// Carries file data and keeps the tally; shared by `copy_tree` and `copy_file`.
struct Mover<'p> {
    mode: DataMode,
    progress: &'p mut dyn Progress,
    report: CopyReport,
    /// Copied bytes the progress hook has not heard about yet.
    unreported: u64,
    /// For the read/write fallback; allocated on first use.
    buffer: Vec<u8>,
    cancelled: bool,
}

impl<'p> Mover<'p> {
    fn new(mode: DataMode, progress: &'p mut dyn Progress) -> Self {
        Mover {
            mode,
            progress,
            report: CopyReport::default(),
            unreported: 0,
            buffer: Vec::new(),
            cancelled: false,
        }
    }

    fn keep_going(&mut self) -> io::Result<()> {
        self.unreported = 0;
        if self.progress.keep_going(&self.report) {
            return Ok(());
        }
        self.cancelled = true;
        Err(io::Error::other("copy cancelled"))
    }

    /// Fills `output` (new and empty) with the data of `input`, `size` bytes long, of which
    /// about `allocated` on disk.
    fn carry(
        &mut self,
        input: &File,
        output: &File,
        size: u64,
        allocated: u64,
    ) -> Result<(), Blamed> {
        if size == 0 {
            return Ok(());
        }
        if self.mode == DataMode::Reflink {
            match clone_file(input, output) {
                Ok(()) => {
                    self.report.data_bytes += allocated.min(size);
                    return Ok(());
                }
                Err(err) if clone_refused(&err) => {}
                Err(err) => return Err((Side::Dest, err)),
            }
        }
        let mut in_kernel = true;
        let mut offset = 0;
        while offset < size {
            let Some((start, end)) =
                next_data(input, offset, size).map_err(|err| (Side::Source, err))?
            else {
                break;
            };
            self.copy_range(input, output, start, end, &mut in_kernel)?;
            offset = end;
        }
        // Trailing holes (and a source that shrank meanwhile) read back as zeros.
        output.set_len(size).map_err(|err| (Side::Dest, err))
    }

    /// Copies bytes [start, end) to the same offsets; `in_kernel` turns false, for the rest of
    /// the file, once copy_file_range turns out unusable here.
    fn copy_range(
        &mut self,
        input: &File,
        output: &File,
        start: u64,
        end: u64,
        in_kernel: &mut bool,
    ) -> Result<(), Blamed> {
        let mut position = start;
        while position < end {
            let wanted = (end - position).min(PROGRESS_EVERY);
            let done = if *in_kernel {
                match kernel_copy(input, output, position, wanted) {
                    Ok(done) => done,
                    Err(err) if kernel_copy_refused(&err) => {
                        *in_kernel = false;
                        continue;
                    }
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                    Err(err) => return Err((Side::Dest, err)),
                }
            } else {
                self.copy_through_buffer(input, output, position, wanted)?
            };
            if done == 0 {
                break; // the source shrank under us
            }
            position += done;
            self.report.data_bytes += done;
            self.report.copied_bytes += done;
            self.unreported += done;
            if self.unreported >= PROGRESS_EVERY {
                self.keep_going().map_err(|err| (Side::Dest, err))?;
            }
        }
        Ok(())
    }

    fn copy_through_buffer(
        &mut self,
        input: &File,
        output: &File,
        position: u64,
        wanted: u64,
    ) -> Result<u64, Blamed> {
        if self.buffer.is_empty() {
            self.buffer = vec![0; BUFFER_BYTES];
        }
        let len = self.buffer.len().min(wanted as usize);
        let got = loop {
            match input.read_at(&mut self.buffer[..len], position) {
                Ok(got) => break got,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => return Err((Side::Source, err)),
            }
        };
        output
            .write_all_at(&self.buffer[..got], position)
            .map_err(|err| (Side::Dest, err))?;
        Ok(got as u64)
    }
}

/// The next stretch of data at or after `from`, holes skipped, clipped to `size`; None when
/// only holes remain.
pub(super) fn next_data(file: &File, from: u64, size: u64) -> io::Result<Option<(u64, u64)>> {
    let start = match lseek(file, from as libc::off_t, Whence::SeekData) {
        Ok(start) => start as u64,
        Err(Errno::ENXIO) => return Ok(None),
        // The filesystem cannot tell holes: all of it is data.
        Err(Errno::EINVAL) => return Ok(Some((from, size))),
        Err(err) => return Err(err.into()),
    };
    if start >= size {
        return Ok(None);
    }
    match lseek(file, start as libc::off_t, Whence::SeekHole) {
        Ok(end) => Ok(Some((start, (end as u64).min(size)))),
        Err(Errno::ENXIO) => Ok(None), // truncated meanwhile
        Err(err) => Err(err.into()),
    }
}

/// One copy_file_range(2) call at the same offset in both files; returns the bytes copied.
fn kernel_copy(input: &File, output: &File, offset: u64, len: u64) -> io::Result<u64> {
    let mut offset_in = offset as libc::loff_t;
    let mut offset_out = offset_in;
    // SAFETY: both descriptors are open for the call; the offsets are valid, writable loff_t
    // values that the kernel advances instead of the file positions.
    let copied = unsafe {
        libc::copy_file_range(
            input.as_raw_fd(),
            &mut offset_in,
            output.as_raw_fd(),
            &mut offset_out,
            len as usize,
            0,
        )
    };
    if copied < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(copied as u64)
}

/// copy_file_range errors that mean "not between these files": read and write instead.
fn kernel_copy_refused(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
    )
}

/// Makes `output` share all of `input`'s extents (FICLONE).
fn clone_file(input: &File, output: &File) -> io::Result<()> {
    // SAFETY: both descriptors are open for the call; FICLONE reads nothing but its integer
    // argument, the source descriptor.
    let rc = unsafe { libc::ioctl(output.as_raw_fd(), libc::FICLONE, input.as_raw_fd()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// FICLONE errors that mean "no sharing for this file here": copy it instead.
fn clone_refused(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(
            libc::EOPNOTSUPP
                | libc::EXDEV
                | libc::EINVAL
                | libc::ETXTBSY
                | libc::ENOTTY
                | libc::ENOSYS
        )
    )
}

// ---------------------------------------------------------------------------------------------
// The tree

/// A source directory being copied, from the root down to the one whose entries the walk is
/// visiting.
struct Level {
    source: Stat,
    /// Its copy, to check each climb back up.
    dest: Stat,
    /// Applied once its entries are all copied (the root's: `Copier::root_meta`).
    meta: Option<HeldMeta>,
}

/// A directory just reported and copied empty: the walk enters it next, unless it vanished or
/// was swapped meanwhile. The next callback tells which.
struct Pending {
    source: Stat,
    name: CString,
    meta: Meta,
}

struct Copier<'p> {
    mover: Mover<'p>,
    dest_root: OwnedFd,
    /// The copy of the directory whose entries the walk is visiting.
    dest_dir: OwnedFd,
    levels: Vec<Level>,
    /// The source root's metadata, applied last.
    root_meta: Meta,
    pending: Option<Pending>,
    /// Inodes with more names to come: the number of the copy's spare name in `stash`.
    linked: LinkBook<((u32, u32), u64), u64>,
    stash: LinkStash,
}

impl Visitor for Copier<'_> {
    fn entry(&mut self, parent: BorrowedFd<'_>, name: &CStr, stat: &Stat) -> io::Result<()> {
        self.visit(parent, name, stat)
    }

    fn leave_dir(&mut self, parent: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
        self.leave(parent, name)
    }
}

/// Runs a visitor and keeps the name of the entry whose callback failed: the walk's own error
/// names only the directory.
pub(super) struct Naming<V> {
    pub(super) visitor: V,
    failed_name: Option<CString>,
}

impl<V> Naming<V> {
    pub(super) fn new(visitor: V) -> Self {
        Naming {
            visitor,
            failed_name: None,
        }
    }

    /// The walk's error with the failed entry added to its path, where known.
    pub(super) fn explain(&mut self, err: WalkError) -> WalkError {
        match (err, self.failed_name.take()) {
            (WalkError::Io { path, source }, Some(name)) => WalkError::Io {
                path: path.join(OsStr::from_bytes(name.to_bytes())),
                source,
            },
            (err, _) => err,
        }
    }
}

impl<V: Visitor> Visitor for Naming<V> {
    fn entry(&mut self, parent: BorrowedFd<'_>, name: &CStr, stat: &Stat) -> io::Result<()> {
        let result = self.visitor.entry(parent, name, stat);
        if result.is_err() {
            self.failed_name = Some(name.to_owned());
        }
        result
    }

    fn leave_dir(&mut self, parent: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
        let result = self.visitor.leave_dir(parent, name);
        if result.is_err() {
            self.failed_name = Some(name.to_owned());
        }
        result
    }
}

impl<'p> Copier<'p> {
    /// Checks both roots and reads the source root's metadata, before the walk lists it (which
    /// may update its atime).
    fn new(
        source: &Path,
        dest: &Path,
        mode: DataMode,
        progress: &'p mut dyn Progress,
    ) -> Result<Self, WalkError> {
        let source_root = open_dir(None, source.as_os_str()).map_err(failed_at(source))?;
        let source_stat = fsstat::stat_fd(source_root.as_fd()).map_err(failed_at(source))?;
        let root_meta = read_meta(Node::Open(source_root.as_fd())).map_err(failed_at(source))?;
        let dest_root = open_dir(None, dest.as_os_str()).map_err(failed_at(dest))?;
        let dest_stat = fsstat::stat_fd(dest_root.as_fd()).map_err(failed_at(dest))?;
        check_empty(&dest_root)
            .and_then(|()| check_apart(&source_stat, &dest_root))
            .map_err(failed_at(dest))?;
        Ok(Copier {
            mover: Mover::new(mode, progress),
            dest_dir: dest_root.try_clone().map_err(failed_at(dest))?,
            dest_root,
            levels: vec![Level {
                source: source_stat,
                dest: dest_stat,
                meta: None,
            }],
            root_meta,
            pending: None,
            linked: LinkBook::new(),
            stash: LinkStash::new(),
        })
    }

    /// After the walk: the root's own metadata, last, so nothing moves its times again.
    fn finish(&mut self) -> io::Result<()> {
        // A directory reported last at the top level and then not entered (it vanished).
        if let Some(pending) = self.pending.take() {
            self.abandon(&pending.name)?;
        }
        self.stash.remove(self.dest_root.as_fd())?;
        apply_meta(Node::Open(self.dest_root.as_fd()), &self.root_meta)
    }

    fn visit(&mut self, parent: BorrowedFd<'_>, name: &CStr, stat: &Stat) -> io::Result<()> {
        if let Some(pending) = self.pending.take() {
            if fsstat::stat_fd(parent)?.same_file(&pending.source) {
                self.descend(pending)?;
            } else {
                self.abandon(&pending.name)?;
            }
        }
        self.mover.keep_going()?;
        let hard_linked = stat.links > 1 && !stat.is_dir();
        if hard_linked && self.link_again(stat, name)? {
            self.mover.report.files += 1;
            return Ok(());
        }
        let copied = match stat.mode & libc::S_IFMT {
            libc::S_IFDIR => self.start_dir(parent, name, stat),
            libc::S_IFREG => self.copy_regular(parent, name, stat),
            _ => self.copy_node(parent, name, stat),
        }?;
        if copied {
            self.mover.report.files += 1;
            if hard_linked {
                let number = self.mover.report.files;
                self.linked
                    .first((stat.dev, stat.ino), number, u64::from(stat.links - 1))?;
                let dest = (self.dest_dir.as_fd(), name);
                self.stash.keep(self.dest_root.as_fd(), number, dest)?;
            }
        }
        Ok(())
    }

    fn leave(&mut self, parent: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
        if let Some(pending) = self.pending.take() {
            let top = &self.levels.last().expect("the root level stays").source;
            if fsstat::stat_fd(parent)?.same_file(top) {
                // Entered and left at once: it was empty.
                return apply_meta(
                    Node::At(self.dest_dir.as_fd(), &pending.name),
                    &pending.meta,
                );
            }
            self.abandon(&pending.name)?;
        }
        let done = self
            .levels
            .pop()
            .expect("leave_dir only for entered directories");
        let up = open_dir(Some(self.dest_dir.as_fd()), OsStr::new(".."))?;
        let expected = &self.levels.last().expect("the root is never left").dest;
        if !fsstat::stat_fd(up.as_fd())?.same_file(expected) {
            return Err(io::Error::other("the copy was moved while being written"));
        }
        self.dest_dir = up;
        let held = done
            .meta
            .expect("only the root has none, and it is never left");
        let meta = held.complete(parent, name)?;
        apply_meta(Node::At(self.dest_dir.as_fd(), name), &meta)
    }

    fn descend(&mut self, pending: Pending) -> io::Result<()> {
        let name = OsStr::from_bytes(pending.name.to_bytes());
        let child = open_dir(Some(self.dest_dir.as_fd()), name)?;
        let dest = fsstat::stat_fd(child.as_fd())?;
        self.dest_dir = child;
        self.levels.push(Level {
            source: pending.source,
            dest,
            meta: Some(HeldMeta::hold(pending.meta)),
        });
        Ok(())
    }

    /// Removes the copy of a directory that vanished from the source before the walk entered it.
    fn abandon(&mut self, name: &CStr) -> io::Result<()> {
        unlinkat(self.dest_dir.as_fd(), name, UnlinkatFlags::RemoveDir)?;
        self.mover.report.files -= 1;
        Ok(())
    }

    /// Gives the copy of an inode met before another name; false if this is its first name.
    fn link_again(&mut self, stat: &Stat, name: &CStr) -> io::Result<bool> {
        let Some((number, last)) = self.linked.again(&(stat.dev, stat.ino)) else {
            return Ok(false);
        };
        self.stash
            .link(number, (self.dest_dir.as_fd(), name), last)?;
        Ok(true)
    }

    /// Creates an empty copy of a directory; its metadata waits until its content is copied.
    fn start_dir(&mut self, parent: BorrowedFd<'_>, name: &CStr, stat: &Stat) -> io::Result<bool> {
        if stat.same_file(&self.levels[0].dest) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the destination is inside the source",
            ));
        }
        let Some(meta) = source_meta(parent, name, stat)? else {
            return Ok(false);
        };
        mkdirat(self.dest_dir.as_fd(), name, Mode::S_IRWXU)?;
        self.pending = Some(Pending {
            source: *stat,
            name: name.to_owned(),
            meta,
        });
        Ok(true)
    }

    fn copy_regular(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &CStr,
        stat: &Stat,
    ) -> io::Result<bool> {
        let Some(input) = open_source_file(parent, name, stat)? else {
            return Ok(false);
        };
        let meta = read_meta(Node::Open(input.as_fd()))?;
        if !meta.is(stat) {
            return Ok(false);
        }
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let output = File::from(openat(
            self.dest_dir.as_fd(),
            name,
            flags,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )?);
        self.mover
            .carry(&input, &output, meta.size, meta.allocated)
            .map_err(|(_, err)| err)?;
        apply_meta(Node::Open(output.as_fd()), &meta)?;
        Ok(true)
    }

    /// Symlinks (their target bytes as they are), fifos, sockets and device nodes (these need
    /// CAP_MKNOD).
    fn copy_node(&mut self, parent: BorrowedFd<'_>, name: &CStr, stat: &Stat) -> io::Result<bool> {
        let Some(meta) = source_meta(parent, name, stat)? else {
            return Ok(false);
        };
        if stat.is_symlink() {
            let target = match readlinkat(parent, name) {
                // EINVAL: no longer a symlink.
                Err(Errno::ENOENT | Errno::EINVAL) => return Ok(false),
                target => target?,
            };
            symlinkat(target.as_os_str(), self.dest_dir.as_fd(), name)?;
        } else {
            let kind = SFlag::from_bits_truncate(meta.mode & libc::S_IFMT);
            let perm = Mode::S_IRUSR | Mode::S_IWUSR;
            mknodat(self.dest_dir.as_fd(), name, kind, perm, meta.rdev)?;
        }
        apply_meta(Node::At(self.dest_dir.as_fd(), name), &meta)?;
        Ok(true)
    }

    /// The error to return for a failed walk (already naming the entry where known).
    fn explain(&self, err: WalkError) -> CopyError {
        if self.mover.cancelled {
            return CopyError::Cancelled;
        }
        err.into()
    }
}

/// The metadata of a source entry; None if it vanished or is no longer the inode the walk saw.
pub(super) fn source_meta(
    parent: BorrowedFd<'_>,
    name: &CStr,
    stat: &Stat,
) -> io::Result<Option<Meta>> {
    match read_meta(Node::At(parent, name)) {
        Err(err) if vanished(&err) => Ok(None),
        meta => {
            let meta = meta?;
            Ok(meta.is(stat).then_some(meta))
        }
    }
}

/// Opens for reading the regular file the walk saw as `seen` at `name`; None if the name no
/// longer leads to it. The name itself is never opened for reading: a pod may rename a device
/// node over it (a root container keeps CAP_MKNOD), and an open from our privileged process would
/// act on the host's device (a watchdog arms, a serial line toggles, a tape rewinds). O_PATH
/// resolves the name without opening what it names; the inode is checked; only then is the file
/// opened, through that descriptor.
pub(super) fn open_source_file(
    dir: BorrowedFd<'_>,
    name: &CStr,
    seen: &Stat,
) -> io::Result<Option<File>> {
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let handle = match openat(dir, name, flags, Mode::empty()) {
        Err(errno) if vanished(&errno.into()) => return Ok(None),
        handle => handle?,
    };
    let found = fsstat::stat_fd(handle.as_fd())?;
    if !found.is_regular_file() || !found.same_file(seen) {
        return Ok(None);
    }
    reopen_for_reading(&handle).map(Some)
}

/// Opens the inode an O_PATH descriptor holds, for reading, without looking up any name: the
/// descriptor's link in /proc/self/fd leads to that very inode. No atime update where we may.
fn reopen_for_reading(handle: &OwnedFd) -> io::Result<File> {
    let link = format!("/proc/self/fd/{}", handle.as_raw_fd());
    let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC;
    let opened = match nix::fcntl::open(link.as_str(), flags | OFlag::O_NOATIME, Mode::empty()) {
        // O_NOATIME is for the owner or CAP_FOWNER only.
        Err(Errno::EPERM) => nix::fcntl::open(link.as_str(), flags, Mode::empty()),
        opened => opened,
    };
    Ok(File::from(opened?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::fcntl::AtFlags;
    use nix::unistd::linkat;
    use std::fs;
    use std::io::Write;
    use std::path::PathBuf;

    const MIB: u64 = 1 << 20;

    /// On /var/tmp, a disk filesystem: /tmp may be a tmpfs.
    fn scratch() -> tempfile::TempDir {
        tempfile::tempdir_in("/var/tmp").unwrap()
    }

    /// A file of `size` bytes, holes but for 4 KiB of data at each of `offsets`.
    fn sparse_file(path: &Path, size: u64, offsets: &[u64]) {
        let file = File::create(path).unwrap();
        file.set_len(size).unwrap();
        for (i, offset) in offsets.iter().enumerate() {
            file.write_all_at(&[i as u8 + 1; 4096], *offset).unwrap();
        }
    }

    /// A scratch directory holding empty "source" and "dest" directories.
    fn source_and_dest() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = scratch();
        let (source, dest) = (dir.path().join("source"), dir.path().join("dest"));
        fs::create_dir(&source).unwrap();
        fs::create_dir(&dest).unwrap();
        (dir, source, dest)
    }

    fn full_file(path: &Path, size: u64) {
        let mut file = File::create(path).unwrap();
        for i in 0..size / MIB {
            file.write_all(&vec![i as u8 | 1; MIB as usize]).unwrap();
        }
    }

    fn io_error(err: CopyError) -> (PathBuf, io::Error) {
        match err {
            CopyError::Walk(WalkError::Io { path, source }) => (path, source),
            other => panic!("expected an I/O error, got {other:?}"),
        }
    }

    #[test]
    fn copy_file_keeps_length_and_holes() {
        let dir = scratch();
        let (source, dest) = (dir.path().join("image"), dir.path().join("copy"));
        sparse_file(&source, 64 * MIB, &[0, 32 * MIB]);
        let report = copy_file(&source, &dest, DataMode::Copy, &mut Always).unwrap();
        assert_eq!(
            report,
            CopyReport {
                files: 1,
                data_bytes: 8192,
                copied_bytes: 8192
            }
        );
        let copied = fs::metadata(&dest).unwrap();
        assert_eq!(copied.len(), 64 * MIB);
        assert_eq!(copied.mode() & 0o7777, 0o600);
        assert!(copied.blocks() * 512 < MIB, "{} blocks", copied.blocks());
        assert!(fs::read(&source).unwrap() == fs::read(&dest).unwrap());
    }

    #[test]
    fn copy_file_refuses_an_existing_destination() {
        let dir = scratch();
        let (source, dest) = (dir.path().join("image"), dir.path().join("copy"));
        fs::write(&source, b"new").unwrap();
        fs::write(&dest, b"mine").unwrap();
        let (path, err) =
            io_error(copy_file(&source, &dest, DataMode::Copy, &mut Always).unwrap_err());
        assert_eq!(path, dest);
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(&dest).unwrap(), b"mine");
        // A symlink is not followed, as source or destination.
        std::os::unix::fs::symlink(&source, dir.path().join("link")).unwrap();
        let link = dir.path().join("link");
        let (path, err) = io_error(
            copy_file(&link, &dir.path().join("c2"), DataMode::Copy, &mut Always).unwrap_err(),
        );
        assert_eq!(
            (path, err.raw_os_error()),
            (link.clone(), Some(libc::ELOOP))
        );
        let (path, _) =
            io_error(copy_file(&source, &link, DataMode::Copy, &mut Always).unwrap_err());
        assert_eq!(path, link);
        assert_eq!(fs::read(&source).unwrap(), b"new");
    }

    #[test]
    fn reflink_falls_back_to_copying_where_clones_are_refused() {
        let dir = scratch();
        if fsstat::supports_reflink(dir.path()).unwrap() {
            eprintln!("SKIPPED: /var/tmp can share extents");
            return;
        }
        let (source, dest) = (dir.path().join("image"), dir.path().join("copy"));
        full_file(&source, 3 * MIB);
        let report = copy_file(&source, &dest, DataMode::Reflink, &mut Always).unwrap();
        assert_eq!((report.data_bytes, report.copied_bytes), (3 * MIB, 3 * MIB));
        assert!(fs::read(&source).unwrap() == fs::read(&dest).unwrap());

        let (tree, copy) = (dir.path().join("tree"), dir.path().join("tree-copy"));
        fs::create_dir_all(tree.join("sub")).unwrap();
        fs::copy(&source, tree.join("sub/file")).unwrap();
        fs::create_dir(&copy).unwrap();
        let report = copy_tree(&tree, &copy, DataMode::Reflink, &mut Always).unwrap();
        assert_eq!(report.files, 2);
        assert_eq!((report.data_bytes, report.copied_bytes), (3 * MIB, 3 * MIB));
        assert!(fs::read(&source).unwrap() == fs::read(copy.join("sub/file")).unwrap());
    }

    #[test]
    fn cancelling_a_file_copy_removes_the_partial_copy() {
        let dir = scratch();
        let (source, dest) = (dir.path().join("image"), dir.path().join("copy"));
        full_file(&source, 24 * MIB);
        let mut calls = 0;
        let mut stop_after_8_mib = |report: &CopyReport| {
            calls += 1;
            report.copied_bytes < 8 * MIB
        };
        let err = copy_file(&source, &dest, DataMode::Copy, &mut stop_after_8_mib).unwrap_err();
        assert!(matches!(err, CopyError::Cancelled), "{err:?}");
        assert_eq!(calls, 2, "once before the file, once after its first 8 MiB");
        assert!(!dest.exists());
    }

    #[test]
    fn cancelling_stops_a_tree_copy() {
        let (_dir, source, dest) = source_and_dest();
        for i in 0..10 {
            fs::write(source.join(format!("f{i}")), b"x").unwrap();
        }
        let err = copy_tree(
            &source,
            &dest,
            DataMode::Copy,
            &mut |report: &CopyReport| report.files < 3,
        )
        .unwrap_err();
        assert!(matches!(err, CopyError::Cancelled), "{err:?}");
        assert_eq!(fs::read_dir(&dest).unwrap().count(), 3);
    }

    #[test]
    fn refuses_bad_roots() {
        let (dir, source, dest) = source_and_dest();
        fs::create_dir(source.join("inside")).unwrap();
        fs::write(source.join("file"), b"x").unwrap();

        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&source, &link).unwrap();
        let (path, err) =
            io_error(copy_tree(&link, &dest, DataMode::Copy, &mut Always).unwrap_err());
        assert_eq!(path, link);
        // O_NOFOLLOW | O_DIRECTORY on a symlink: ENOTDIR here, ELOOP on some kernels.
        assert!(
            matches!(err.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)),
            "{err}"
        );

        let (path, err) =
            io_error(copy_tree(&source, &source, DataMode::Copy, &mut Always).unwrap_err());
        assert_eq!(path, source);
        assert_eq!(err.raw_os_error(), Some(libc::ENOTEMPTY));

        let (path, err) = io_error(
            copy_tree(&source, &source.join("inside"), DataMode::Copy, &mut Always).unwrap_err(),
        );
        assert_eq!(path, source.join("inside"));
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        assert_eq!(fs::read_dir(source.join("inside")).unwrap().count(), 0);
        assert_eq!(fs::read_dir(&dest).unwrap().count(), 0);
    }

    fn open_descriptors() -> usize {
        fs::read_dir("/proc/self/fd").unwrap().count()
    }

    #[test]
    fn deep_chains_copy_with_few_descriptors() {
        const DEPTH: usize = 2000;
        let (_dir, source, dest) = source_and_dest();
        fs::write(source.join("top"), b"top").unwrap();
        // Made level by level: the full path is far beyond PATH_MAX.
        let top = open_dir(None, source.as_os_str()).unwrap();
        let mut bottom = top.try_clone().unwrap();
        for _ in 0..DEPTH {
            mkdirat(bottom.as_fd(), "d", Mode::S_IRWXU).unwrap();
            bottom = open_dir(Some(bottom.as_fd()), OsStr::new("d")).unwrap();
        }
        fs::write(
            format!("/proc/self/fd/{}/leaf", bottom.as_raw_fd()),
            b"leaf",
        )
        .unwrap();
        linkat(
            top.as_fd(),
            "top",
            bottom.as_fd(),
            "top-again",
            AtFlags::empty(),
        )
        .unwrap();
        drop((top, bottom));

        let mut most = 0;
        let report = copy_tree(&source, &dest, DataMode::Copy, &mut |_: &CopyReport| {
            most = most.max(open_descriptors());
            true
        })
        .unwrap();
        assert_eq!(report.files, DEPTH as u64 + 3);
        // Other tests run alongside; one descriptor per level would pass 2000.
        assert!(most < 500, "{most} descriptors open");

        let top = open_dir(None, dest.as_os_str()).unwrap();
        let mut bottom = top.try_clone().unwrap();
        for _ in 0..DEPTH {
            bottom = open_dir(Some(bottom.as_fd()), OsStr::new("d")).unwrap();
        }
        let leaf = fs::read(format!("/proc/self/fd/{}/leaf", bottom.as_raw_fd())).unwrap();
        assert_eq!(leaf, b"leaf");
        let first = fsstat::lstat_at(top.as_fd(), c"top").unwrap();
        let second = fsstat::lstat_at(bottom.as_fd(), c"top-again").unwrap();
        assert!(first.same_file(&second));
        assert_eq!(first.links, 2);
        drop((top, bottom));
        super::super::safe_delete::remove_all(&source).unwrap();
        super::super::safe_delete::remove_all(&dest).unwrap();
    }

    /// The walk skips a directory that vanished or was swapped between its listing and its
    /// opening, and entries that vanished: the copy must not keep them.
    #[test]
    fn entries_the_walk_skips_are_not_left_in_the_copy() {
        let (_dir, source, dest) = source_and_dest();
        fs::create_dir(source.join("skipped")).unwrap();
        fs::write(source.join("next"), b"x").unwrap();
        let mut progress = Always;
        let mut copier = Copier::new(&source, &dest, DataMode::Copy, &mut progress).unwrap();
        let parent = open_dir(None, source.as_os_str()).unwrap();
        let skipped = fsstat::lstat_at(parent.as_fd(), c"skipped").unwrap();
        copier.entry(parent.as_fd(), c"skipped", &skipped).unwrap();
        assert!(dest.join("skipped").is_dir());
        // The walk goes on in the same directory: "skipped" was not entered.
        let next = fsstat::lstat_at(parent.as_fd(), c"next").unwrap();
        copier.entry(parent.as_fd(), c"next", &next).unwrap();
        assert!(!dest.join("skipped").exists());
        assert_eq!(fs::read(dest.join("next")).unwrap(), b"x");
        // Gone before we got to it, or replaced by another inode.
        copier.entry(parent.as_fd(), c"ghost", &next).unwrap();
        // Made before the old one goes, so the inode number cannot be reused.
        fs::write(source.join("next.new"), b"y").unwrap();
        fs::rename(source.join("next.new"), source.join("next")).unwrap();
        fs::remove_file(dest.join("next")).unwrap();
        copier.entry(parent.as_fd(), c"next", &next).unwrap();
        assert!(!dest.join("ghost").exists() && !dest.join("next").exists());
        // A directory reported last and never entered.
        copier.entry(parent.as_fd(), c"skipped", &skipped).unwrap();
        copier.finish().unwrap();
        assert!(!dest.join("skipped").exists());
        assert_eq!(copier.mover.report.files, 1);
    }

    #[test]
    fn sync_filesystem_syncs() {
        let dir = scratch();
        sync_filesystem(dir.path()).unwrap();
        assert!(sync_filesystem(&dir.path().join("missing")).is_err());
    }
}
