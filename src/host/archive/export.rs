//! Writing a stream: the source is read like `copy` reads it (`tree::walk`: never a symlink
//! followed, no mount point crossed, entries that vanish meanwhile skipped; a file opened only
//! through a descriptor checked to be the regular file the walk saw; data segment by segment,
//! holes skipped).

use std::ffi::{CStr, CString};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::readlinkat;

use super::format::{
    DATA_CHUNK, FrameWriter, TARGET_MAX, Tag, put_meta, put_name, put_u32, put_u64,
};
use super::{ArchiveError, Header, ImageOf, Kind, Summary};
use crate::host::copy::{
    Naming, failed_at, next_data, open_dir, open_regular, open_source_file, source_meta,
};
use crate::host::fsstat::{self, Stat};
use crate::host::links::LinkBook;
use crate::host::meta::{HeldMeta, Meta, Node, read_meta};
use crate::host::tree::{self, AtMountPoint, Visitor, WalkError};

type Inode = ((u32, u32), u64);

fn inode(stat: &Stat) -> Inode {
    (stat.dev, stat.ino)
}

/// Names of an inode after the one being visited.
fn later_names(stat: &Stat) -> u32 {
    stat.links.saturating_sub(1)
}

fn header(
    kind: Kind,
    allocated_bytes: u64,
    size_bytes: u64,
    source: &str,
    image: Option<ImageOf>,
) -> Header {
    let created_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    Header {
        kind,
        allocated_bytes,
        size_bytes,
        source: source.to_owned(),
        created_unix_ms,
        image,
    }
}

/// Reads what an export of the tree at `root` (a directory) will declare; a metadata-only
/// walk (tree::walk, no data read).
pub fn tree_header(root: &Path, source: &str) -> Result<Header, ArchiveError> {
    struct Sizer {
        allocated: u64,
        size: u64,
        linked: LinkBook<Inode, ()>,
    }
    impl Visitor for Sizer {
        fn entry(&mut self, _: BorrowedFd<'_>, _: &CStr, stat: &Stat) -> io::Result<()> {
            if stat.is_regular_file() && self.linked.again(&inode(stat)).is_none() {
                self.linked
                    .first(inode(stat), (), later_names(stat).into())?;
                // A pod's sparse files may claim sizes that add up past u64.
                self.allocated = self.allocated.saturating_add(stat.allocated);
                self.size = self.size.saturating_add(stat.size);
            }
            Ok(())
        }
    }
    let mut sizer = Sizer {
        allocated: 0,
        size: 0,
        linked: LinkBook::new(),
    };
    tree::walk(root, AtMountPoint::Refuse, &mut sizer)?;
    Ok(header(
        Kind::Tree,
        sizer.allocated,
        sizer.size,
        source,
        None,
    ))
}

/// Same as [`tree_header`] for a block volume's image file.
pub fn image_header(file: &Path, source: &str, image: ImageOf) -> Result<Header, ArchiveError> {
    let (_, stat) = open_regular(file, OpenOptions::new().read(true), libc::O_NONBLOCK)?;
    let allocated = stat.blocks().saturating_mul(512);
    Ok(header(
        Kind::Image,
        allocated,
        stat.len(),
        source,
        Some(image),
    ))
}

/// Writes the whole stream for `header` (from [`tree_header`] or [`image_header`]) of `path`
/// (the root directory or the image file) to `out`, flushed at the end.
pub fn export(path: &Path, header: &Header, out: &mut dyn Write) -> Result<Summary, ArchiveError> {
    match header.kind {
        Kind::Tree => export_tree(path, header, out),
        Kind::Image => export_image(path, header, out),
    }
}

/// The error of a failed write or read: the consumer's if the output failed, else the
/// source's (at `path`).
fn blame(writer: &FrameWriter<'_>, err: WalkError) -> ArchiveError {
    match err {
        WalkError::Io { source, .. } if writer.output_failed => ArchiveError::Output(source),
        err => err.into(),
    }
}

fn export_image(
    path: &Path,
    header: &Header,
    out: &mut dyn Write,
) -> Result<Summary, ArchiveError> {
    let (file, _) = open_regular(path, OpenOptions::new().read(true), libc::O_NONBLOCK)?;
    let mut writer = FrameWriter::start(out, header).map_err(ArchiveError::Output)?;
    let data_bytes = send_data(&mut writer, &file, header.size_bytes, false)
        .map_err(|err| blame(&writer, failed_at(path)(err)))?;
    writer.finish(0, data_bytes).map_err(ArchiveError::Output)
}

/// Sends the data of `file` below `size` as DATA frames, segment by segment (or, if `whole`,
/// as one segment without asking for holes); returns the bytes sent. A file that shrinks
/// meanwhile ends early: its length comes from its FILE frame.
fn send_data(writer: &mut FrameWriter<'_>, file: &File, size: u64, whole: bool) -> io::Result<u64> {
    let mut sent = 0;
    let mut offset = 0;
    while offset < size {
        let segment = if whole {
            Some((offset, size))
        } else {
            next_data(file, offset, size)?
        };
        let Some((start, end)) = segment else {
            break;
        };
        let mut position = start;
        while position < end {
            let wanted = (end - position).min(DATA_CHUNK as u64) as usize;
            let got = match file.read_at(&mut writer.data_buffer()[..wanted], position) {
                Ok(got) => got,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(err),
            };
            if got == 0 {
                return Ok(sent);
            }
            writer.send_data(position, got)?;
            position += got as u64;
            sent += got as u64;
        }
        offset = end;
    }
    Ok(sent)
}

fn export_tree(path: &Path, header: &Header, out: &mut dyn Write) -> Result<Summary, ArchiveError> {
    // Before the walk lists the root (which may update its atime).
    let root = open_dir(None, path.as_os_str()).map_err(failed_at(path))?;
    let stat = fsstat::stat_fd(root.as_fd()).map_err(failed_at(path))?;
    let meta = read_meta(Node::Open(root.as_fd())).map_err(failed_at(path))?;
    drop(root);
    let mut writer = FrameWriter::start(out, header).map_err(ArchiveError::Output)?;
    let mut walker = Naming::new(TreeExporter {
        writer: &mut writer,
        levels: vec![Level { stat, meta: None }],
        root_meta: Some(meta),
        pending: None,
        linked: LinkBook::new(),
        last_link: 0,
        entries: 0,
        data_bytes: 0,
    });
    let walked = tree::walk(path, AtMountPoint::Refuse, &mut walker);
    let ended = walked.map_err(|err| walker.explain(err)).and_then(|()| {
        // A directory reported last and then not entered (it vanished) is left out.
        let exporter = &mut walker.visitor;
        let meta = exporter.root_meta.take().expect("sent once, at the end");
        exporter.end_dir(&meta).map_err(failed_at(path))
    });
    let TreeExporter {
        entries,
        data_bytes,
        ..
    } = walker.visitor;
    ended.map_err(|err| blame(&writer, err))?;
    writer
        .finish(entries, data_bytes)
        .map_err(ArchiveError::Output)
}

/// A directory whose entries are being sent.
struct Level {
    stat: Stat,
    /// Sent in its END_DIR, after its content (the root's: `TreeExporter::root_meta`).
    meta: Option<HeldMeta>,
}

/// A directory just reported: the walk enters it next, unless it vanished or was swapped
/// meanwhile; the next callback tells which, and only then is its DIR frame sent.
struct Pending {
    stat: Stat,
    name: CString,
    meta: Meta,
}

struct TreeExporter<'w, 'o> {
    writer: &'w mut FrameWriter<'o>,
    /// From the root to the directory whose entries the walk is visiting.
    levels: Vec<Level>,
    root_meta: Option<Meta>,
    pending: Option<Pending>,
    /// Regular files with more names to come: their link ids.
    linked: LinkBook<Inode, u64>,
    last_link: u64,
    entries: u64,
    data_bytes: u64,
}

impl Visitor for TreeExporter<'_, '_> {
    fn entry(&mut self, parent: BorrowedFd<'_>, name: &CStr, stat: &Stat) -> io::Result<()> {
        if let Some(pending) = self.pending.take()
            && fsstat::stat_fd(parent)?.same_file(&pending.stat)
        {
            self.enter(pending)?;
        }
        match stat.mode & libc::S_IFMT {
            libc::S_IFDIR => {
                if let Some(meta) = source_meta(parent, name, stat)? {
                    self.pending = Some(Pending {
                        stat: *stat,
                        name: name.to_owned(),
                        meta,
                    });
                }
                Ok(())
            }
            libc::S_IFREG => self.file(parent, name, stat),
            _ => self.node(parent, name, stat),
        }
    }

    fn leave_dir(&mut self, parent: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
        if let Some(pending) = self.pending.take() {
            let top = &self.levels.last().expect("the root level stays").stat;
            if fsstat::stat_fd(parent)?.same_file(top) {
                // Entered and left at once: it is empty, and the one being left.
                self.enter(pending)?;
            }
        }
        let done = self
            .levels
            .pop()
            .expect("leave_dir only for entered directories");
        let held = done
            .meta
            .expect("only the root has none, and it is never left");
        self.end_dir(&held.complete(parent, name)?)
    }
}

impl TreeExporter<'_, '_> {
    fn enter(&mut self, pending: Pending) -> io::Result<()> {
        put_name(self.writer.begin(Tag::Dir), pending.name.to_bytes());
        self.writer.end()?;
        self.entries += 1;
        self.levels.push(Level {
            stat: pending.stat,
            meta: Some(HeldMeta::hold(pending.meta)),
        });
        Ok(())
    }

    fn end_dir(&mut self, meta: &Meta) -> io::Result<()> {
        put_meta(self.writer.begin(Tag::EndDir), meta);
        self.writer.end()
    }

    fn file(&mut self, parent: BorrowedFd<'_>, name: &CStr, stat: &Stat) -> io::Result<()> {
        if stat.links > 1
            && let Some((id, _)) = self.linked.again(&inode(stat))
        {
            let frame = self.writer.begin(Tag::Link);
            put_name(frame, name.to_bytes());
            put_u64(frame, id);
            self.writer.end()?;
            self.entries += 1;
            return Ok(());
        }
        let Some(input) = open_source_file(parent, name, stat)? else {
            return Ok(());
        };
        let meta = read_meta(Node::Open(input.as_fd()))?;
        if !meta.is(stat) {
            return Ok(());
        }
        let (id, later) = if stat.links > 1 {
            self.last_link += 1;
            (self.last_link, later_names(stat))
        } else {
            (0, 0)
        };
        let frame = self.writer.begin(Tag::File);
        put_name(frame, name.to_bytes());
        put_u64(frame, meta.size);
        put_u64(frame, id);
        put_u32(frame, later);
        put_meta(frame, &meta);
        self.writer.end()?;
        self.linked.first(inode(stat), id, later.into())?;
        // Small and fully allocated: no holes worth two lseeks.
        let whole = meta.size <= DATA_CHUNK as u64 && meta.allocated >= meta.size;
        self.data_bytes += send_data(self.writer, &input, meta.size, whole)?;
        self.writer.begin(Tag::FileEnd);
        self.writer.end()?;
        self.entries += 1;
        Ok(())
    }

    /// Symlinks (their target bytes as they are), fifos, sockets and device nodes.
    fn node(&mut self, parent: BorrowedFd<'_>, name: &CStr, stat: &Stat) -> io::Result<()> {
        let Some(meta) = source_meta(parent, name, stat)? else {
            return Ok(());
        };
        if stat.is_symlink() {
            let target = match readlinkat(parent, name) {
                // EINVAL: no longer a symlink.
                Err(Errno::ENOENT | Errno::EINVAL) => return Ok(()),
                target => target?,
            };
            let target = target.as_bytes();
            if target.is_empty() || target.len() > TARGET_MAX {
                let err = format!("a symlink target of {} bytes", target.len());
                return Err(io::Error::new(io::ErrorKind::InvalidData, err));
            }
            let frame = self.writer.begin(Tag::Symlink);
            put_name(frame, name.to_bytes());
            frame.extend_from_slice(&(target.len() as u16).to_le_bytes());
            frame.extend_from_slice(target);
            put_meta(frame, &meta);
        } else {
            let frame = self.writer.begin(Tag::Special);
            put_name(frame, name.to_bytes());
            put_meta(frame, &meta);
        }
        self.writer.end()?;
        self.entries += 1;
        Ok(())
    }
}
