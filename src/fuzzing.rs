//! Entry points for the fuzz targets in `fuzz/` (cargo-fuzz), for the readers that are not
//! public otherwise. Each one runs the product's own code on untrusted bytes and returns what
//! it found; none re-implements anything. Not an API: hidden, and may change at any time.

use std::io;
use std::path::Path;

use crate::host::mountinfo::{self, MountEntry, ParseError};
use crate::volume::state::journal::Entry;
use crate::volume::state::journal_file::{self, Order, Replay};

/// Reads the journal generation file at `path` as the journal's load does (a version 1 file
/// with a torn tail is cut). Returns the good entries and how many torn tails were ignored.
pub fn read_journal_generation(path: &Path) -> io::Result<(Vec<Entry>, usize)> {
    let mut replay = Replay::default();
    journal_file::read_generation(path, &mut replay)?;
    Ok((replay.entries, replay.torn.len()))
}

/// The frame the journal writes for `entry` as the commit numbered `sequence` when the commits
/// up to `durable` were known flushed.
pub fn journal_frame(entry: &Entry, sequence: u64, durable: u64) -> Vec<u8> {
    journal_file::frame(entry, Order { sequence, durable })
}

/// The journal file's magic (a version 2 file starts with it).
pub const JOURNAL_MAGIC: &[u8] = journal_file::MAGIC;

/// Parses a mount table as `mountinfo::read_self` parses /proc/self/mountinfo's bytes.
pub fn parse_mountinfo(bytes: &[u8]) -> Result<Vec<MountEntry>, ParseError> {
    mountinfo::parse_bytes(bytes)
}
