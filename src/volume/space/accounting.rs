//! Thick accounting of a pool's space: what volumes were promised but have not written yet.
//!
//! Free space alone overpromises: a 100 GiB volume that holds 1 GiB leaves 99 GiB "free" that
//! its pod may claim at any moment. So a pool offers `free − outstanding / overcommit`, where
//! `outstanding` sums, over its volumes, the part of each volume's size not yet used.
//!
//! Usage changes behind our back, and we learn it only when we measure. While pods write, a
//! stale `used` is too small, which makes `outstanding` too large: the safe side (we refuse or
//! report less). When usage shrinks (files deleted inside a volume, a thin file trimmed), a
//! stale `used` is too large, and the pool may promise up to what was freed more than it has,
//! until the next measurement: GetCapacity measures every time, a create measures when the
//! last measurement is older than a minute or when it would be refused.

use std::collections::HashMap;

use crate::volume::state::id::{SnapshotId, VolumeId};

/// What a promise is made to: a volume (its size), or a snapshot (its data, which it comes to
/// hold alone as its source is overwritten or deleted).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Holder {
    Volume(VolumeId),
    Snapshot(SnapshotId),
}

impl From<&VolumeId> for Holder {
    fn from(id: &VolumeId) -> Holder {
        Holder::Volume(id.clone())
    }
}

impl From<&SnapshotId> for Holder {
    fn from(id: &SnapshotId) -> Holder {
        Holder::Snapshot(id.clone())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Promise {
    reserved: u64,
    used: u64,
}

impl Promise {
    fn outstanding(self) -> u64 {
        self.reserved.saturating_sub(self.used)
    }
}

/// The promises of one pool. O(1) per change: the sum is kept, not recomputed.
#[derive(Debug, Default)]
pub struct Ledger {
    promises: HashMap<Holder, Promise>,
    outstanding: u64,
}

impl Ledger {
    /// Bytes a new volume can be promised when the filesystem has `free` bytes free.
    pub fn available(&self, free: u64, overcommit: f64) -> u64 {
        free.saturating_sub(backed_part(self.outstanding, overcommit))
    }

    /// Sum of what every volume may still write.
    pub fn outstanding(&self) -> u64 {
        self.outstanding
    }

    /// What `id` used when last measured.
    pub fn used_of(&self, id: &Holder) -> Option<u64> {
        self.promises.get(id).map(|promise| promise.used)
    }

    /// What snapshots use on their own, as last measured.
    pub fn snapshot_usage(&self) -> u64 {
        self.promises
            .iter()
            .filter(|(holder, _)| matches!(holder, Holder::Snapshot(_)))
            .map(|(_, promise)| promise.used)
            .sum()
    }

    /// Promises `bytes` to `id` if `free` space can back them; otherwise returns what is
    /// available. A volume already in the ledger has its promise replaced (a retried create).
    pub fn reserve(
        &mut self,
        id: &Holder,
        bytes: u64,
        free: u64,
        overcommit: f64,
    ) -> Result<(), u64> {
        let previous = self.promises.get(id).copied();
        let others = self.outstanding - previous.map_or(0, Promise::outstanding);
        let available = free.saturating_sub(backed_part(others, overcommit));
        let used = previous.map_or(0, |p| p.used);
        if bytes.saturating_sub(used) > available {
            return Err(available);
        }
        self.set(
            id,
            Promise {
                reserved: bytes,
                used,
            },
        );
        Ok(())
    }

    /// Records a volume without checking space (loading existing volumes at start).
    pub fn insert(&mut self, id: &Holder, reserved: u64, used: u64) {
        self.set(id, Promise { reserved, used });
    }

    /// Sets a volume's promise without checking space.
    pub fn set_reserved(&mut self, id: &Holder, reserved: u64) {
        if let Some(promise) = self.promises.get(id).copied() {
            self.set(
                id,
                Promise {
                    reserved,
                    ..promise
                },
            );
        }
    }

    /// What a measurement found the volume uses.
    pub fn set_used(&mut self, id: &Holder, used: u64) {
        if let Some(promise) = self.promises.get(id).copied() {
            self.set(id, Promise { used, ..promise });
        }
    }

    /// The volume is gone (deleted, or its create failed).
    pub fn release(&mut self, id: &Holder) {
        if let Some(promise) = self.promises.remove(id) {
            self.outstanding -= promise.outstanding();
        }
    }

    fn set(&mut self, id: &Holder, promise: Promise) {
        let before = self
            .promises
            .insert(id.clone(), promise)
            .map_or(0, Promise::outstanding);
        self.outstanding = self.outstanding - before + promise.outstanding();
    }
}

/// The part of `outstanding` that free space must back at `overcommit` (rounded up).
fn backed_part(outstanding: u64, overcommit: f64) -> u64 {
    if overcommit <= 1.0 {
        outstanding
    } else {
        (outstanding as f64 / overcommit).ceil() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id() -> Holder {
        Holder::Volume(VolumeId::generate(&crate::volume::state::id::NodeTag::of(
            "test",
        )))
    }

    #[test]
    fn unused_promises_are_taken_from_free_space() {
        let mut ledger = Ledger::default();
        let (a, b) = (id(), id());
        ledger.reserve(&a, 40, 100, 1.0).unwrap();
        assert_eq!(ledger.available(100, 1.0), 60);
        // 100 free still, but 40 promised: 70 does not fit, 60 does.
        assert_eq!(ledger.reserve(&b, 70, 100, 1.0), Err(60));
        ledger.reserve(&b, 60, 100, 1.0).unwrap();
        assert_eq!(ledger.available(100, 1.0), 0);
        // a writes 30: free falls by 30, and so does what a may still write.
        ledger.set_used(&a, 30);
        assert_eq!(ledger.available(70, 1.0), 0);
        ledger.release(&b);
        assert_eq!(ledger.available(70, 1.0), 60);
        ledger.release(&a);
        assert_eq!(ledger.outstanding(), 0);
    }

    #[test]
    fn overcommit_backs_only_part_of_the_promises() {
        let mut ledger = Ledger::default();
        ledger.reserve(&id(), 100, 100, 2.0).unwrap();
        assert_eq!(ledger.available(100, 2.0), 50);
        assert_eq!(ledger.available(100, 1.0), 0);
    }

    #[test]
    fn a_retried_reservation_replaces_the_first() {
        let mut ledger = Ledger::default();
        let a = id();
        ledger.reserve(&a, 80, 100, 1.0).unwrap();
        ledger.reserve(&a, 90, 100, 1.0).unwrap();
        assert_eq!(ledger.outstanding(), 90);
        // Growth is checked against what the others leave.
        assert_eq!(ledger.reserve(&a, 101, 100, 1.0), Err(100));
        assert_eq!(ledger.outstanding(), 90);
    }

    #[test]
    fn usage_beyond_the_promise_owes_nothing() {
        let mut ledger = Ledger::default();
        let a = id();
        ledger.insert(&a, 10, 25);
        assert_eq!(ledger.outstanding(), 0);
        ledger.set_used(&id(), 5); // unknown volume: ignored
        assert_eq!(ledger.outstanding(), 0);
    }

    proptest! {
        #[test]
        fn the_kept_sum_matches_a_recount(ops in prop::collection::vec((0usize..4, 0u8..4, 0u64..1000, 0u64..1000), 1..60)) {
            let ids: Vec<Holder> = (0..4).map(|_| id()).collect();
            let mut ledger = Ledger::default();
            for (which, op, x, y) in ops {
                let v = &ids[which];
                match op {
                    0 => { let _ = ledger.reserve(v, x, y * 10, 1.0); }
                    1 => ledger.insert(v, x, y),
                    2 => ledger.set_used(v, y),
                    3 if x % 2 == 0 => ledger.set_reserved(v, x),
                    _ => ledger.release(v),
                }
                let recount: u64 = ledger.promises.values().map(|p| p.outstanding()).sum();
                prop_assert_eq!(ledger.outstanding(), recount);
            }
        }
    }
}
