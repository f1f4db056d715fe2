//! The stream's framing (see the module above for the layout): a writer that frames, hashes
//! and counts what it sends, a reader that checks every length before it allocates, and the
//! encoding of names and metadata.

use std::ffi::CString;
use std::fmt;
use std::io::{self, BufReader, BufWriter, Read, Write};

use super::hash::StreamHash;
use super::{ArchiveError, Header, Summary};
use crate::host::meta::{Meta, copied_xattr};
use nix::sys::time::TimeSpec;

pub(super) const MAGIC: &[u8; 16] = b"stickyvol-export";
pub(super) const VERSION: u32 = 1;
/// The most file data one DATA frame carries; also the size of the buffers.
pub(super) const DATA_CHUNK: usize = 1 << 20;
/// The largest payload a frame may have: a DATA frame's offset and data, or an entry's
/// metadata with up to 64 KiB of xattrs beyond a MiB.
pub const MAX_PAYLOAD: usize = DATA_CHUNK + (64 << 10);
const NAME_MAX: usize = 255;
pub(super) const TARGET_MAX: usize = 4096;
const XATTR_NAME_MAX: usize = 255;
const XATTR_VALUE_MAX: usize = 64 << 10;
/// As many xattrs as the kernel can list for one inode (64 KiB of names, each with its NUL).
const XATTRS_MAX: usize = 32 << 10;
/// The importer's input buffer: small frames come from it, payloads of more are read straight
/// into the payload buffer.
const READ_BUFFER: usize = 64 << 10;
/// Tag and payload length.
const FRAME_HEADER: usize = 5;
/// SHA-256, entries, data bytes.
const TRAILER_LEN: usize = 32 + 8 + 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tag {
    Header,
    Dir,
    EndDir,
    File,
    Data,
    FileEnd,
    Link,
    Symlink,
    Special,
    Trailer,
}

impl Tag {
    const ALL: [Tag; 10] = [
        Tag::Header,
        Tag::Dir,
        Tag::EndDir,
        Tag::File,
        Tag::Data,
        Tag::FileEnd,
        Tag::Link,
        Tag::Symlink,
        Tag::Special,
        Tag::Trailer,
    ];

    fn byte(self) -> u8 {
        match self {
            Tag::Header => b'H',
            Tag::Dir => b'D',
            Tag::EndDir => b'E',
            Tag::File => b'F',
            Tag::Data => b'B',
            Tag::FileEnd => b'Z',
            Tag::Link => b'L',
            Tag::Symlink => b'S',
            Tag::Special => b'N',
            Tag::Trailer => b'T',
        }
    }

    fn of(byte: u8) -> Option<Tag> {
        Tag::ALL.into_iter().find(|tag| tag.byte() == byte)
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Tag::Header => "HEADER",
            Tag::Dir => "DIR",
            Tag::EndDir => "END_DIR",
            Tag::File => "FILE",
            Tag::Data => "DATA",
            Tag::FileEnd => "FILE_END",
            Tag::Link => "LINK",
            Tag::Symlink => "SYMLINK",
            Tag::Special => "SPECIAL",
            Tag::Trailer => "TRAILER",
        };
        f.write_str(name)
    }
}

pub(super) fn corrupt(what: impl Into<String>) -> ArchiveError {
    ArchiveError::Corrupt(what.into())
}

/// A name as the stream may carry it: one path component.
pub(super) fn check_name(name: &[u8]) -> Result<(), ArchiveError> {
    let bad = name.is_empty()
        || name.len() > NAME_MAX
        || name == b"."
        || name == b".."
        || name.iter().any(|&b| b == b'/' || b == 0);
    if bad {
        return Err(corrupt(format!(
            "bad name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Writing

/// Frames, hashes and counts everything sent to `out`, through a buffer.
pub(super) struct FrameWriter<'o> {
    out: BufWriter<&'o mut dyn Write>,
    hasher: StreamHash,
    written: u64,
    /// The frame being built by `begin`.
    frame: Vec<u8>,
    /// A DATA frame's header and offset, then room for a chunk of data.
    data: Vec<u8>,
    /// Set once `out` failed: the error then is the consumer's, not the source's.
    pub(super) output_failed: bool,
}

const DATA_PREFIX: usize = FRAME_HEADER + 8;

impl<'o> FrameWriter<'o> {
    /// Writes the magic, the version and the header frame.
    pub(super) fn start(out: &'o mut dyn Write, header: &Header) -> io::Result<Self> {
        let mut writer = FrameWriter {
            out: BufWriter::with_capacity(DATA_CHUNK, out),
            hasher: StreamHash::new(),
            written: 0,
            frame: Vec::new(),
            data: Vec::new(),
            output_failed: false,
        };
        writer.send(MAGIC)?;
        writer.send(&VERSION.to_le_bytes())?;
        let json = serde_json::to_vec(header).map_err(io::Error::other)?;
        writer.begin(Tag::Header).extend_from_slice(&json);
        writer.end()?;
        Ok(writer)
    }

    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.hasher.update(bytes);
        self.written += bytes.len() as u64;
        self.out.write_all(bytes).inspect_err(|_| {
            self.output_failed = true;
        })
    }

    /// Starts a frame; its payload is appended to the returned buffer, then `end` sends it.
    pub(super) fn begin(&mut self, tag: Tag) -> &mut Vec<u8> {
        self.frame.clear();
        self.frame.push(tag.byte());
        self.frame.extend_from_slice(&[0; 4]);
        &mut self.frame
    }

    pub(super) fn end(&mut self) -> io::Result<()> {
        let len = self.frame.len() - FRAME_HEADER;
        if len > MAX_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "too much metadata for an export stream ({len} bytes, at most {MAX_PAYLOAD}; xattrs?)"
                ),
            ));
        }
        self.frame[1..FRAME_HEADER].copy_from_slice(&(len as u32).to_le_bytes());
        let frame = std::mem::take(&mut self.frame);
        let sent = self.send(&frame);
        self.frame = frame;
        sent
    }

    /// Room for up to `DATA_CHUNK` bytes of file data, to be sent by `send_data`.
    pub(super) fn data_buffer(&mut self) -> &mut [u8] {
        if self.data.is_empty() {
            self.data = vec![0; DATA_PREFIX + DATA_CHUNK];
        }
        &mut self.data[DATA_PREFIX..]
    }

    /// Sends the first `len` bytes of the data buffer as the data at `offset`.
    pub(super) fn send_data(&mut self, offset: u64, len: usize) -> io::Result<()> {
        let data = &mut self.data;
        data[0] = Tag::Data.byte();
        data[1..FRAME_HEADER].copy_from_slice(&((8 + len) as u32).to_le_bytes());
        data[FRAME_HEADER..DATA_PREFIX].copy_from_slice(&offset.to_le_bytes());
        let frame = std::mem::take(&mut self.data);
        let sent = self.send(&frame[..DATA_PREFIX + len]);
        self.data = frame;
        sent
    }

    /// Sends the trailer and flushes everything to `out`.
    pub(super) fn finish(mut self, entries: u64, data_bytes: u64) -> io::Result<Summary> {
        let sha256 = self.hasher.finish();
        let payload = self.begin(Tag::Trailer);
        payload.extend_from_slice(&sha256);
        payload.extend_from_slice(&entries.to_le_bytes());
        payload.extend_from_slice(&data_bytes.to_le_bytes());
        self.end()?;
        self.out.flush().inspect_err(|_| {
            self.output_failed = true;
        })?;
        Ok(Summary {
            stream_bytes: self.written,
            data_bytes,
            entries,
            sha256,
        })
    }
}

pub(super) fn put_u32(buf: &mut Vec<u8>, value: u32) {
    buf.extend_from_slice(&value.to_le_bytes());
}

pub(super) fn put_u64(buf: &mut Vec<u8>, value: u64) {
    buf.extend_from_slice(&value.to_le_bytes());
}

/// Appends a name (a component the kernel gave us: 1 to 255 bytes).
pub(super) fn put_name(buf: &mut Vec<u8>, name: &[u8]) {
    debug_assert!(check_name(name).is_ok());
    buf.push(name.len() as u8);
    buf.extend_from_slice(name);
}

pub(super) fn put_meta(buf: &mut Vec<u8>, meta: &Meta) {
    put_u32(buf, meta.mode);
    put_u32(buf, meta.uid);
    put_u32(buf, meta.gid);
    put_u64(buf, meta.rdev);
    for time in [meta.atime, meta.mtime] {
        buf.extend_from_slice(&time.tv_sec().to_le_bytes());
        put_u32(buf, time.tv_nsec() as u32);
    }
    put_u32(buf, meta.xattrs.len() as u32);
    for (name, value) in &meta.xattrs {
        // The kernel's own bounds: names up to 255 bytes, values up to 64 KiB.
        buf.push(name.as_bytes().len() as u8);
        buf.extend_from_slice(name.as_bytes());
        put_u32(buf, value.len() as u32);
        buf.extend_from_slice(value);
    }
}

// ---------------------------------------------------------------------------------------------
// Reading

/// Reads frames, checking lengths before reading payloads, and hashes what it reads.
pub(super) struct FrameReader<R: Read> {
    input: BufReader<R>,
    hasher: StreamHash,
    /// Bytes read so far.
    consumed: u64,
    /// The current frame's payload; never longer than MAX_PAYLOAD.
    payload: Vec<u8>,
    len: usize,
    /// The checksum of everything before the trailer, once it is reached.
    before_trailer: Option<[u8; 32]>,
}

impl<R: Read> FrameReader<R> {
    /// Reads and checks the magic, the version and the header frame.
    pub(super) fn start(input: R) -> Result<(Self, Header), ArchiveError> {
        let mut reader = FrameReader {
            input: BufReader::with_capacity(READ_BUFFER, input),
            hasher: StreamHash::new(),
            consumed: 0,
            payload: Vec::new(),
            len: 0,
            before_trailer: None,
        };
        let mut magic = [0u8; MAGIC.len()];
        let got = reader.read_up_to(&mut magic)?;
        if magic[..got] != MAGIC[..got] {
            return Err(ArchiveError::NotAnExport);
        }
        if got < magic.len() {
            return Err(ArchiveError::Truncated(reader.consumed));
        }
        let mut version = [0u8; 4];
        reader.fill(&mut version)?;
        reader.hasher.update(&magic);
        reader.hasher.update(&version);
        match u32::from_le_bytes(version) {
            VERSION => {}
            0 => return Err(corrupt("format version 0")),
            newer => return Err(ArchiveError::Version(newer)),
        }
        let (tag, payload) = reader.next()?;
        if tag != Tag::Header {
            return Err(corrupt(format!("{tag} frame where the header belongs")));
        }
        let header =
            serde_json::from_slice(payload).map_err(|err| corrupt(format!("bad header: {err}")))?;
        Ok((reader, header))
    }

    /// Reads until `buf` is full or the input ends; returns how much it got.
    fn read_up_to(&mut self, buf: &mut [u8]) -> Result<usize, ArchiveError> {
        let mut got = 0;
        while got < buf.len() {
            match self.input.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => {
                    got += n;
                    self.consumed += n as u64;
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(ArchiveError::Input(err)),
            }
        }
        Ok(got)
    }

    fn fill(&mut self, buf: &mut [u8]) -> Result<(), ArchiveError> {
        if self.read_up_to(buf)? < buf.len() {
            return Err(ArchiveError::Truncated(self.consumed));
        }
        Ok(())
    }

    /// Reads a payload of `len` bytes (checked: at most MAX_PAYLOAD) into `payload`, the
    /// buffer kept between frames. The buffer grows only with what arrives, by doubling from
    /// READ_BUFFER: a length field alone, in a stream that ends or stalls, never makes the
    /// reader allocate more than the bytes it really got justify.
    fn fill_payload(&mut self, payload: &mut Vec<u8>, len: usize) -> Result<(), ArchiveError> {
        let mut got = 0;
        while got < len {
            let want = len.min(READ_BUFFER.max(2 * got));
            if payload.len() < want {
                payload.reserve_exact(want - payload.len());
                payload.resize(want, 0);
            }
            self.fill(&mut payload[got..want])?;
            got = want;
        }
        Ok(())
    }

    /// The next frame. After a TRAILER, call `finish`.
    pub(super) fn next(&mut self) -> Result<(Tag, &[u8]), ArchiveError> {
        let mut head = [0u8; FRAME_HEADER];
        self.fill(&mut head)?;
        let Some(tag) = Tag::of(head[0]) else {
            return Err(corrupt(format!(
                "unknown frame tag 0x{:02x} at byte {}",
                head[0],
                self.consumed - FRAME_HEADER as u64
            )));
        };
        let len = u32::from_le_bytes(head[1..].try_into().expect("4 bytes")) as usize;
        if len > MAX_PAYLOAD {
            return Err(corrupt(format!(
                "{tag} frame of {len} bytes (at most {MAX_PAYLOAD})"
            )));
        }
        if tag == Tag::Trailer {
            self.before_trailer = Some(self.hasher.finish());
        } else {
            self.hasher.update(&head);
        }
        let mut payload = std::mem::take(&mut self.payload);
        let filled = self.fill_payload(&mut payload, len);
        self.payload = payload;
        filled?;
        self.len = len;
        if tag != Tag::Trailer {
            self.hasher.update(&self.payload[..len]);
        }
        Ok((tag, &self.payload[..len]))
    }

    /// After a TRAILER frame: checks the checksum and the counts, and that the input ends.
    pub(super) fn finish(mut self, entries: u64, data_bytes: u64) -> Result<Summary, ArchiveError> {
        let computed = self.before_trailer.expect("finish follows a trailer frame");
        if self.len != TRAILER_LEN {
            return Err(corrupt(format!("a trailer of {} bytes", self.len)));
        }
        let mut fields = Fields::new(&self.payload[..self.len]);
        let sha256: [u8; 32] = fields.take(32)?.try_into().expect("32 bytes");
        let (said_entries, said_data) = (fields.u64()?, fields.u64()?);
        fields.end()?;
        if sha256 != computed {
            return Err(corrupt(format!(
                "checksum mismatch: the trailer says {}, the stream hashes to {}",
                hex(&sha256),
                hex(&computed)
            )));
        }
        if (said_entries, said_data) != (entries, data_bytes) {
            return Err(corrupt(format!(
                "the trailer counts {said_entries} entries and {said_data} data bytes, the stream held {entries} and {data_bytes}"
            )));
        }
        let stream_bytes = self.consumed;
        if self.read_up_to(&mut [0u8; 1])? > 0 {
            return Err(corrupt(format!(
                "data after the end of the stream (at byte {stream_bytes})"
            )));
        }
        Ok(Summary {
            stream_bytes,
            data_bytes,
            entries,
            sha256,
        })
    }

    #[cfg(test)]
    pub(super) fn buffer_capacity(&self) -> usize {
        self.payload.capacity()
    }
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decodes a payload field by field; running short or leaving bytes over is corruption.
pub(super) struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    pub(super) fn new(payload: &'a [u8]) -> Self {
        Fields { rest: payload }
    }

    pub(super) fn take(&mut self, len: usize) -> Result<&'a [u8], ArchiveError> {
        if len > self.rest.len() {
            return Err(corrupt("a frame ends inside a field"));
        }
        let (taken, rest) = self.rest.split_at(len);
        self.rest = rest;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ArchiveError> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    fn u8(&mut self) -> Result<u8, ArchiveError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, ArchiveError> {
        self.array().map(u16::from_le_bytes)
    }

    pub(super) fn u32(&mut self) -> Result<u32, ArchiveError> {
        self.array().map(u32::from_le_bytes)
    }

    pub(super) fn u64(&mut self) -> Result<u64, ArchiveError> {
        self.array().map(u64::from_le_bytes)
    }

    /// The rest of the payload.
    pub(super) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.rest)
    }

    pub(super) fn end(self) -> Result<(), ArchiveError> {
        if !self.rest.is_empty() {
            return Err(corrupt(format!(
                "{} unexpected bytes at the end of a frame",
                self.rest.len()
            )));
        }
        Ok(())
    }

    pub(super) fn name(&mut self) -> Result<CString, ArchiveError> {
        let len = self.u8()?;
        let name = self.take(len as usize)?;
        check_name(name)?;
        Ok(CString::new(name).expect("checked: no NUL"))
    }

    /// A symlink's target: 1 to 4096 bytes without NUL.
    pub(super) fn target(&mut self) -> Result<CString, ArchiveError> {
        let len = self.u16()? as usize;
        let target = self.take(len)?;
        if len == 0 || len > TARGET_MAX || target.contains(&0) {
            return Err(corrupt(format!("bad symlink target of {len} bytes")));
        }
        Ok(CString::new(target).expect("checked: no NUL"))
    }

    fn time(&mut self) -> Result<TimeSpec, ArchiveError> {
        let seconds = i64::from_le_bytes(self.array()?);
        let nanos = self.u32()?;
        if nanos >= 1_000_000_000 {
            return Err(corrupt(format!("bad nanoseconds {nanos}")));
        }
        Ok(TimeSpec::new(seconds, nanos.into()))
    }

    /// Metadata for an inode of type `kind` (S_IFDIR, ...; any of `kinds`).
    pub(super) fn meta(&mut self, kinds: &[u32]) -> Result<Meta, ArchiveError> {
        let mode = self.u32()?;
        if !kinds.contains(&(mode & libc::S_IFMT)) || mode & !(libc::S_IFMT | 0o7777) != 0 {
            return Err(corrupt(format!("unexpected mode {mode:o}")));
        }
        let (uid, gid, rdev) = (self.u32()?, self.u32()?, self.u64()?);
        let (atime, mtime) = (self.time()?, self.time()?);
        let count = self.u32()? as usize;
        if count > XATTRS_MAX {
            return Err(corrupt(format!("{count} xattrs on one entry")));
        }
        let mut xattrs = Vec::new();
        for _ in 0..count {
            let len = self.u8()?;
            let name = self.take(len as usize)?;
            let bad = name.is_empty()
                || name.len() > XATTR_NAME_MAX
                || name.contains(&0)
                || !copied_xattr(name);
            if bad {
                return Err(corrupt(format!(
                    "bad xattr name {:?}",
                    String::from_utf8_lossy(name)
                )));
            }
            let len = self.u32()? as usize;
            if len > XATTR_VALUE_MAX {
                return Err(corrupt(format!("xattr value of {len} bytes")));
            }
            let value = self.take(len)?;
            xattrs.push((CString::new(name).expect("checked"), value.to_vec()));
        }
        Ok(Meta {
            ino: 0,
            mode,
            uid,
            gid,
            rdev,
            size: 0,
            allocated: 0,
            atime,
            mtime,
            xattrs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use sha2::{Digest, Sha256};

    fn header() -> Header {
        Header {
            kind: super::super::Kind::Tree,
            allocated_bytes: 1,
            size_bytes: 2,
            source: "sv-test".into(),
            created_unix_ms: 3,
            image: None,
        }
    }

    fn sample_meta() -> Meta {
        Meta {
            ino: 0,
            mode: libc::S_IFREG | 0o4755,
            uid: 1234,
            gid: 5678,
            rdev: 0,
            size: 0,
            allocated: 0,
            atime: TimeSpec::new(-5, 999_999_999),
            mtime: TimeSpec::new(1_600_000_000, 1),
            xattrs: vec![
                (c"user.a".to_owned(), b"value".to_vec()),
                (c"trusted.b".to_owned(), vec![]),
                (c"system.posix_acl_access".to_owned(), vec![0, 255, 7]),
            ],
        }
    }

    /// A stream of a header, the given frames and a correct trailer.
    fn stream(frames: &[(Tag, Vec<u8>)], entries: u64, data: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut writer = FrameWriter::start(&mut out, &header()).unwrap();
        for (tag, payload) in frames {
            writer.begin(*tag).extend_from_slice(payload);
            writer.end().unwrap();
        }
        writer.finish(entries, data).unwrap();
        out
    }

    type Frames = Vec<(Tag, Vec<u8>)>;

    fn read_all(bytes: &[u8]) -> Result<(Frames, Summary), ArchiveError> {
        let (mut reader, read_header) = FrameReader::start(bytes)?;
        assert_eq!(read_header, header());
        let mut frames = Vec::new();
        loop {
            let (tag, payload) = reader.next()?;
            let payload = payload.to_vec();
            assert!(reader.buffer_capacity() <= MAX_PAYLOAD);
            if tag == Tag::Trailer {
                break;
            }
            frames.push((tag, payload));
        }
        let summary = reader.finish(1, 2)?;
        Ok((frames, summary))
    }

    #[test]
    fn frames_round_trip() {
        let frames = vec![
            (Tag::Dir, vec![1, b'a']),
            (Tag::FileEnd, vec![]),
            (Tag::EndDir, vec![9; 1000]),
        ];
        let bytes = stream(&frames, 1, 2);
        assert!(bytes.starts_with(b"stickyvol-export\x01\0\0\0H"));
        let (read, summary) = read_all(&bytes).unwrap();
        assert_eq!(read, frames);
        assert_eq!(summary.stream_bytes, bytes.len() as u64);
        let trailer = &bytes[bytes.len() - TRAILER_LEN..];
        assert_eq!(&summary.sha256[..], &trailer[..32]);
        assert_eq!(
            summary.sha256,
            <[u8; 32]>::from(Sha256::digest(
                &bytes[..bytes.len() - TRAILER_LEN - FRAME_HEADER]
            ))
        );
        // The counts must match what the importer saw.
        let err = FrameReader::start(&bytes[..]).and_then(|(mut reader, _)| {
            while reader.next()?.0 != Tag::Trailer {}
            reader.finish(1, 3)
        });
        assert!(matches!(err, Err(ArchiveError::Corrupt(m)) if m.contains("counts")));
    }

    #[test]
    fn data_frames_carry_offset_and_bytes() {
        let mut out = Vec::new();
        let mut writer = FrameWriter::start(&mut out, &header()).unwrap();
        writer.data_buffer()[..3].copy_from_slice(b"abc");
        writer.send_data(1 << 40, 3).unwrap();
        writer.finish(1, 2).unwrap();
        let (frames, _) = read_all(&out).unwrap();
        let mut expected = (1u64 << 40).to_le_bytes().to_vec();
        expected.extend_from_slice(b"abc");
        assert_eq!(frames, vec![(Tag::Data, expected)]);
    }

    #[test]
    fn bad_starts() {
        let good = stream(&[], 1, 2);
        let start = |bytes: &[u8]| FrameReader::start(bytes).map(|_| ());
        assert!(matches!(
            start(b"#!/bin/sh\necho hello world\n"),
            Err(ArchiveError::NotAnExport)
        ));
        assert!(matches!(start(b"sticky"), Err(ArchiveError::Truncated(6))));
        assert!(matches!(start(b""), Err(ArchiveError::Truncated(0))));
        let mut newer = good.clone();
        newer[16] = 2;
        let err = start(&newer).unwrap_err();
        assert!(matches!(err, ArchiveError::Version(2)), "{err}");
        let message = err.to_string();
        for part in [
            "export stream format 2 is newer",
            crate::LONG_VERSION,
            "reads (format 1)",
            "nothing was imported",
            "the release that exported it or a later one",
        ] {
            assert!(message.contains(part), "{part:?} missing from: {message}");
        }
        let mut zero = good.clone();
        zero[16] = 0;
        assert!(matches!(start(&zero), Err(ArchiveError::Corrupt(_))));
        let mut no_header = good.clone();
        no_header[20] = b'D';
        assert!(matches!(start(&no_header), Err(ArchiveError::Corrupt(_))));
        assert!(matches!(
            start(&good[..30]),
            Err(ArchiveError::Truncated(30))
        ));
    }

    #[test]
    fn oversized_frames_are_refused_before_reading_them() {
        let mut bytes = stream(&[], 1, 2);
        let trailer_at = bytes.len() - TRAILER_LEN - FRAME_HEADER;
        bytes.truncate(trailer_at);
        bytes.push(b'B');
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        let (mut reader, _) = FrameReader::start(&bytes[..]).unwrap();
        let err = reader.next().unwrap_err();
        assert!(
            matches!(&err, ArchiveError::Corrupt(m) if m.contains("4294967295 bytes")),
            "{err}"
        );
        assert!(reader.buffer_capacity() <= MAX_PAYLOAD);
        bytes[trailer_at] = 0x7f;
        let (mut reader, _) = FrameReader::start(&bytes[..]).unwrap();
        assert!(matches!(reader.next(), Err(ArchiveError::Corrupt(m)) if m.contains("0x7f")));
    }

    /// Found by fuzz/fuzz_targets/export_stream.rs (minimized): a header frame that claims
    /// MAX_PAYLOAD bytes in a stream of 25 made the reader allocate its whole payload buffer
    /// (1.06 MiB) before reading any of it. The buffer now grows with what arrives.
    #[test]
    fn a_length_field_alone_allocates_nothing_beyond_one_read_buffer() {
        let claim = b"stickyvol-export\x01\0\0\0H\0\0\x11\0";
        assert_eq!(MAX_PAYLOAD, 0x11_0000);
        let mut reader = FrameReader {
            input: BufReader::with_capacity(READ_BUFFER, &claim[..]),
            hasher: StreamHash::new(),
            consumed: 0,
            payload: Vec::new(),
            len: 0,
            before_trailer: None,
        };
        reader.fill(&mut [0u8; 20]).unwrap();
        assert!(matches!(reader.next(), Err(ArchiveError::Truncated(25))));
        assert!(reader.buffer_capacity() <= READ_BUFFER);
        assert!(matches!(
            FrameReader::start(&claim[..]),
            Err(ArchiveError::Truncated(25))
        ));

        // A frame that arrives whole still reads whole, past several doublings.
        let big = vec![7u8; MAX_PAYLOAD];
        let bytes = stream(&[(Tag::EndDir, big.clone())], 1, 2);
        let (frames, _) = read_all(&bytes).unwrap();
        assert_eq!(frames, vec![(Tag::EndDir, big)]);
    }

    #[test]
    fn names_are_single_components() {
        for good in [
            &b"a"[..],
            b"...",
            b".hidden",
            b"with space",
            &[b'x'; 255],
            b"\xff\xfe",
        ] {
            assert!(check_name(good).is_ok(), "{good:?}");
        }
        for bad in [&b""[..], b".", b"..", b"a/b", b"/", b"a\0b", &[b'x'; 256]] {
            assert!(
                matches!(check_name(bad), Err(ArchiveError::Corrupt(_))),
                "{bad:?}"
            );
        }
        let mut payload = vec![2];
        payload.extend_from_slice(b"..");
        assert!(Fields::new(&payload).name().is_err());
        assert!(Fields::new(&[5, b'a']).name().is_err(), "runs short");
    }

    #[test]
    fn meta_round_trips_and_is_checked() {
        let meta = sample_meta();
        let mut buf = Vec::new();
        put_meta(&mut buf, &meta);
        let mut fields = Fields::new(&buf);
        let read = fields.meta(&[libc::S_IFREG]).unwrap();
        fields.end().unwrap();
        assert_eq!(
            (read.mode, read.uid, read.gid, read.rdev),
            (meta.mode, 1234, 5678, 0)
        );
        assert_eq!((read.atime, read.mtime), (meta.atime, meta.mtime));
        assert_eq!(read.xattrs, meta.xattrs);
        // The frame's type must be the entry's.
        assert!(Fields::new(&buf).meta(&[libc::S_IFDIR]).is_err());

        let patched = |at: usize, bytes: &[u8]| {
            let mut bad = buf.clone();
            bad[at..at + bytes.len()].copy_from_slice(bytes);
            Fields::new(&bad).meta(&[libc::S_IFREG]).map(|_| ())
        };
        // Nanoseconds (atime's at 20 + 8), mode bits, xattr count, a namespace not kept.
        assert!(patched(28, &1_000_000_000u32.to_le_bytes()).is_err());
        assert!(patched(0, &(libc::S_IFREG | 0o10000).to_le_bytes()).is_err());
        assert!(patched(44, &(XATTRS_MAX as u32 + 1).to_le_bytes()).is_err());
        assert!(patched(49, b"other").is_err());
        assert!(patched(44, &4u32.to_le_bytes()).is_err(), "runs short");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// Random bytes, alone or after a valid start, never panic the reader nor make it
        /// hold more than one bounded payload.
        #[test]
        fn random_bytes_are_refused_calmly(
            tail in proptest::collection::vec(any::<u8>(), 0..4096),
            valid_start in any::<bool>(),
            lengths in proptest::collection::vec((any::<u8>(), any::<u32>()), 0..8),
        ) {
            let mut bytes = if valid_start {
                let mut start = stream(&[], 0, 0);
                start.truncate(start.len() - TRAILER_LEN - FRAME_HEADER);
                start
            } else {
                Vec::new()
            };
            // Frame headers with random tags and lengths, then noise.
            for (tag, len) in lengths {
                bytes.push(tag);
                bytes.extend_from_slice(&len.to_le_bytes());
            }
            bytes.extend_from_slice(&tail);
            if let Ok((mut reader, _)) = FrameReader::start(&bytes[..]) {
                loop {
                    let next = reader.next().map(|(tag, payload)| {
                        if let Ok(meta) = Fields::new(payload).meta(&[libc::S_IFREG]) {
                            assert!(meta.xattrs.len() <= XATTRS_MAX);
                        }
                        let _ = Fields::new(payload).name();
                        tag
                    });
                    prop_assert!(reader.buffer_capacity() <= MAX_PAYLOAD);
                    match next {
                        Ok(Tag::Trailer) => {
                            prop_assert!(reader.finish(0, 0).is_err());
                            break;
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
            }
        }

        #[test]
        fn random_metadata_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Fields::new(&bytes).meta(&[libc::S_IFREG, libc::S_IFDIR]);
            let _ = Fields::new(&bytes).target();
        }
    }
}
