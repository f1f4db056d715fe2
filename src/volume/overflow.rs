//! Directory volumes whose size nothing enforces (a pool that cannot limit them: plain ext4
//! without project quota, btrfs without quota) behave like an emptyDir with a sizeLimit: once
//! one is measured above its size, the pods using it are evicted (`onOverflow: evict`, the
//! default) or it is only reported (`report`). This is the domain half: which volumes overflow
//! and whose pods they hold. `crate::cluster::node::overflow` evicts and reports through the Kubernetes API.
//!
//! What it costs: nothing beyond what stats already cost. NodeGetVolumeStats walks such a
//! volume (kubelet asks every minute, its volumeStatsAggPeriod) and notes one found above its
//! size (`notice`), so the check acts on that very measurement. The check's own round reuses a
//! walk that finished within 1.5 intervals (`UsageCache::measured_within`; kubelet's minute is
//! not exact) and walks only a volume nobody measured for that long, through the same usage cache and walk slots as
//! stats: at most one walk per volume per interval, none while kubelet's stats are as frequent.
//! Unpublished volumes are never walked here: no pod uses them. A volume whose size is enforced
//! (its record's `SizeLimit`) is never looked at, so a pool that enforces sizes never evicts.
//!
//! A volume no walk can measure because of what its tenant made of it (directories deeper than
//! walks enter, a tree past a walk's budget of entries or time) counts as above its size:
//! otherwise a tenant would hide from the check by making its tree unmeasurable, and fill the
//! pool. A walk that fails for the host's reasons (data gone, an io error) is skipped:
//! stats report those as the volume's condition.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tracing::debug;

use super::Volumes;
use super::inventory::{PARAM_PVC_NAME, PARAM_PVC_NAMESPACE};
use super::space::pool::Pool;
use super::state::id::VolumeId;
use super::state::record::{FenceCause, PodRef, VolumeKind, VolumeRecord};
use crate::class::{OnOverflow, PARAM_ON_OVERFLOW};
use crate::host::nsmounts;

/// A claim, as the provisioner named it in CreateVolume's parameters (`--extra-create-metadata`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
}

/// A published volume measured above its size, or that cannot be measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overflowing {
    pub id: VolumeId,
    /// The record's name: the PV's under Kubernetes.
    pub pv_name: String,
    /// None when the parameters do not name a valid one.
    pub claim: Option<ClaimRef>,
    pub on_overflow: OnOverflow,
    /// What it was measured to use; when `unmeasured`, the last figure known (0: none), which
    /// says nothing of now but is all there is, and is what the pool's accounting holds.
    pub used_bytes: u64,
    /// Of `used_bytes`, what files no name reaches any more hold, kept open through its mounts.
    pub held_unlinked_bytes: u64,
    /// Why its tree cannot be measured (its owner made it so): it counts as above its size.
    pub unmeasured: Option<String>,
    pub capacity_bytes: u64,
    /// The pods it is published for, as kubelet named them (none without `podInfoOnMount`).
    pub pods: Vec<PodRef>,
}

/// The claim a record's parameters name, if both parts are valid object names.
pub fn claim_of(record: &VolumeRecord) -> Option<ClaimRef> {
    let namespace = record.parameters.get(PARAM_PVC_NAMESPACE)?;
    let name = record.parameters.get(PARAM_PVC_NAME)?;
    let valid = crate::config::is_object_name(namespace) && crate::config::is_object_name(name);
    valid.then(|| ClaimRef {
        namespace: namespace.clone(),
        name: name.clone(),
    })
}

/// The policy of a record: its VolumeAttributesClass's, else its StorageClass's. CreateVolume
/// refused bad values; one that is bad anyway (a record edited by hand) evicts nothing.
fn on_overflow_of(record: &VolumeRecord) -> OnOverflow {
    record.on_overflow.unwrap_or_else(|| {
        OnOverflow::parse(record.parameters.get(PARAM_ON_OVERFLOW).map(String::as_str))
            .unwrap_or(OnOverflow::Report)
    })
}

/// Whether the check looks at `record` at all: a published directory without an enforced size.
fn watched(record: &VolumeRecord) -> bool {
    record.kind == VolumeKind::Filesystem
        && !record.size_limit.is_enforced()
        && record.orphaned.is_none()
        && !record.publications.is_empty()
}

impl Volumes {
    /// Called by NodeGetVolumeStats when its walk found `record` above its size.
    pub(super) fn notice_overflow(&self, record: &VolumeRecord, used: u64) {
        if watched(record) && used > record.capacity_bytes as u64 {
            self.overflow_noticed.add(&record.id);
        }
    }

    /// Called by NodeGetVolumeStats when its walk could not measure `record` for a reason of
    /// its tree's making: such a volume counts as above its size.
    pub(super) fn notice_unmeasured(&self, record: &VolumeRecord) {
        if watched(record) {
            self.overflow_noticed.add(&record.id);
        }
    }

    /// What the check knows of `record`'s usage: (bytes, None) measured by a walk no older than
    /// `cadence` or now; (last bytes known, Some(why)) when its tree's owner keeps walks from
    /// measuring it; None when it was not measured for another reason (skipped).
    fn usage_for_check(
        &self,
        pool: &Pool,
        record: &VolumeRecord,
        cadence: Duration,
    ) -> Option<(u64, Option<String>)> {
        let id = &record.id;
        let last_known = || pool.used_of(id).unwrap_or(0);
        if let Some(usage) = self.usage_cache.measured_within(id, cadence) {
            return Some((usage.bytes, None));
        }
        // Stats found it unmeasurable moments ago: that walk is not worth repeating.
        if let Some(why) = self.usage_cache.unmeasurable_within(id, cadence) {
            return Some((last_known(), Some(why)));
        }
        match self.walked_usage(pool, id, &pool.data_path(id, record.kind)) {
            Ok(usage) => Some((usage.bytes, None)),
            Err(err) => match err.tree_made() {
                Some(why) => Some((last_known(), Some(why))),
                None => {
                    // Stats report the same failure as the volume's condition.
                    debug!(volume = %id, error = %err, "overflow check: usage not measured");
                    None
                }
            },
        }
    }

    /// The volumes fenced for overflow that are published and now measured within their size
    /// (a walk no older than `cadence`, or one now): their fence can be lifted. An unpublished
    /// one stays fenced: no pod writes to it, and the next one mounts it read-only until then.
    pub fn overflow_fences_to_lift(&self, cadence: Duration) -> Vec<VolumeId> {
        self.fenced(Some(FenceCause::Overflow))
            .into_iter()
            .filter_map(|(id, _)| {
                let record = self.get(&id).ok()?;
                let pool = self.pool_of(&record).ok()?;
                let (used, unmeasured) = match watched(&record) {
                    true => self.usage_for_check(pool, &record, cadence)?,
                    false => return None,
                };
                (unmeasured.is_none() && used <= record.capacity_bytes as u64).then_some(id)
            })
            .collect()
    }

    /// Per record, the bytes of unlinked files kept open through its mounts (one look at the
    /// host's processes for all of them; see `host::nsmounts::held_by_unlinked`).
    fn held_by_unlinked(&self, records: &[Arc<VolumeRecord>]) -> Vec<u64> {
        let sources: Vec<Option<nsmounts::Source>> = records
            .iter()
            .map(|r| {
                let data = self.data_path(r).ok()?;
                nsmounts::source_of(&data).ok()
            })
            .collect();
        let known: Vec<nsmounts::Source> = sources.iter().flatten().cloned().collect();
        let mut held = nsmounts::held_by_unlinked(&known).into_iter();
        sources
            .iter()
            .map(|s| s.as_ref().and_then(|_| held.next()).unwrap_or(0))
            .collect()
    }

    /// The volumes NodeGetVolumeStats found above their size since the last call.
    pub fn take_noticed_overflows(&self) -> HashSet<VolumeId> {
        self.overflow_noticed.take()
    }

    /// Published volumes without an enforced size that use more than their size, or that their
    /// tree's owner keeps walks from measuring (all of them, or those in `only`), each measured
    /// by a walk no older than `cadence` (reused) or walked now, through the stats' cache and
    /// slots. Blocking: run it off the async threads.
    pub fn overflowing(
        &self,
        cadence: Duration,
        only: Option<&HashSet<VolumeId>>,
    ) -> Vec<Overflowing> {
        let records: Vec<_> = self
            .store
            .all()
            .into_iter()
            .filter(|r| watched(r) && only.is_none_or(|ids| ids.contains(&r.id)))
            .collect();
        let held = self.held_by_unlinked(&records);
        let mut found = Vec::new();
        for (record, held) in records.iter().zip(held) {
            let Ok(pool) = self.pool_of(record) else {
                continue;
            };
            let id = &record.id;
            let Some((walked, unmeasured)) = self.usage_for_check(pool, record, cadence) else {
                continue;
            };
            let used = walked.saturating_add(held);
            let capacity = record.capacity_bytes as u64;
            if unmeasured.is_none() {
                pool.set_used(id, used);
                if used <= capacity {
                    continue;
                }
            }
            found.push(Overflowing {
                id: id.clone(),
                pv_name: record.name.clone(),
                claim: claim_of(record),
                on_overflow: on_overflow_of(record),
                used_bytes: used,
                held_unlinked_bytes: held,
                unmeasured,
                capacity_bytes: capacity,
                pods: record
                    .publications
                    .iter()
                    .filter_map(|p| p.pod.clone())
                    .collect(),
            });
        }
        found
    }
}
