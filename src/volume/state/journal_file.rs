//! The journal's files on disk (see `journal` for what they are for): naming, the entry
//! frames, and reading a generation back with its torn tail told apart from damage.
//!
//! **Layout (version 2).** `<name>.<generation>` starts with [`MAGIC`], then frames
//! `[payload length: u32 LE][crc32 of payload: u32 LE][payload]`, the payload
//! `[sequence: u64 LE][durable: u64 LE][op: u8][id length: u16 LE][id][record JSON]`, then
//! zeros. A file is filled with zeros and flushed *before* its first commit, so a commit
//! overwrites blocks that already exist and its `fdatasync` writes the data alone — appending
//! would also change the file's size, which costs a filesystem journal commit per flush. The
//! end of the entries is the first all-zero frame header.
//!
//! `sequence` numbers the entries of one driver run (consecutive within a file); `durable` is
//! the highest sequence known flushed when the entry was appended. They tell a crash from
//! damage: a bad frame followed by a good one that was appended *after the bad one was
//! flushed* (`durable >= its sequence - 1`) was acknowledged, so it is damage; otherwise the
//! bad frame and everything after it were never acknowledged (a crash before the flush; the
//! kernel may write a file's pages back in any order) and are ignored.
//!
//! **Full filesystems.** Overwriting the zeros of a prepared file needs no new block on XFS
//! or ext4, so it works on a full filesystem; btrfs copies on write, so its files are made
//! NOCOW (they carry their own checksums) to overwrite in place too. A new file or an append
//! past the end does need blocks: those fail with ENOSPC on a full filesystem.
//!
//! **Version 1** files (no magic, frames without `sequence`/`durable`, appended, nothing
//! after the last frame) were written by the previous release and are still read.
//!
//! **Later versions** keep the magic's first six bytes and change what follows. A file that
//! starts with them but not with [`MAGIC`] was written by a newer release: it is refused,
//! unchanged (read as version 1 it would be taken for a torn tail and cut off). A version 1
//! file cannot start with them: they would declare a frame of over 1 GiB.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use tracing::warn;

use super::files::sync_dir;

/// What an entry does to the record of its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The record's first version (a volume or snapshot created).
    Create,
    /// A new version of an existing record.
    Update,
    Remove,
}

impl Op {
    pub(in crate::volume) fn code(self) -> u8 {
        match self {
            Op::Create => 1,
            Op::Update => 2,
            Op::Remove => 3,
        }
    }

    pub(in crate::volume) fn of(code: u8) -> Option<Op> {
        match code {
            1 => Some(Op::Create),
            2 => Some(Op::Update),
            3 => Some(Op::Remove),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub op: Op,
    pub id: String,
    /// The record's JSON (empty for `Remove`).
    pub json: Vec<u8>,
}

pub const MAGIC: &[u8; 8] = b"SVJRNL2\n";
/// What the magic of every version from 2 on starts with.
const MAGIC_STEM: &[u8] = b"SVJRNL";
const HEADER: usize = 8;
/// `sequence` and `durable`.
const ORDER: usize = 16;
/// Far above any record; a larger declared length is garbage, so the writer refuses to write
/// one (`check_size`).
pub const MAX_PAYLOAD: usize = 16 << 20;
/// chattr +C (linux/fs.h); libc lacks it.
const FS_NOCOW_FL: libc::c_long = 0x0080_0000;

/// Where a frame sits in the order of commits (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Order {
    pub sequence: u64,
    pub durable: u64,
}

/// Where the entries of a version 2 generation end, so it can be continued in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    /// Just past the last good entry.
    pub offset: u64,
    /// The sequence of the last good entry (0: none).
    pub last_sequence: u64,
    /// Just past the last non-zero byte (a torn tail's remains reach up to here).
    pub dirty_until: u64,
    pub len: u64,
}

/// What reading the generations found.
#[derive(Debug, Default)]
pub struct Replay {
    /// Every good entry, oldest first.
    pub entries: Vec<Entry>,
    /// Torn tails ignored (one line each, already logged).
    pub torn: Vec<String>,
}

pub fn generation_path(dir: &Path, name: &str, generation: u64) -> PathBuf {
    dir.join(format!("{name}.{generation}"))
}

/// The next generation's file while it is being prepared (not a generation: never read).
fn spare_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.next"))
}

/// The generations of `name` in `dir`, oldest first.
pub fn generations(dir: &Path, name: &str) -> io::Result<Vec<u64>> {
    let prefix = format!("{name}.");
    let mut found = Vec::new();
    for entry in fs::read_dir(dir)? {
        let file_name = entry?.file_name();
        if let Some(generation) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|g| g.parse::<u64>().ok())
        {
            found.push(generation);
        }
    }
    found.sort_unstable();
    Ok(found)
}

/// Makes the file of a next generation: the magic, zeros up to `bytes`, flushed. Slow (it
/// writes `bytes`), so the compactor does it before it takes the journal's lock. A spare left
/// by an earlier attempt is overwritten in place, which needs no new blocks.
pub fn prepare(dir: &Path, name: &str, bytes: u64) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(spare_path(dir, name))?;
    if file.metadata()?.len() == 0 {
        set_nocow(&file);
    }
    file.write_all_at(MAGIC, 0)?;
    zero(&file, MAGIC.len() as u64, bytes)?;
    file.set_len(bytes.max(MAGIC.len() as u64))?;
    // The zeros' blocks and the file's size durable before any entry lands in them: else each
    // entry's fdatasync would also write the size and block map, the cost this layout avoids.
    file.sync_all()?;
    Ok(file)
}

/// Opens generation `path`, whose entries end at `end`, to append after them: the remains of
/// a torn tail are zeroed first (else an old frame beyond a new one could be read back as
/// new), then everything read is flushed, so it may be counted durable.
pub fn reopen(path: &Path, end: &End) -> io::Result<File> {
    let file = OpenOptions::new().read(true).write(true).open(path)?;
    zero(&file, end.offset, end.dirty_until)?;
    file.sync_data()?;
    Ok(file)
}

/// Empties a generation in place (its entries written back): its first frame header first and
/// flushed, so a crash midway leaves a generation that reads as empty, never a damaged one.
pub fn clear(file: &File, size: u64) -> io::Result<()> {
    let first = MAGIC.len() as u64;
    zero(file, first, size.min(first + HEADER as u64))?;
    file.sync_data()?;
    zero(file, first + HEADER as u64, size)?;
    file.sync_data()
}

/// Writes zeros over `from..to`.
pub fn zero(file: &File, from: u64, to: u64) -> io::Result<()> {
    let zeros = [0u8; 64 << 10];
    let mut at = from;
    while at < to {
        let chunk = (to - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..chunk], at)?;
        at += chunk as u64;
    }
    Ok(())
}

/// Marks an empty file NOCOW where the filesystem knows the flag (btrfs), so overwriting its
/// zeros needs no new blocks; elsewhere the ioctl fails and nothing changes.
fn set_nocow(file: &File) {
    use std::os::fd::AsRawFd;
    let mut flags: libc::c_long = 0;
    // SAFETY: both ioctls take a pointer to a long, valid for the call.
    unsafe {
        if libc::ioctl(file.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) == 0 {
            flags |= FS_NOCOW_FL;
            libc::ioctl(file.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags);
        }
    }
}

/// Makes a prepared file generation `generation`, its directory entry durable before any
/// commit goes there (else a power loss could drop the file with acknowledged commits).
pub fn install(dir: &Path, name: &str, generation: u64) -> io::Result<()> {
    fs::rename(
        spare_path(dir, name),
        generation_path(dir, name, generation),
    )?;
    sync_dir(dir)
}

/// Writes `frame` at `offset` of a generation's file.
pub fn write_frame(file: &File, offset: u64, frame: &[u8]) -> io::Result<()> {
    file.write_all_at(frame, offset)
}

/// Refuses an entry whose frame the reader would not take back (its id length must fit the
/// u16, its payload `MAX_PAYLOAD`), before anything is written.
pub fn check_size(entry: &Entry) -> io::Result<()> {
    let payload = ORDER + 3 + entry.id.len() + entry.json.len();
    if entry.id.len() > u16::MAX as usize || payload > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the record of {:.64} is {payload} bytes, more than the journal takes ({MAX_PAYLOAD})",
                entry.id
            ),
        ));
    }
    Ok(())
}

/// The frame of `entry` as the `order`-th commit.
pub fn frame(entry: &Entry, order: Order) -> Vec<u8> {
    let id = entry.id.as_bytes();
    let mut payload = Vec::with_capacity(ORDER + 3 + id.len() + entry.json.len());
    payload.extend_from_slice(&order.sequence.to_le_bytes());
    payload.extend_from_slice(&order.durable.to_le_bytes());
    payload.push(entry.op.code());
    payload.extend_from_slice(&(id.len() as u16).to_le_bytes());
    payload.extend_from_slice(id);
    payload.extend_from_slice(&entry.json);
    let mut frame = Vec::with_capacity(HEADER + payload.len());
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&crc32(&payload).to_le_bytes());
    frame.extend_from_slice(&payload);
    frame
}

/// `[op][id length][id][json]`, the payload of version 1 and the tail of version 2.
fn parse_entry(payload: &[u8]) -> Option<Entry> {
    let op = Op::of(*payload.first()?)?;
    let len = u16::from_le_bytes(payload.get(1..3)?.try_into().ok()?) as usize;
    let id = std::str::from_utf8(payload.get(3..3 + len)?)
        .ok()?
        .to_string();
    let json = payload[3 + len..].to_vec();
    Some(Entry { op, id, json })
}

/// The frame header at `at`: its declared payload length, if `bytes` holds a header there.
fn declared_length(bytes: &[u8], at: usize) -> Option<usize> {
    let header = bytes.get(at..at.checked_add(HEADER)?)?;
    Some(u32::from_le_bytes(header[..4].try_into().unwrap()) as usize)
}

/// The payload of a good frame at `at` (length in bounds, checksum right), and its end.
fn payload_at(bytes: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let len = declared_length(bytes, at)?;
    if len > MAX_PAYLOAD {
        return None;
    }
    let end = at + HEADER + len;
    let payload = bytes.get(at + HEADER..end)?;
    let crc = u32::from_le_bytes(bytes[at + 4..at + HEADER].try_into().unwrap());
    (crc32(payload) == crc).then_some((payload, end))
}

fn v2_frame_at(bytes: &[u8], at: usize) -> Option<(Entry, Order, usize)> {
    let (payload, end) = payload_at(bytes, at)?;
    let order = Order {
        sequence: u64::from_le_bytes(payload.get(..8)?.try_into().ok()?),
        durable: u64::from_le_bytes(payload.get(8..ORDER)?.try_into().ok()?),
    };
    Some((parse_entry(&payload[ORDER..])?, order, end))
}

/// Appends the good entries of the generation at `path` to `replay`, ignoring (and logging) a
/// torn tail, which is cut off a version 1 file; damage before good entries is an error, and
/// so is a newer version's file. Where a version 2 file's entries end.
pub fn read_generation(path: &Path, replay: &mut Replay) -> io::Result<Option<End>> {
    let (bytes, file_len) = read_written(path)?;
    let torn_before = replay.torn.len();
    let read = parse_generation(path, &bytes, file_len, replay)?;
    for torn in &replay.torn[torn_before..] {
        warn!(journal = %path.display(), "the journal ends with a torn entry (a commit interrupted by a crash, never acknowledged); ignoring it and what follows: {torn}");
    }
    if let Some(at) = read.cut_at {
        let file = OpenOptions::new().write(true).open(path)?;
        file.set_len(at)?;
        file.sync_data()?;
    }
    Ok(read.end)
}

/// `read_generation` without changing anything (a version 1 torn tail stays) or logging: what
/// the format check reads before the journal is opened.
pub fn peek_generation(path: &Path, replay: &mut Replay) -> io::Result<()> {
    let (bytes, file_len) = read_written(path)?;
    parse_generation(path, &bytes, file_len, replay).map(drop)
}

/// A generation's bytes up to its last non-zero one, and the file's length. A version 2 file
/// is filled with zeros past its entries (4 MiB a generation by default): reading them too
/// made every start hold the whole file in memory for nothing. Zeros are all the parser would
/// have found there (`read_v2` ends at the first all-zero header, a torn tail is non-zero).
/// A version 1 file has no zeros of ours after its frames and is read whole.
fn read_written(path: &Path) -> io::Result<(Vec<u8>, u64)> {
    let file = File::open(path)?;
    let file_len = file.metadata()?.len();
    let mut magic = [0u8; MAGIC.len()];
    let is_v2 = file_len >= MAGIC.len() as u64
        && file.read_exact_at(&mut magic, 0).is_ok()
        && &magic == MAGIC;
    let written = if is_v2 {
        last_non_zero_end(&file, file_len)?
    } else {
        file_len
    };
    let mut bytes = vec![0; usize::try_from(written).map_err(io::Error::other)?];
    file.read_exact_at(&mut bytes, 0)?;
    Ok((bytes, file_len))
}

/// The offset just past the last non-zero byte of the first `len` bytes, read backwards in
/// chunks so that memory does not follow the file's size.
fn last_non_zero_end(file: &File, len: u64) -> io::Result<u64> {
    const CHUNK: u64 = 64 << 10;
    let mut chunk = vec![0u8; CHUNK as usize];
    let mut end = len;
    while end > 0 {
        let start = end.saturating_sub(CHUNK);
        let part = &mut chunk[..(end - start) as usize];
        file.read_exact_at(part, start)?;
        if let Some(i) = part.iter().rposition(|&b| b != 0) {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// What reading a generation found, before anything is done about it.
struct Read {
    /// Where a version 2 file's entries end.
    end: Option<End>,
    /// Where a version 1 file's torn tail starts.
    cut_at: Option<u64>,
}

/// `bytes` are the file's first bytes, of its `file_len` (`read_written`).
fn parse_generation(
    path: &Path,
    bytes: &[u8],
    file_len: u64,
    replay: &mut Replay,
) -> io::Result<Read> {
    if bytes.starts_with(MAGIC_STEM) && !bytes.starts_with(MAGIC) {
        return Err(newer_version(path, bytes));
    }
    if !bytes.starts_with(MAGIC) {
        let cut_at = read_v1(path, bytes, replay)?;
        return Ok(Read { end: None, cut_at });
    }
    let mut end = End {
        offset: MAGIC.len() as u64,
        last_sequence: 0,
        dirty_until: 0,
        len: file_len,
    };
    read_v2(path, bytes, file_len as usize, replay, &mut end)?;
    end.dirty_until = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1) as u64;
    end.dirty_until = end.dirty_until.max(end.offset);
    Ok(Read {
        end: Some(end),
        cut_at: None,
    })
}

/// A generation written by a newer release (see the module comment).
fn newer_version(path: &Path, bytes: &[u8]) -> io::Error {
    let magic = &bytes[..bytes.len().min(MAGIC.len())];
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{} is a journal file of a newer layout (it starts with {:?}) than this release (stickyvol {}) reads ({:?}, or none: version 1). Refusing to start rather than misread it; nothing was changed, and the volumes' data is untouched. Roll forward to the release that wrote it or a later one",
            path.display(),
            String::from_utf8_lossy(magic).trim_end(),
            crate::LONG_VERSION,
            String::from_utf8_lossy(MAGIC).trim_end(),
        ),
    )
}

fn read_v2(
    path: &Path,
    bytes: &[u8],
    file_len: usize,
    replay: &mut Replay,
    end: &mut End,
) -> io::Result<()> {
    let mut at = MAGIC.len();
    while let Some(len) = declared_length(bytes, at) {
        if len == 0 && bytes[at + 4..at + HEADER] == [0; 4] {
            return Ok(()); // The zeros after the last entry.
        }
        if let Some((entry, order, next)) = v2_frame_at(bytes, at) {
            replay.entries.push(entry);
            at = next;
            *end = End {
                offset: at as u64,
                last_sequence: order.sequence,
                ..*end
            };
            continue;
        }
        let next = (len <= MAX_PAYLOAD)
            .then(|| v2_frame_at(bytes, at + HEADER + len))
            .flatten();
        if let Some((_, order, _)) = next
            && order.durable.saturating_add(1) >= order.sequence
        {
            return Err(damaged(path, at, file_len));
        }
        torn(path, at, file_len, replay);
        return Ok(());
    }
    if bytes[at..].iter().any(|&b| b != 0) {
        torn(path, at, file_len, replay);
    }
    Ok(())
}

/// Version 1: nothing follows the last frame, so a bad frame with more after it is damage.
/// Where a torn tail starts, to cut it off the file.
fn read_v1(path: &Path, bytes: &[u8], replay: &mut Replay) -> io::Result<Option<u64>> {
    let mut at = 0;
    while at < bytes.len() {
        if let Some((payload, end)) = payload_at(bytes, at)
            && let Some(entry) = parse_entry(payload)
        {
            replay.entries.push(entry);
            at = end;
            continue;
        }
        let reaches_end = match declared_length(bytes, at) {
            Some(len) => len > MAX_PAYLOAD || at + HEADER + len >= bytes.len(),
            None => true,
        };
        if !reaches_end {
            return Err(damaged(path, at, bytes.len()));
        }
        torn(path, at, bytes.len(), replay);
        return Ok(Some(at as u64));
    }
    Ok(None)
}

fn damaged(path: &Path, at: usize, len: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{} is damaged at byte {at} of {len}, with entries after it that were written once it was durable (not a crash's torn tail); refusing to start rather than lose or resurrect records: move the journal aside to start from the record files alone, knowing the changes it holds are lost",
            path.display()
        ),
    )
}

/// Notes a torn tail (logged by `read_generation`).
fn torn(path: &Path, at: usize, len: usize, replay: &mut Replay) {
    replay.torn.push(format!(
        "{}: ignored a torn last entry at byte {at} of {len} (a change whose commit never completed)",
        path.display()
    ));
}

/// What a crash before a commit's flush may leave: zeros where the last entry's tail was.
#[cfg(test)]
pub fn tear_last_entry(path: &Path) {
    let mut bytes = fs::read(path).unwrap();
    let end = bytes.iter().rposition(|&b| b != 0).unwrap() + 1;
    bytes[end - 4..end].fill(0);
    fs::write(path, &bytes).unwrap();
}

/// CRC-32 (IEEE 802.3, reflected, as zlib computes it).
pub fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut crc = !0u32;
    for &b in bytes {
        crc = TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(id: &str, json: &str) -> Entry {
        Entry {
            op: Op::Update,
            id: id.into(),
            json: json.as_bytes().to_vec(),
        }
    }

    fn order(sequence: u64, durable: u64) -> Order {
        Order { sequence, durable }
    }

    /// A version 2 file holding `frames`, preallocated to 4 KiB.
    fn v2_file(dir: &Path, frames: &[Vec<u8>]) -> PathBuf {
        let mut bytes = MAGIC.to_vec();
        frames.iter().for_each(|f| bytes.extend_from_slice(f));
        bytes.resize(4096, 0);
        let path = generation_path(dir, "j", 1);
        fs::write(&path, &bytes).unwrap();
        path
    }

    fn read(path: &Path) -> io::Result<Replay> {
        let mut replay = Replay::default();
        read_generation(path, &mut replay).map(|_| replay)
    }

    /// Flips a byte of the payload of `frame` (its checksum no longer matches).
    fn damage(mut frame: Vec<u8>) -> Vec<u8> {
        let last = frame.len() - 1;
        frame[last] ^= 0xff;
        frame
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn entries_end_at_the_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let path = v2_file(
            dir.path(),
            &[
                frame(&put("a", "1"), order(1, 0)),
                frame(&put("b", "2"), order(2, 1)),
            ],
        );
        let replay = read(&path).unwrap();
        assert_eq!(replay.entries, vec![put("a", "1"), put("b", "2")]);
        assert!(replay.torn.is_empty());
    }

    #[test]
    fn a_bad_last_entry_is_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = v2_file(
            dir.path(),
            &[
                frame(&put("a", "1"), order(1, 0)),
                damage(frame(&put("b", "2"), order(2, 1))),
            ],
        );
        let replay = read(&path).unwrap();
        assert_eq!(replay.entries, vec![put("a", "1")]);
        assert_eq!(replay.torn.len(), 1);
    }

    #[test]
    fn a_bad_entry_before_one_written_after_its_flush_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        // Entry 3 was appended once 2 was durable: 2 had been acknowledged.
        let path = v2_file(
            dir.path(),
            &[
                frame(&put("a", "1"), order(1, 0)),
                damage(frame(&put("b", "2"), order(2, 1))),
                frame(&put("c", "3"), order(3, 2)),
            ],
        );
        let err = read(&path).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("damaged"), "{err}");
    }

    #[test]
    fn a_bad_entry_before_one_written_before_its_flush_is_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        // Entries 2 and 3 waited for the same flush, which a crash stopped; the kernel wrote
        // 3's page back but not 2's. Neither was acknowledged.
        let path = v2_file(
            dir.path(),
            &[
                frame(&put("a", "1"), order(1, 0)),
                damage(frame(&put("b", "2"), order(2, 1))),
                frame(&put("c", "3"), order(3, 1)),
            ],
        );
        let replay = read(&path).unwrap();
        assert_eq!(replay.entries, vec![put("a", "1")]);
        assert_eq!(replay.torn.len(), 1);
    }

    #[test]
    fn garbage_after_the_entries_is_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut garbage = vec![0xff; 5];
        garbage.extend_from_slice(&[0; 3]);
        let path = v2_file(dir.path(), &[frame(&put("a", "1"), order(1, 0)), garbage]);
        let replay = read(&path).unwrap();
        assert_eq!(replay.entries, vec![put("a", "1")]);
        assert_eq!(replay.torn.len(), 1);
    }

    #[test]
    fn only_the_written_part_of_a_big_file_is_read_and_a_far_torn_tail_is_still_seen() {
        let dir = tempfile::tempdir().unwrap();
        let entry = frame(&put("a", "1"), order(1, 0));
        let path = v2_file(dir.path(), std::slice::from_ref(&entry));
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        // Several of the backward scan's chunks, as a prepared 4 MiB generation has.
        file.set_len(300 << 10).unwrap();
        let (bytes, len) = read_written(&path).unwrap();
        assert_eq!((bytes.len(), len), (MAGIC.len() + entry.len(), 300 << 10));
        let mut replay = Replay::default();
        let end = read_generation(&path, &mut replay).unwrap().unwrap();
        assert_eq!(replay.entries, vec![put("a", "1")]);
        assert!(replay.torn.is_empty());
        assert_eq!(end.len, 300 << 10);
        assert_eq!(end.dirty_until, end.offset);

        // A stray byte chunks away, past the zeros that end the entries: read up to it, and
        // the dirty end reaches it (continuing the file zeroes it first), as when the whole
        // file was read.
        file.write_all_at(&[7], 200 << 10).unwrap();
        assert_eq!(read_written(&path).unwrap().0.len(), (200 << 10) + 1);
        let mut replay = Replay::default();
        let end = read_generation(&path, &mut replay).unwrap().unwrap();
        assert_eq!(replay.entries, vec![put("a", "1")]);
        assert_eq!(
            (end.offset, end.dirty_until),
            (entry.len() as u64 + 8, (200 << 10) + 1)
        );
    }

    /// What the previous release wrote: frames without order, appended, nothing after them.
    fn v1_frame(entry: &Entry) -> Vec<u8> {
        let with_order = frame(entry, order(0, 0));
        let payload = &with_order[HEADER + ORDER..];
        let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&crc32(payload).to_le_bytes());
        frame.extend_from_slice(payload);
        frame
    }

    #[test]
    fn version_1_files_are_read_their_torn_tail_cut_and_damage_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = generation_path(dir.path(), "j", 1);
        let good = [v1_frame(&put("a", "1")), v1_frame(&put("b", "2"))].concat();
        fs::write(&path, &good).unwrap();
        assert_eq!(
            read(&path).unwrap().entries,
            vec![put("a", "1"), put("b", "2")]
        );

        fs::write(&path, &good[..good.len() - 3]).unwrap();
        let replay = read(&path).unwrap();
        assert_eq!(replay.entries, vec![put("a", "1")]);
        assert_eq!(replay.torn.len(), 1);
        assert_eq!(
            fs::read(&path).unwrap(),
            v1_frame(&put("a", "1")),
            "cut off"
        );

        let mut damaged = good.clone();
        damaged[HEADER + 1] ^= 0xff;
        let err = read_after_writing(&path, &damaged).unwrap_err();
        assert!(err.to_string().contains("damaged"), "{err}");
    }

    #[test]
    fn a_newer_version_is_refused_unchanged_and_names_what_it_found() {
        let dir = tempfile::tempdir().unwrap();
        let path = generation_path(dir.path(), "j", 1);
        let mut newer = b"SVJRNL3\n".to_vec();
        newer.extend_from_slice(&frame(&put("a", "1"), order(1, 0)));
        newer.resize(4096, 0);
        fs::write(&path, &newer).unwrap();
        let err = read(&path).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let message = err.to_string();
        assert!(message.contains("SVJRNL3"), "{message}");
        assert!(message.contains("Roll forward"), "{message}");
        assert_eq!(fs::read(&path).unwrap(), newer, "not cut as a torn tail");
        // Any version but this one's, even a short file.
        fs::write(&path, b"SVJRNL").unwrap();
        assert!(read(&path).is_err());
        assert_eq!(fs::read(&path).unwrap(), b"SVJRNL");
    }

    #[test]
    fn peeking_reads_the_entries_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = generation_path(dir.path(), "j", 1);
        let good = [v1_frame(&put("a", "1")), v1_frame(&put("b", "2"))].concat();
        let torn = &good[..good.len() - 3];
        fs::write(&path, torn).unwrap();
        let mut replay = Replay::default();
        peek_generation(&path, &mut replay).unwrap();
        assert_eq!(replay.entries, vec![put("a", "1")]);
        assert_eq!(replay.torn.len(), 1);
        assert_eq!(fs::read(&path).unwrap(), torn, "the torn tail stays");
    }

    fn read_after_writing(path: &Path, bytes: &[u8]) -> io::Result<Replay> {
        fs::write(path, bytes).unwrap();
        read(path)
    }
}
