//! The book of project-id audits (see `volume::audit`): which volumes were found with inodes
//! outside their project, or could not be audited, until a clean audit clears them; and running
//! totals for the metrics. In memory only: a restart audits again.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::host::projtree::Repairs;
use crate::volume::state::id::VolumeId;

/// How one volume's audit ended.
#[derive(Debug)]
pub enum Outcome<'a> {
    /// Every inode was in the volume's project already (`repairs.repaired` is 0) or was put back
    /// into it.
    Walked(&'a Repairs),
    /// The walk stopped before the end (its budget, an error): the tree is not known to be clean.
    Unfinished(String),
}

/// What a volume's last audit left standing, until a clean one.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Finding {
    /// Foreign project ids were found and repaired, or some files could not be checked
    /// (`unchecked`).
    Tampered {
        message: String,
        unchecked: bool,
    },
    Unfinished(String),
}

/// Running totals since the start, for the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditTotals {
    /// Audits by how they ended: nothing foreign found, foreign ids repaired, not finished.
    pub clean: u64,
    pub tampered: u64,
    pub unfinished: u64,
    /// Inodes put back into their volume's project.
    pub repaired_inodes: u64,
    /// Volumes whose last audit found foreign ids or could not check every file (until clean).
    pub tampered_volumes: u64,
    /// Volumes whose last audit did not finish.
    pub unfinished_volumes: u64,
}

#[derive(Debug, Default)]
pub struct AuditBook {
    state: Mutex<BookState>,
}

#[derive(Debug, Default)]
struct BookState {
    findings: HashMap<VolumeId, Finding>,
    totals: AuditTotals,
}

impl AuditBook {
    /// Books the audit of volume `id`; `message` says what a tampered volume's report says.
    pub fn record(&self, id: &VolumeId, outcome: &Outcome<'_>, message: impl FnOnce() -> String) {
        let mut state = self.lock();
        match outcome {
            Outcome::Walked(repairs) if repairs.repaired == 0 && repairs.unchecked == 0 => {
                state.totals.clean += 1;
                state.findings.remove(id);
            }
            Outcome::Walked(repairs) => {
                state.totals.tampered += 1;
                state.totals.repaired_inodes += repairs.repaired;
                let finding = Finding::Tampered {
                    message: message(),
                    unchecked: repairs.unchecked > 0,
                };
                state.findings.insert(id.clone(), finding);
            }
            Outcome::Unfinished(why) => {
                state.totals.unfinished += 1;
                state
                    .findings
                    .insert(id.clone(), Finding::Unfinished(why.clone()));
            }
        }
    }

    /// Why volume `id` is abnormal after its last audit, if it is.
    pub fn problem(&self, id: &VolumeId) -> Option<String> {
        self.lock().findings.get(id).map(|finding| match finding {
            Finding::Tampered { message, .. } | Finding::Unfinished(message) => message.clone(),
        })
    }

    /// Whether volume `id`'s last audit left files it could not check.
    pub fn left_unchecked(&self, id: &VolumeId) -> bool {
        matches!(
            self.lock().findings.get(id),
            Some(Finding::Tampered {
                unchecked: true,
                ..
            })
        )
    }

    /// Forgets the volumes `keep` says no longer exist.
    pub fn retain(&self, keep: impl Fn(&VolumeId) -> bool) {
        self.lock().findings.retain(|id, _| keep(id));
    }

    pub fn totals(&self) -> AuditTotals {
        let state = self.lock();
        let count = |tampered: bool| {
            state
                .findings
                .values()
                .filter(|f| matches!(f, Finding::Tampered { .. }) == tampered)
                .count() as u64
        };
        AuditTotals {
            tampered_volumes: count(true),
            unfinished_volumes: count(false),
            ..state.totals
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BookState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> VolumeId {
        VolumeId::generate(&crate::volume::state::id::NodeTag::of("node-a"))
    }

    #[test]
    fn a_volume_stays_reported_until_a_clean_audit() {
        let book = AuditBook::default();
        let (a, b) = (id(), id());
        let repaired = Repairs {
            inodes: 10,
            repaired: 3,
            ..Repairs::default()
        };
        let clean = Repairs {
            inodes: 10,
            ..Repairs::default()
        };
        book.record(&a, &Outcome::Walked(&repaired), || "moved".into());
        book.record(&b, &Outcome::Walked(&clean), || unreachable!());
        assert_eq!(book.problem(&a).as_deref(), Some("moved"));
        assert_eq!(book.problem(&b), None);
        book.record(&b, &Outcome::Unfinished("budget".into()), || unreachable!());
        assert_eq!(book.problem(&b).as_deref(), Some("budget"));
        let totals = book.totals();
        assert_eq!(
            (totals.clean, totals.tampered, totals.unfinished),
            (1, 1, 1)
        );
        assert_eq!(totals.repaired_inodes, 3);
        assert_eq!((totals.tampered_volumes, totals.unfinished_volumes), (1, 1));

        // Files a lease kept from being checked: not clean either.
        let leased = Repairs {
            unchecked: 1,
            ..clean.clone()
        };
        book.record(&a, &Outcome::Walked(&leased), || "unchecked".into());
        assert_eq!(book.problem(&a).as_deref(), Some("unchecked"));
        book.record(&a, &Outcome::Walked(&clean), || unreachable!());
        assert_eq!(book.problem(&a), None);
        assert_eq!(book.totals().tampered_volumes, 0);
        assert_eq!(book.totals().repaired_inodes, 3, "a running total");

        book.retain(|v| v != &b);
        assert_eq!(book.problem(&b), None);
        assert_eq!(book.totals().unfinished_volumes, 0);
    }
}
