//! stickyvol's own export stream: a volume's content as one byte stream, to move it between
//! nodes (`stickyvol volume export ID > f`, `stickyvol volume import ID < f`). A filesystem
//! volume travels as its directory tree (every file type, owners, modes, nanosecond times,
//! xattrs with ACLs and security labels, hard links, holes), a block volume as its image's
//! data segments. Metadata is read and applied by the same code as `copy` (`host::meta`).
//!
//! # Format (version 1)
//!
//! All integers little-endian.
//!
//! ```text
//! stream  = magic "stickyvol-export" (16 bytes), version u32 = 1, HEADER, body, TRAILER, EOF
//! frame   = tag u8, payload length u32 (at most MAX_PAYLOAD), payload
//! name    = length u8 (1..=255), bytes (one path component: no '/', no NUL, not "." or "..")
//! meta    = mode u32, uid u32, gid u32, rdev u64, atime (s i64, ns u32), mtime (s i64, ns u32),
//!           xattr count u32 (≤ 32768), then each: name length u8, name, value length u32
//!           (≤ 64 KiB), value; only the namespaces `copy` keeps (user., trusted., security.,
//!           POSIX ACLs)
//!
//! H HEADER    JSON of [`Header`]
//! D DIR       name: creates the directory (0700) in the current one and enters it
//! E END_DIR   meta: applied to the current directory, then climb to its parent; the root's
//!             END_DIR (its meta is applied to the import's destination) ends the body
//! F FILE      name, size u64, link id u64 (0: none), later names u32, meta; then its data
//! B DATA      offset u64, at most 1 MiB of bytes; offsets grow, holes are simply absent
//! Z FILE_END  (empty): the file gets its length (trailing holes), then its meta
//! L LINK      name, link id: another name of a FILE met earlier with that id
//! S SYMLINK   name, target length u16 (1..=4096), target bytes, meta
//! N SPECIAL   name, meta (fifo, socket, character or block device: type and rdev in meta)
//! T TRAILER   SHA-256 of every stream byte before this frame (32), entries u64, data bytes u64
//! ```
//!
//! A tree's body lists entries in walk order, names relative to the current directory, so
//! the importer holds one directory open and memory grows only with the depth (the identity of
//! each open level, at most `tree::MAX_DEPTH`) and with the hard-linked files still awaiting
//! their other names (the exporter numbers multi-link regular files at their first name and
//! says how many names follow; the importer links later names from a spare name it keeps, and
//! tracks at most `links::MAX_WAITING_LINKS` of them). An image's body is DATA frames only. The importer checks the trailer's checksum
//! and counts against what it read and wants EOF right after it. Both ends read and write
//! through 1 MiB buffers and hash on a helper thread, so hashing overlaps the I/O.
//!
//! # Trust
//!
//! On import the stream is untrusted: every length is checked against its bound before
//! anything is allocated (one payload buffer of [`MAX_PAYLOAD`] bytes), every name is a single
//! validated component, and everything is created with *at calls relative to directory
//! descriptors opened from the destination downwards with O_NOFOLLOW, new files with O_EXCL,
//! so an entry can never write through a symlink or outside the destination. What it creates
//! is bounded by the destination's capacity: bytes of data, and entries ([`entry_limit`]),
//! each refused before it is made; depth by `tree::MAX_DEPTH`. On error the
//! partial content stays for the caller to remove; nothing is fsync'ed. What lands is taken
//! as the stream says: owners, setuid bits, file capabilities and device nodes included.
//!
//! Not carried: what `copy` does not carry either (inode flags, project ids, ctime), and hard
//! links between names of anything but regular files (each such name becomes its own inode).
//! A regular file of at most 1 MiB whose allocation covers its length is read whole, without
//! asking for holes: a hole in it (possible only beside blocks preallocated past its end)
//! arrives as zeros.

mod export;
mod format;
mod hash;
mod import;

pub use export::{export, image_header, tree_header};
pub use format::MAX_PAYLOAD;
pub use import::Importer;

use super::fsimage::FsType;
use super::tree::WalkError;

/// Capacity an import charges each entry it creates (file, directory, link, symlink, special
/// file): a pod could otherwise fill the pool's inodes, which no block quota counts, with a
/// small stream of empty files. About twice what an inode and its name cost on XFS or ext4.
pub const IMPORT_BYTES_PER_ENTRY: u64 = 1024;
/// Entries an import into even the smallest volume may create.
pub const MIN_IMPORT_ENTRIES: u64 = 4096;

/// The most entries an import into a volume of `capacity` bytes creates.
pub fn entry_limit(capacity: u64) -> u64 {
    (capacity / IMPORT_BYTES_PER_ENTRY).max(MIN_IMPORT_ENTRIES)
}

/// What a stream holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A filesystem volume's directory tree.
    Tree,
    /// A block volume's image file.
    Image,
}

/// What an image stream's bytes are: a raw block device's, or a filesystem a node will mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageOf {
    /// A block volume's bytes: handed to a pod as a device, never mounted by the node.
    Raw,
    /// An image volume's filesystem, which the node's kernel mounts.
    Filesystem(FsType),
}

/// What a stream declares about itself, up front.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Header {
    pub kind: Kind,
    /// Tree: sum of the regular files' allocated bytes (st_blocks*512, each inode once);
    /// Image: the file's allocated bytes. What the data will roughly need on the target;
    /// import refuses up front when it exceeds the target's limit.
    pub allocated_bytes: u64,
    /// Tree: sum of regular-file sizes (each inode once); Image: the file's length.
    pub size_bytes: u64,
    /// The volume the stream was made from (informational), e.g. "sv-…".
    pub source: String,
    pub created_unix_ms: u64,
    /// Image streams: what the image holds. Absent from streams of releases before it was
    /// added (and from tree streams), which are therefore never imported into an image volume:
    /// the node would mount bytes nobody said were a filesystem of that kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageOf>,
}

/// Counts of a finished export or import.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Bytes of the whole stream, trailer included.
    pub stream_bytes: u64,
    /// Bytes of file data carried (holes excluded).
    pub data_bytes: u64,
    /// Tree: entries created/emitted below the root (directories, files, links, symlinks,
    /// special files); image: 0.
    pub entries: u64,
    /// The checksum in the trailer.
    pub sha256: [u8; 32],
}

impl Summary {
    /// The stream's checksum as people and logs see it: lower-case hex.
    pub fn sha256_hex(&self) -> String {
        format::hex(&self.sha256)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("not a stickyvol export stream")]
    NotAnExport,
    /// Checked before anything is written: nothing was imported.
    #[error(
        "export stream format {0} is newer than this release (stickyvol {release}) reads (format {ours}); nothing was imported: import it with the release that exported it or a later one",
        release = crate::LONG_VERSION,
        ours = format::VERSION
    )]
    Version(u32),
    #[error("stream is a {found:?} export but the volume needs a {wanted:?} one")]
    WrongKind { found: Kind, wanted: Kind },
    /// Bad framing, an unknown tag, a bad name, a checksum mismatch, data after the end...
    #[error("corrupt export stream: {0}")]
    Corrupt(String),
    #[error("export stream ends early (truncated after {0} bytes)")]
    Truncated(u64),
    /// Beyond the import's limit, or the filesystem answered EDQUOT or ENOSPC.
    #[error("the stream's content does not fit in the volume ({limit} bytes)")]
    TooLarge { limit: u64 },
    /// More entries than [`entry_limit`] allows a volume of its capacity.
    #[error(
        "the stream holds more than {limit} entries, the most a volume of {capacity} bytes takes \
         (one per {IMPORT_BYTES_PER_ENTRY} bytes of capacity, at least {MIN_IMPORT_ENTRIES}); \
         import into a larger volume"
    )]
    TooManyEntries { limit: u64, capacity: u64 },
    /// Reading the source tree or writing the target, with the path.
    #[error(transparent)]
    Walk(#[from] WalkError),
    /// The consumer of an export went away.
    #[error("writing the stream: {0}")]
    Output(std::io::Error),
    #[error("reading the stream: {0}")]
    Input(std::io::Error),
}
