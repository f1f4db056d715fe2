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

use std::collections::HashSet;
use std::time::Duration;

use tracing::debug;

use super::Volumes;
use super::inventory::{PARAM_PVC_NAME, PARAM_PVC_NAMESPACE};
use super::state::id::VolumeId;
use super::state::record::{PodRef, VolumeKind, VolumeRecord};
use crate::class::{OnOverflow, PARAM_ON_OVERFLOW};

/// A claim, as the provisioner named it in CreateVolume's parameters (`--extra-create-metadata`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
}

/// A published volume measured above its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overflowing {
    pub id: VolumeId,
    /// The record's name: the PV's under Kubernetes.
    pub pv_name: String,
    /// None when the parameters do not name a valid one.
    pub claim: Option<ClaimRef>,
    pub on_overflow: OnOverflow,
    pub used_bytes: u64,
    pub capacity_bytes: u64,
    /// The pods it is published for, as kubelet named them (none without `podInfoOnMount`).
    pub pods: Vec<PodRef>,
}

/// The claim a record's parameters name, if both parts are valid object names.
fn claim_of(record: &VolumeRecord) -> Option<ClaimRef> {
    let namespace = record.parameters.get(PARAM_PVC_NAMESPACE)?;
    let name = record.parameters.get(PARAM_PVC_NAME)?;
    let valid = crate::config::is_object_name(namespace) && crate::config::is_object_name(name);
    valid.then(|| ClaimRef {
        namespace: namespace.clone(),
        name: name.clone(),
    })
}

/// The policy a record was created with. CreateVolume refused bad values; one that is bad
/// anyway (a record edited by hand) evicts nothing.
fn on_overflow_of(record: &VolumeRecord) -> OnOverflow {
    OnOverflow::parse(record.parameters.get(PARAM_ON_OVERFLOW).map(String::as_str))
        .unwrap_or(OnOverflow::Report)
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

    /// The volumes NodeGetVolumeStats found above their size since the last call.
    pub fn take_noticed_overflows(&self) -> HashSet<VolumeId> {
        self.overflow_noticed.take()
    }

    /// Published volumes without an enforced size that use more than their size (all of them,
    /// or those in `only`), each measured by a walk no older than `cadence` (reused) or walked
    /// now, through the stats' cache and slots. Blocking: run it off the async threads.
    pub fn overflowing(
        &self,
        cadence: Duration,
        only: Option<&HashSet<VolumeId>>,
    ) -> Vec<Overflowing> {
        let mut found = Vec::new();
        for record in self.store.all() {
            if !watched(&record) || only.is_some_and(|ids| !ids.contains(&record.id)) {
                continue;
            }
            let Ok(pool) = self.pool_of(&record) else {
                continue;
            };
            let id = &record.id;
            let used = match self.usage_cache.measured_within(id, cadence) {
                Some(usage) => usage.bytes,
                None => match self.walked_usage(pool, id, &pool.data_path(id, record.kind)) {
                    Ok(usage) => usage.bytes,
                    Err(err) => {
                        // Stats report the same failure as the volume's condition.
                        debug!(volume = %id, error = %err, "overflow check: usage not measured");
                        continue;
                    }
                },
            };
            pool.set_used(id, used);
            let capacity = record.capacity_bytes as u64;
            if used <= capacity {
                continue;
            }
            found.push(Overflowing {
                id: id.clone(),
                pv_name: record.name.clone(),
                claim: claim_of(&record),
                on_overflow: on_overflow_of(&record),
                used_bytes: used,
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
