//! Reading a stream into a volume. The stream is untrusted: names are single checked
//! components, everything is made with *at calls relative to directory descriptors opened
//! from the destination downwards (O_NOFOLLOW), new files with O_EXCL, so no entry can reach
//! through a symlink or outside the destination.

use std::ffi::{CStr, CString, OsStr};
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, SFlag, mkdirat, mknodat};
use nix::unistd::symlinkat;

use super::format::{Fields, FrameReader, Tag, corrupt};
use super::{ArchiveError, Header, Kind, Summary, entry_limit};
use crate::host::copy::{check_empty, failed_at, open_dir, open_regular};
use crate::host::fsstat::{self, Stat};
use crate::host::links::{LinkBook, LinkStash};
use crate::host::meta::{Meta, Node, apply_meta};
use crate::host::tree::MAX_DEPTH;
use crate::host::tree::WalkError;

/// An export stream whose magic and header were read and checked; it keeps the checksum
/// state for the rest.
pub struct Importer<R: Read> {
    reader: FrameReader<R>,
    header: Header,
}

impl<R: Read> Importer<R> {
    /// Reads and checks the magic and the header (the input is read through a buffer).
    pub fn start(input: R) -> Result<(Importer<R>, Header), ArchiveError> {
        let (reader, header) = FrameReader::start(input)?;
        let importer = Importer {
            reader,
            header: header.clone(),
        };
        Ok((importer, header))
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    fn expect(&self, wanted: Kind) -> Result<(), ArchiveError> {
        if self.header.kind != wanted {
            return Err(ArchiveError::WrongKind {
                found: self.header.kind,
                wanted,
            });
        }
        Ok(())
    }

    /// Recreates the tree inside `dest`, an existing EMPTY directory (refused otherwise),
    /// writing at most `limit_bytes` of file data (TooLarge beyond, also when the header
    /// declares more, or the kernel answers EDQUOT or ENOSPC) and creating at most
    /// [`entry_limit`]`(limit_bytes)` entries (TooManyEntries, before the one too many). Applies the root's metadata to
    /// `dest` itself. Returns only after the trailer's checksum matched and EOF followed it.
    /// Does not fsync (the caller syncs the filesystem); on error the partial tree stays.
    pub fn into_tree(mut self, dest: &Path, limit_bytes: u64) -> Result<Summary, ArchiveError> {
        self.expect(Kind::Tree)?;
        if self.header.allocated_bytes > limit_bytes {
            return Err(ArchiveError::TooLarge { limit: limit_bytes });
        }
        let mut builder = TreeBuilder::new(dest, limit_bytes)?;
        loop {
            let (tag, payload) = self.reader.next()?;
            if tag == Tag::Trailer {
                break;
            }
            builder.frame(tag, payload)?;
        }
        if !builder.done {
            return Err(corrupt("the trailer comes before the end of the tree"));
        }
        self.reader.finish(builder.entries, builder.data_bytes)
    }

    /// Writes the image's data segments into `dest`, an existing regular file at least
    /// `header.size_bytes` long (TooLarge otherwise) that the caller has already zeroed (all
    /// holes or unwritten). Writes only data segments, at their offsets: the file's length
    /// does not change and holes stay holes.
    pub fn into_image(mut self, dest: &Path) -> Result<Summary, ArchiveError> {
        self.expect(Kind::Image)?;
        let (file, stat) = open_regular(dest, OpenOptions::new().write(true), 0)?;
        let limit = stat.len();
        if limit < self.header.size_bytes {
            return Err(ArchiveError::TooLarge { limit });
        }
        let mut image = Filling::new(file, self.header.size_bytes);
        let mut written = 0;
        loop {
            match self.reader.next()? {
                (Tag::Data, payload) => {
                    let (offset, data) = image.place(payload)?;
                    image
                        .file
                        .write_all_at(data, offset)
                        .map_err(|err| failure(dest.to_path_buf(), limit, err))?;
                    written += data.len() as u64;
                }
                (Tag::Trailer, _) => break,
                (tag, _) => return Err(corrupt(format!("{tag} frame in an image stream"))),
            }
        }
        self.reader.finish(0, written)
    }
}

/// What a failed write of the destination means: too much data for the volume (EDQUOT,
/// ENOSPC), or an error at `path`.
fn failure(path: PathBuf, limit: u64, err: io::Error) -> ArchiveError {
    match err.raw_os_error() {
        Some(libc::EDQUOT | libc::ENOSPC) => ArchiveError::TooLarge { limit },
        _ => WalkError::Io { path, source: err }.into(),
    }
}

/// A file being filled by DATA frames.
struct Filling {
    file: File,
    size: u64,
    /// Where the last DATA frame ended: the next may not start before.
    end: u64,
}

impl Filling {
    fn new(file: File, size: u64) -> Self {
        Filling { file, size, end: 0 }
    }

    /// Where one DATA frame's data goes: after the previous frame's, within the file.
    fn place<'p>(&mut self, payload: &'p [u8]) -> Result<(u64, &'p [u8]), ArchiveError> {
        let mut fields = Fields::new(payload);
        let offset = fields.u64()?;
        let data = fields.rest();
        let len = data.len() as u64;
        match offset.checked_add(len) {
            Some(end) if offset >= self.end && end <= self.size => self.end = end,
            _ => {
                return Err(corrupt(format!(
                    "{len} bytes of data at offset {offset} of a file of {} bytes (written up to {})",
                    self.size, self.end
                )));
            }
        }
        Ok((offset, data))
    }
}

/// The regular file whose DATA frames are coming.
struct OpenFile {
    name: CString,
    filling: Filling,
    meta: Meta,
}

/// Builds the tree of a stream inside the destination, holding two directories open (the
/// destination and the current one) and the identity of each level.
struct TreeBuilder {
    dest: PathBuf,
    limit: u64,
    /// The most entries this import creates.
    entry_limit: u64,
    root: OwnedFd,
    /// The directory entries are made in, and its path below `root`.
    dir: OwnedFd,
    path: PathBuf,
    /// The identities of the directories from `root` to `dir`, to check each climb.
    levels: Vec<Stat>,
    file: Option<OpenFile>,
    /// Files with more names to come, by link id, each with a spare name in `stash` under
    /// that id.
    linked: LinkBook<u64, ()>,
    stash: LinkStash,
    entries: u64,
    data_bytes: u64,
    /// The root's END_DIR was applied: only the trailer may follow.
    done: bool,
}

const FILE_FLAGS: OFlag = OFlag::O_WRONLY
    .union(OFlag::O_CREAT)
    .union(OFlag::O_EXCL)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

impl TreeBuilder {
    fn new(dest: &Path, limit: u64) -> Result<Self, ArchiveError> {
        let root = open_dir(None, dest.as_os_str()).map_err(failed_at(dest))?;
        check_empty(&root).map_err(failed_at(dest))?;
        let stat = fsstat::stat_fd(root.as_fd()).map_err(failed_at(dest))?;
        Ok(TreeBuilder {
            dest: dest.to_path_buf(),
            limit,
            entry_limit: entry_limit(limit),
            dir: root.try_clone().map_err(failed_at(dest))?,
            root,
            path: PathBuf::new(),
            levels: vec![stat],
            file: None,
            linked: LinkBook::new(),
            stash: LinkStash::new(),
            entries: 0,
            data_bytes: 0,
            done: false,
        })
    }

    /// What an error about `name` in the current directory (or about it, if None) means.
    fn failed(&self, name: Option<&CStr>, err: io::Error) -> ArchiveError {
        let mut path = self.dest.join(&self.path);
        if let Some(name) = name {
            path.push(OsStr::from_bytes(name.to_bytes()));
        }
        failure(path, self.limit, err)
    }

    fn frame(&mut self, tag: Tag, payload: &[u8]) -> Result<(), ArchiveError> {
        if self.done {
            return Err(corrupt(format!("{tag} frame after the end of the tree")));
        }
        let mut fields = Fields::new(payload);
        if self.file.is_some() {
            return match tag {
                Tag::Data => self.data(payload),
                Tag::FileEnd => {
                    fields.end()?;
                    self.end_file()
                }
                _ => Err(corrupt(format!("{tag} frame inside a file"))),
            };
        }
        if matches!(
            tag,
            Tag::Dir | Tag::File | Tag::Link | Tag::Symlink | Tag::Special
        ) {
            self.count_entry()?;
        }
        match tag {
            Tag::Dir => {
                let name = fields.name()?;
                fields.end()?;
                self.make_dir(&name)
            }
            Tag::EndDir => {
                let meta = fields.meta(&[libc::S_IFDIR])?;
                fields.end()?;
                self.end_dir(&meta).map_err(|err| self.failed(None, err))
            }
            Tag::File => {
                let name = fields.name()?;
                let (size, id, later) = (fields.u64()?, fields.u64()?, fields.u32()?);
                let meta = fields.meta(&[libc::S_IFREG])?;
                fields.end()?;
                self.start_file(name, size, id, later, meta)
            }
            Tag::Link => {
                let name = fields.name()?;
                let id = fields.u64()?;
                fields.end()?;
                let Some(((), last)) = self.linked.again(&id) else {
                    return Err(corrupt(format!("a link to the unknown file {id}")));
                };
                self.stash
                    .link(id, (self.dir.as_fd(), &name), last)
                    .map_err(|err| self.failed(Some(&name), err))?;
                Ok(())
            }
            Tag::Symlink => {
                let name = fields.name()?;
                let target = fields.target()?;
                let meta = fields.meta(&[libc::S_IFLNK])?;
                fields.end()?;
                symlinkat(target.as_c_str(), self.dir.as_fd(), name.as_c_str())
                    .map_err(io::Error::from)
                    .and_then(|()| apply_meta(Node::At(self.dir.as_fd(), &name), &meta))
                    .map_err(|err| self.failed(Some(&name), err))?;
                Ok(())
            }
            Tag::Special => {
                let name = fields.name()?;
                let kinds = [libc::S_IFIFO, libc::S_IFSOCK, libc::S_IFCHR, libc::S_IFBLK];
                let meta = fields.meta(&kinds)?;
                fields.end()?;
                let kind = SFlag::from_bits_truncate(meta.mode & libc::S_IFMT);
                let perm = Mode::S_IRUSR | Mode::S_IWUSR;
                mknodat(self.dir.as_fd(), name.as_c_str(), kind, perm, meta.rdev)
                    .map_err(io::Error::from)
                    .and_then(|()| apply_meta(Node::At(self.dir.as_fd(), &name), &meta))
                    .map_err(|err| self.failed(Some(&name), err))?;
                Ok(())
            }
            Tag::Data | Tag::FileEnd => Err(corrupt(format!("{tag} frame outside a file"))),
            Tag::Header | Tag::Trailer => Err(corrupt(format!("{tag} frame among the entries"))),
        }
    }

    /// One more entry, refused before it is made when it would be one too many.
    fn count_entry(&mut self) -> Result<(), ArchiveError> {
        if self.entries == self.entry_limit {
            return Err(ArchiveError::TooManyEntries {
                limit: self.entry_limit,
                capacity: self.limit,
            });
        }
        self.entries += 1;
        Ok(())
    }

    /// Makes a directory (0700 until its END_DIR) and enters it.
    fn make_dir(&mut self, name: &CStr) -> Result<(), ArchiveError> {
        if self.levels.len() > MAX_DEPTH {
            return Err(WalkError::TooDeep {
                path: self
                    .dest
                    .join(&self.path)
                    .join(OsStr::from_bytes(name.to_bytes())),
                limit: MAX_DEPTH,
            }
            .into());
        }
        self.enter_new_dir(name)
            .map_err(|err| self.failed(Some(name), err))
    }

    fn enter_new_dir(&mut self, name: &CStr) -> io::Result<()> {
        mkdirat(self.dir.as_fd(), name, Mode::S_IRWXU)?;
        // Ours, just made: O_NOFOLLOW | O_DIRECTORY makes sure it still is.
        let child = open_dir(Some(self.dir.as_fd()), OsStr::from_bytes(name.to_bytes()))?;
        self.levels.push(fsstat::stat_fd(child.as_fd())?);
        self.dir = child;
        self.path.push(OsStr::from_bytes(name.to_bytes()));
        Ok(())
    }

    /// The current directory is complete: its metadata, then back to its parent.
    fn end_dir(&mut self, meta: &Meta) -> io::Result<()> {
        if self.levels.len() == 1 {
            // Before the root's times are set: removing the stash changes them.
            self.stash.remove(self.root.as_fd())?;
            apply_meta(Node::Open(self.dir.as_fd()), meta)?;
            self.done = true;
            return Ok(());
        }
        apply_meta(Node::Open(self.dir.as_fd()), meta)?;
        let up = open_dir(Some(self.dir.as_fd()), OsStr::new(".."))?;
        let expected = &self.levels[self.levels.len() - 2];
        if !fsstat::stat_fd(up.as_fd())?.same_file(expected) {
            return Err(io::Error::other(
                "the destination was moved while being written",
            ));
        }
        self.levels.pop();
        self.path.pop();
        self.dir = up;
        Ok(())
    }

    fn start_file(
        &mut self,
        name: CString,
        size: u64,
        id: u64,
        later: u32,
        meta: Meta,
    ) -> Result<(), ArchiveError> {
        if id != 0 && self.linked.knows(&id) {
            return Err(corrupt(format!("link id {id} given twice")));
        }
        let file = openat(
            self.dir.as_fd(),
            name.as_c_str(),
            FILE_FLAGS,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .map_err(io::Error::from)
        .map_err(|err| self.failed(Some(&name), err))?;
        if id != 0 {
            self.linked
                .first(id, (), later.into())
                .and_then(|()| {
                    self.stash
                        .keep(self.root.as_fd(), id, (self.dir.as_fd(), &name))
                })
                .map_err(|err| self.failed(Some(&name), err))?;
        }
        self.file = Some(OpenFile {
            name,
            filling: Filling::new(File::from(file), size),
            meta,
        });
        Ok(())
    }

    fn data(&mut self, payload: &[u8]) -> Result<(), ArchiveError> {
        let open = self.file.as_mut().expect("inside a file");
        let (offset, data) = open.filling.place(payload)?;
        let len = data.len() as u64;
        if len > self.limit - self.data_bytes {
            return Err(ArchiveError::TooLarge { limit: self.limit });
        }
        if let Err(err) = open.filling.file.write_all_at(data, offset) {
            let name = open.name.clone();
            return Err(self.failed(Some(&name), err));
        }
        self.data_bytes += len;
        Ok(())
    }

    /// The file's length (its trailing hole), then its metadata.
    fn end_file(&mut self) -> Result<(), ArchiveError> {
        let open = self.file.take().expect("inside a file");
        let Filling {
            file, size, end, ..
        } = &open.filling;
        (if end < size {
            file.set_len(*size)
        } else {
            Ok(())
        })
        .and_then(|()| apply_meta(Node::Open(file.as_fd()), &open.meta))
        .map_err(|err| self.failed(Some(&open.name), err))
    }
}

#[cfg(test)]
mod tests {
    use super::super::format::{FrameWriter, put_meta, put_u32, put_u64};
    use super::super::{export, tree_header};
    use super::*;
    use nix::sys::time::TimeSpec;
    use proptest::prelude::*;
    use std::sync::OnceLock;

    /// Names a hostile stream might use, good and bad.
    const NAMES: [&[u8]; 6] = [b"a", b"b", b"x", b"..", b"a/b", b"."];

    /// One frame of a made-up stream.
    #[derive(Debug, Clone)]
    enum Step {
        Dir(usize),
        EndDir,
        File(usize, u64, u64, u32),
        Data(u64, usize),
        FileEnd,
        Link(usize, u64),
        Symlink(usize, usize),
        Fifo(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        // Mostly good names, so that streams get somewhere before they go wrong.
        let name = prop_oneof![12 => 0..3usize, 1 => 3..NAMES.len()];
        prop_oneof![
            3 => name.clone().prop_map(Step::Dir),
            2 => Just(Step::EndDir),
            3 => (name.clone(), 0..10_000u64, 0..3u64, 0..3u32)
                .prop_map(|(n, size, id, later)| Step::File(n, size, id, later)),
            3 => (0..10_000u64, 0..5000usize).prop_map(|(at, len)| Step::Data(at, len)),
            3 => Just(Step::FileEnd),
            2 => (name.clone(), 0..3u64).prop_map(|(n, id)| Step::Link(n, id)),
            2 => (name.clone(), 0..3usize).prop_map(|(n, t)| Step::Symlink(n, t)),
            1 => name.prop_map(Step::Fifo),
        ]
    }

    /// A directory outside every destination, holding one file, that no stream may change.
    fn outside() -> tempfile::TempDir {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        std::fs::write(dir.path().join("victim"), b"untouched").unwrap();
        dir
    }

    fn assert_untouched(outside: &Path) {
        let names: Vec<_> = std::fs::read_dir(outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["victim"]);
        assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"untouched");
    }

    /// Metadata of type `kind` that this user may apply.
    fn meta(kind: u32) -> Meta {
        Meta {
            ino: 0,
            mode: kind | 0o755,
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
            rdev: 0,
            size: 0,
            allocated: 0,
            atime: TimeSpec::new(1, 2),
            mtime: TimeSpec::new(3, 4),
            xattrs: Vec::new(),
        }
    }

    /// Appends a name as the format does, without checking it.
    fn raw_name(frame: &mut Vec<u8>, n: usize) {
        frame.push(NAMES[n].len() as u8);
        frame.extend_from_slice(NAMES[n]);
    }

    /// Encodes `steps` with the real writer, symlinks pointing into `outside`.
    fn encode(steps: &[Step], outside: &Path, entries: u64, data: u64) -> Vec<u8> {
        let header = Header {
            kind: Kind::Tree,
            allocated_bytes: 0,
            size_bytes: 0,
            source: "fuzz".into(),
            created_unix_ms: 0,
            image: None,
        };
        let targets = [outside.to_path_buf(), outside.join("victim"), "..".into()];
        let mut out = Vec::new();
        let mut writer = FrameWriter::start(&mut out, &header).unwrap();
        for step in steps {
            match step {
                Step::Dir(n) => raw_name(writer.begin(Tag::Dir), *n),
                Step::EndDir => put_meta(writer.begin(Tag::EndDir), &meta(libc::S_IFDIR)),
                Step::File(n, size, id, later) => {
                    let frame = writer.begin(Tag::File);
                    raw_name(frame, *n);
                    put_u64(frame, *size);
                    put_u64(frame, *id);
                    put_u32(frame, *later);
                    put_meta(frame, &meta(libc::S_IFREG));
                }
                Step::Data(at, len) => {
                    let frame = writer.begin(Tag::Data);
                    put_u64(frame, *at);
                    frame.resize(frame.len() + len, 0x5a);
                }
                Step::FileEnd => {
                    writer.begin(Tag::FileEnd);
                }
                Step::Link(n, id) => {
                    let frame = writer.begin(Tag::Link);
                    raw_name(frame, *n);
                    put_u64(frame, *id);
                }
                Step::Symlink(n, t) => {
                    let target = targets[*t].as_os_str().as_bytes();
                    let frame = writer.begin(Tag::Symlink);
                    raw_name(frame, *n);
                    frame.extend_from_slice(&(target.len() as u16).to_le_bytes());
                    frame.extend_from_slice(target);
                    put_meta(frame, &meta(libc::S_IFLNK));
                }
                Step::Fifo(n) => {
                    let frame = writer.begin(Tag::Special);
                    raw_name(frame, *n);
                    put_meta(frame, &meta(libc::S_IFIFO));
                }
            }
            writer.end().unwrap();
        }
        writer.finish(entries, data).unwrap();
        out
    }

    fn import_fresh(stream: &[u8]) -> Result<Summary, ArchiveError> {
        let dest = tempfile::tempdir_in("/var/tmp").unwrap();
        let (importer, _) = Importer::start(stream)?;
        importer.into_tree(dest.path(), 1 << 20)
    }

    /// A real stream of a small tree, made once.
    fn real_stream() -> &'static [u8] {
        static STREAM: OnceLock<Vec<u8>> = OnceLock::new();
        STREAM.get_or_init(|| {
            let dir = tempfile::tempdir_in("/var/tmp").unwrap();
            let root = dir.path();
            std::fs::create_dir_all(root.join("a/b")).unwrap();
            std::fs::write(root.join("a/b/f"), vec![7u8; 5000]).unwrap();
            std::fs::hard_link(root.join("a/b/f"), root.join("g")).unwrap();
            std::os::unix::fs::symlink("a/b/f", root.join("a/s")).unwrap();
            let header = tree_header(root, "fuzz").unwrap();
            let mut stream = Vec::new();
            export(root, &header, &mut stream).unwrap();
            stream
        })
    }

    #[test]
    fn the_real_stream_imports() {
        let summary = import_fresh(real_stream()).unwrap();
        assert_eq!((summary.entries, summary.data_bytes), (5, 5000));
    }

    #[test]
    fn entries_beyond_the_volumes_allowance_are_refused_before_they_are_made() {
        use super::super::{IMPORT_BYTES_PER_ENTRY, MIN_IMPORT_ENTRIES};
        let source = tempfile::tempdir_in("/var/tmp").unwrap();
        // The root's directory and its files: one entry more than the smallest allowance.
        std::fs::create_dir(source.path().join("d")).unwrap();
        for n in 0..MIN_IMPORT_ENTRIES {
            std::fs::write(source.path().join("d").join(n.to_string()), b"").unwrap();
        }
        let header = tree_header(source.path(), "many").unwrap();
        let mut stream = Vec::new();
        export(source.path(), &header, &mut stream).unwrap();

        let small = tempfile::tempdir_in("/var/tmp").unwrap();
        let (importer, _) = Importer::start(&stream[..]).unwrap();
        let err = importer.into_tree(small.path(), 1 << 20).unwrap_err();
        assert!(
            matches!(
                err,
                ArchiveError::TooManyEntries { limit: MIN_IMPORT_ENTRIES, capacity } if capacity == 1 << 20
            ),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("import into a larger volume"),
            "{err}"
        );
        let made = std::fs::read_dir(small.path().join("d")).unwrap().count() as u64;
        assert_eq!(made, MIN_IMPORT_ENTRIES - 1, "the one too many was made");

        let big = tempfile::tempdir_in("/var/tmp").unwrap();
        let capacity = (MIN_IMPORT_ENTRIES + 1) * IMPORT_BYTES_PER_ENTRY;
        let (importer, _) = Importer::start(&stream[..]).unwrap();
        let summary = importer.into_tree(big.path(), capacity).unwrap();
        assert_eq!(summary.entries, MIN_IMPORT_ENTRIES + 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Any sequence of frames, however wrong, ends in an error or a tree inside the
        /// destination: never a panic, never a write outside.
        #[test]
        fn made_up_streams_stay_inside(
            steps in proptest::collection::vec(step(), 0..24),
            entries in 0..8u64,
        ) {
            let outside = outside();
            let stream = encode(&steps, outside.path(), entries, 0);
            let _ = import_fresh(&stream);
            assert_untouched(outside.path());
        }

        /// Any one changed byte of a real stream is an error, never a panic.
        #[test]
        fn a_changed_byte_is_always_refused(at in any::<prop::sample::Index>(), change in 1..=255u8) {
            let mut stream = real_stream().to_vec();
            let at = at.index(stream.len());
            stream[at] ^= change;
            prop_assert!(import_fresh(&stream).is_err(), "byte {at} ^ {change:#x}");
        }
    }
}
