//! Copies running now that no record shows: volumes filled from a snapshot (restore) or from
//! another volume (clone) inside CreateVolume, and export and import streams. Counted for the
//! metrics, so an operator can see why a node's disk is busy. (Snapshot copies have records of
//! their own: `snapshot_census`.)

use std::sync::atomic::{AtomicUsize, Ordering};

/// What a running copy makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// A new volume from a snapshot.
    Restore,
    /// A new volume from another volume.
    Clone,
    /// `stickyvol volume export`.
    Export,
    /// `stickyvol volume import`.
    Import,
}

impl CopyKind {
    pub const ALL: [CopyKind; 4] = [
        CopyKind::Restore,
        CopyKind::Clone,
        CopyKind::Export,
        CopyKind::Import,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CopyKind::Restore => "restore",
            CopyKind::Clone => "clone",
            CopyKind::Export => "export",
            CopyKind::Import => "import",
        }
    }
}

/// How many copies of each kind run.
#[derive(Debug, Default)]
pub struct CopiesInFlight {
    running: [AtomicUsize; CopyKind::ALL.len()],
}

/// One running copy, counted until dropped (also when the copy fails or panics).
#[derive(Debug)]
pub struct Running<'a> {
    copies: &'a CopiesInFlight,
    kind: CopyKind,
}

impl CopiesInFlight {
    pub fn start(&self, kind: CopyKind) -> Running<'_> {
        self.running[kind as usize].fetch_add(1, Ordering::Relaxed);
        Running { copies: self, kind }
    }

    pub fn running(&self, kind: CopyKind) -> usize {
        self.running[kind as usize].load(Ordering::Relaxed)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.copies.running[self.kind as usize].fetch_sub(1, Ordering::Relaxed);
    }
}

/// The node's copies in flight: one process serves one node, and an export's stream outlives
/// the call that opened it.
pub fn copies_in_flight() -> &'static CopiesInFlight {
    static COPIES: CopiesInFlight = CopiesInFlight {
        running: [const { AtomicUsize::new(0) }; CopyKind::ALL.len()],
    };
    &COPIES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_counts_while_it_runs_and_each_kind_apart() {
        let copies = CopiesInFlight::default();
        let restore = copies.start(CopyKind::Restore);
        let clones = [copies.start(CopyKind::Clone), copies.start(CopyKind::Clone)];
        assert_eq!(copies.running(CopyKind::Restore), 1);
        assert_eq!(copies.running(CopyKind::Clone), 2);
        assert_eq!(copies.running(CopyKind::Export), 0);
        drop(restore);
        assert_eq!(copies.running(CopyKind::Restore), 0);
        drop(clones);
        assert_eq!(copies.running(CopyKind::Clone), 0);
    }

    #[test]
    fn a_copy_that_panics_stops_counting() {
        let copies = CopiesInFlight::default();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _running = copies.start(CopyKind::Import);
            panic!("a copy failing midway");
        }));
        assert!(panicked.is_err());
        assert_eq!(copies.running(CopyKind::Import), 0);
    }

    #[test]
    fn every_kind_has_its_own_name_and_slot() {
        for (index, kind) in CopyKind::ALL.into_iter().enumerate() {
            assert_eq!(kind as usize, index);
        }
        let names: std::collections::HashSet<_> = CopyKind::ALL.map(CopyKind::as_str).into();
        assert_eq!(names.len(), CopyKind::ALL.len());
    }
}
