//! The journal's generation reader (what `Journal::open` replays at start) on an arbitrary
//! file. Beyond "never panics":
//! - version 2 (the file starts with the magic): the entries returned are exactly the frames at
//!   the start of the file, in order, each re-encoded by the journal's own writer from the
//!   entry and the order numbers it carries, so nothing is returned that was not written whole
//!   with a matching checksum;
//! - version 1: the file is only ever cut (a torn tail), never otherwise changed;
//! - a later version (the magic's stem, another version after it): refused, unchanged;
//! - reading again what the first read left gives the same entries (and, version 1, no torn
//!   tail: it was cut).
#![no_main]

use std::fs;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use stickyvol::fuzzing::{JOURNAL_MAGIC, journal_frame, read_journal_generation};

/// One scratch file per fuzzing process, on a tmpfs when there is one.
fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let base = ["/dev/shm", "/tmp"]
            .into_iter()
            .map(PathBuf::from)
            .find(|dir| dir.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        base.join(format!("stickyvol-fuzz-journal-{}.1", std::process::id()))
    })
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

fuzz_target!(|data: &[u8]| {
    let path = scratch();
    fs::write(path, data).unwrap();
    let first = read_journal_generation(path);
    let left = fs::read(path).unwrap();
    if data.starts_with(&JOURNAL_MAGIC[..6]) && !data.starts_with(JOURNAL_MAGIC) {
        assert!(first.is_err(), "a later version's file is read");
        assert_eq!(left, data, "a later version's file is changed by reading");
        return;
    }
    if data.starts_with(JOURNAL_MAGIC) {
        assert_eq!(left, data, "a version 2 file is never changed by reading");
    } else {
        assert!(data.starts_with(&left), "a version 1 file is only cut");
    }
    let Ok((entries, torn)) = first else {
        return;
    };
    if data.starts_with(JOURNAL_MAGIC) {
        let mut at = JOURNAL_MAGIC.len();
        for entry in &entries {
            let len = u32_at(data, at) as usize;
            let (sequence, durable) = (u64_at(data, at + 8), u64_at(data, at + 16));
            let frame = journal_frame(entry, sequence, durable);
            assert_eq!(
                frame,
                data[at..at + 8 + len],
                "entry {entry:?} at byte {at} is not the frame there"
            );
            at += frame.len();
        }
    } else {
        assert!(
            left.len()
                >= entries
                    .iter()
                    .map(|e| 11 + e.id.len() + e.json.len())
                    .sum::<usize>(),
            "every version 1 entry takes its frame's bytes"
        );
    }
    let (again, torn_again) =
        read_journal_generation(path).expect("what was read once reads again");
    assert_eq!(again, entries);
    if data.starts_with(JOURNAL_MAGIC) {
        assert_eq!(
            torn_again, torn,
            "version 2: the same torn tail, ignored again"
        );
    } else {
        assert_eq!(torn_again, 0, "version 1: the first read cut the torn tail");
    }
});
