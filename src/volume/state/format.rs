//! Which format the node's state is in, and refusing what this release cannot read.
//!
//! Serde ignores fields it does not know, so a release reading state written by a newer one
//! could take a record for something it is not. So a record carries the lowest format a reader
//! needs to read it correctly, `"needs": N`, and the release that wrote it, `"written_by"`,
//! both only when N > 1: a record without them is format 1, what every release before the
//! marker wrote, and reads the same in them. Format 2 adds image volumes (and snapshots of
//! them), which releases before it cannot read. Format 3 adds encrypted volumes (and their
//! snapshots): a release before it would take their LUKS device for a filesystem or a plain
//! device, and delete them without erasing their header. Format 4 adds group snapshots: a
//! release before it would take a member for a snapshot of its own (and delete it alone),
//! and keep the members of a group a crash cut short.
//!
//! A release that changes what a record means raises N in the records concerned; one that
//! changes the journal's frames changes its magic (see `journal_file`). This release meets
//! either with a refusal to start, before it changes anything (`Records::check_format`),
//! naming what wrote it and what to do. Records are never rewritten or removed for it.

use std::io;

use serde::{Deserialize, Serialize};

use super::record::VolumeKind;

/// The newest format this release reads (and the newest it writes).
pub const SUPPORTED_FORMAT: u32 = 4;

/// What this release writes as `written_by`.
pub const WRITER: &str = concat!(
    "stickyvol ",
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("STICKYVOL_REVISION"),
    ")"
);

/// What group snapshots (their records, and their members' records) need.
pub const GROUP_FORMAT: u32 = 4;

/// The format a volume's or a snapshot's record needs: image volumes came with format 2,
/// encrypted volumes with format 3.
pub fn needs_for(kind: VolumeKind, encrypted: bool) -> u32 {
    let by_kind = match kind {
        VolumeKind::Filesystem | VolumeKind::Block => 1,
        VolumeKind::Image(_) => 2,
    };
    if encrypted { 3 } else { by_kind }
}

/// A record as written: its own fields, then its stamp when it needs more than format 1
/// (format 1 records stay exactly as releases before the marker wrote them).
#[derive(Serialize)]
pub struct Stamped<'a, R: Serialize> {
    #[serde(flatten)]
    record: &'a R,
    #[serde(skip_serializing_if = "Option::is_none")]
    needs: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    written_by: Option<&'static str>,
}

pub fn stamped<R: Serialize>(record: &R, needs: u32) -> Stamped<'_, R> {
    let stamp = needs > 1;
    Stamped {
        record,
        needs: stamp.then_some(needs),
        written_by: stamp.then_some(WRITER),
    }
}

/// The stamp as read: nothing else of the record.
#[derive(Deserialize)]
struct Stamp {
    #[serde(default)]
    needs: Option<u64>,
    #[serde(default)]
    written_by: Option<String>,
}

/// A record this release cannot read correctly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooNew {
    pub needs: u64,
    pub written_by: Option<String>,
}

/// Whether this release reads the record `json` correctly: `Some` when it needs a newer
/// format. JSON that is no record is not judged here: loading reports it unreadable.
pub fn judge(json: &[u8]) -> Option<TooNew> {
    let stamp: Stamp = serde_json::from_slice(json).ok()?;
    let needs = stamp.needs.unwrap_or(1);
    (needs > u64::from(SUPPORTED_FORMAT)).then_some(TooNew {
        needs,
        written_by: stamp.written_by,
    })
}

/// The records found too new while checking a state, told as one error.
#[derive(Debug, Default)]
pub struct Refusals {
    first: Option<(String, TooNew)>,
    more: usize,
}

impl Refusals {
    /// Judges the record `json`, found at `place` (a file, or a journal entry).
    pub fn check(&mut self, place: impl FnOnce() -> String, json: &[u8]) {
        let Some(too_new) = judge(json) else {
            return;
        };
        match self.first {
            None => self.first = Some((place(), too_new)),
            Some(_) => self.more += 1,
        }
    }

    /// Ok when every record judged is readable; else the error that stops the start.
    pub fn into_result(self) -> io::Result<()> {
        let Some((place, too_new)) = self.first else {
            return Ok(());
        };
        let writer = match &too_new.written_by {
            Some(writer) => format!("written by {writer}"),
            None => "written by a newer release, which did not say which".to_string(),
        };
        let more = match self.more {
            0 => String::new(),
            n => format!(" (and {n} more records that need a newer format)"),
        };
        let roll_forward = match &too_new.written_by {
            Some(writer) => format!("{writer} or a later release"),
            None => format!("a release that reads format {}", too_new.needs),
        };
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{place} needs state format {needs}, {writer}{more}; this release ({WRITER}) reads formats 1 to {SUPPORTED_FORMAT}. Refusing to start rather than misread the node's volumes; nothing was changed, and the volumes' data is untouched. Roll forward to {roll_forward}",
                needs = too_new.needs,
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fsimage::FsType;

    #[derive(Serialize)]
    struct Thing {
        id: &'static str,
        sizes: Vec<u32>,
    }

    fn thing() -> Thing {
        Thing {
            id: "t-1",
            sizes: vec![1, 2],
        }
    }

    #[test]
    fn a_format_1_record_is_written_exactly_as_before_the_marker() {
        let plain = serde_json::to_vec_pretty(&thing()).unwrap();
        let marked = serde_json::to_vec_pretty(&stamped(&thing(), 1)).unwrap();
        assert_eq!(
            String::from_utf8(marked).unwrap(),
            String::from_utf8(plain).unwrap()
        );
    }

    #[test]
    fn a_record_needing_more_says_so_and_who_wrote_it() {
        let json = serde_json::to_value(stamped(&thing(), 2)).unwrap();
        assert_eq!(json["needs"], 2);
        assert_eq!(json["written_by"], WRITER);
        assert_eq!(json["id"], "t-1", "{json}");
    }

    #[test]
    fn image_volumes_need_format_2_encrypted_ones_3_and_the_others_format_1() {
        assert_eq!(needs_for(VolumeKind::Filesystem, false), 1);
        assert_eq!(needs_for(VolumeKind::Block, false), 1);
        for fs in FsType::ALL {
            assert_eq!(needs_for(VolumeKind::Image(fs), false), 2);
            assert_eq!(needs_for(VolumeKind::Image(fs), true), 3);
        }
        assert_eq!(needs_for(VolumeKind::Block, true), 3);
        assert!(needs_for(VolumeKind::Block, true) <= SUPPORTED_FORMAT);
    }

    #[test]
    fn records_up_to_the_supported_format_are_read_and_newer_ones_refused() {
        assert_eq!(judge(br#"{"id":"a"}"#), None, "no stamp: format 1");
        assert_eq!(judge(br#"{"id":"a","needs":1}"#), None);
        assert_eq!(judge(br#"{"id":"a","needs":2,"written_by":"x"}"#), None);
        assert_eq!(judge(br#"{"id":"a","needs":3,"written_by":"x"}"#), None);
        assert_eq!(judge(br#"{"id":"a","needs":4,"written_by":"x"}"#), None);
        assert_eq!(
            judge(br#"{"id":"a","needs":9,"written_by":"stickyvol 0.3.0 (commit abc)"}"#),
            Some(TooNew {
                needs: 9,
                written_by: Some("stickyvol 0.3.0 (commit abc)".into())
            })
        );
        assert_eq!(
            judge(br#"{"needs":99999999999}"#).map(|t| t.needs),
            Some(99_999_999_999)
        );
        // Not a record (or damaged): the loader's to report, not a format question.
        assert_eq!(judge(b"{not json"), None);
        assert_eq!(judge(br#"[{"target":"/k"}]"#), None);
    }

    #[test]
    fn the_refusal_says_where_what_wrote_it_what_it_needs_what_we_read_and_what_to_do() {
        let mut refusals = Refusals::default();
        refusals.check(|| "never asked".into(), br#"{"id":"a"}"#);
        let record = br#"{"id":"b","needs":9,"written_by":"stickyvol 0.3.0 (commit abc)"}"#;
        refusals.check(|| "/state/sv-b.json".into(), record);
        refusals.check(|| "/state/sv-c.json".into(), br#"{"needs":5}"#);
        let err = refusals.into_result().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let message = err.to_string();
        for part in [
            "/state/sv-b.json needs state format 9",
            "written by stickyvol 0.3.0 (commit abc)",
            "and 1 more record",
            &format!("reads formats 1 to {SUPPORTED_FORMAT}"),
            WRITER,
            "nothing was changed",
            "Roll forward to stickyvol 0.3.0 (commit abc) or a later release",
        ] {
            assert!(message.contains(part), "{part:?} missing from: {message}");
        }
        let mut unsigned = Refusals::default();
        unsigned.check(|| "/state/sv-d.json".into(), br#"{"needs":6}"#);
        let message = unsigned.into_result().unwrap_err().to_string();
        assert!(message.contains("did not say which"), "{message}");
        assert!(
            message.contains("a release that reads format 6"),
            "{message}"
        );
        assert!(Refusals::default().into_result().is_ok());
    }
}
