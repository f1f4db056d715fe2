//! Whether the controller released PVs of this node while its driver ran: the node's release
//! notice (`kit::release_notice`), watched by name. A new version of it has every volume's PV
//! read again, round after round, for a window (`confirm`) before the node takes that version
//! back: the controller writes the notice *before* each delete (so a crash cannot lose it), and
//! a read made between the two still sees the PV; the window outlasts that gap.

use std::time::{Duration, Instant};

/// A notice version seen, and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Standing {
    version: String,
    since: Instant,
}

/// The notice as the node's orphan check follows it.
#[derive(Debug, Default)]
pub struct Notices {
    standing: Option<Standing>,
}

impl Notices {
    /// Version `version` of the notice was seen; true when it is new to the check.
    pub fn seen(&mut self, version: String, now: Instant) -> bool {
        if self.standing.as_ref().is_some_and(|s| s.version == version) {
            return false;
        }
        self.standing = Some(Standing {
            version,
            since: now,
        });
        true
    }

    /// Whether the next round reads every PV again: a notice stands, younger than `window`.
    pub fn recheck(&self, now: Instant, window: Duration) -> bool {
        (self.standing.as_ref()).is_some_and(|s| now.saturating_duration_since(s.since) < window)
    }

    /// The version to take back after this round: one that has stood `window`.
    pub fn due(&self, now: Instant, window: Duration) -> Option<String> {
        (self.standing.as_ref())
            .filter(|s| now.saturating_duration_since(s.since) >= window)
            .map(|s| s.version.clone())
    }

    /// Version `version` was taken back (or written again since: the watch brings that one).
    pub fn taken_back(&mut self, version: &str) {
        if self.standing.as_ref().is_some_and(|s| s.version == version) {
            self.standing = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_has_pvs_read_again_for_its_window_then_is_taken_back() {
        let window = Duration::from_secs(120);
        let t = Instant::now();
        let at = |secs| t + Duration::from_secs(secs);
        let mut notices = Notices::default();
        assert!(!notices.recheck(t, window), "no notice, nothing to read");
        assert_eq!(notices.due(t, window), None);

        assert!(notices.seen("7".into(), t));
        assert!(!notices.seen("7".into(), at(5)), "the same version again");
        assert!(notices.recheck(at(60), window));
        assert_eq!(notices.due(at(60), window), None, "not before its window");
        assert!(!notices.recheck(at(120), window));
        assert_eq!(notices.due(at(120), window).as_deref(), Some("7"));

        // Written again before it was taken back: a new window.
        assert!(notices.seen("9".into(), at(121)));
        notices.taken_back("7");
        assert!(
            notices.recheck(at(122), window),
            "the new version still stands"
        );
        assert_eq!(notices.due(at(241), window).as_deref(), Some("9"));
        notices.taken_back("9");
        assert!(!notices.recheck(at(242), window));
        assert_eq!(notices.due(at(500), window), None);
    }
}
