//! The read-only fence: the consequence of a directory volume's misuse that does not depend on
//! its tenant's cooperation. A volume above its size whose pods a PodDisruptionBudget keeps from
//! eviction (`cluster::node::overflow`, after its grace), or whose project-id audit cannot
//! finish (`audit`), has every mount of its data made read-only: kubelet's targets, and the
//! pods' own mounts in their containers' namespaces (`host::nsmounts`), which a remount of the
//! targets would not reach. Reads go on; writes fail with EROFS, so the pool stops filling. The
//! kernel will not make a mount read-only while files are open for writing through it, and no
//! descriptor can be revoked: a container that holds one has its processes stopped, and
//! kubelet restarts it on the read-only target.
//!
//! The fence is in the record: it survives a restart, and every publication made while it
//! stands is mounted read-only whatever was asked (kubelet's own record keeps what it asked).
//! Each check round fences again, catching containers started since. Lifting it (the check finds
//! the volume within its size, an audit finishes, or an admin's `stickyvol volume unfence`)
//! makes writable again the mounts this process made read-only, and those at the targets of
//! publications that asked to write; a container whose mount a previous run of the driver
//! fenced stays read-only until it restarts.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};

use tracing::{info, warn};

use super::Volumes;
use super::state::id::VolumeId;
use super::state::record::{FenceCause, Fenced, VolumeKind, VolumeRecord, now_ms};
use crate::error::{Error, IoContext, Result};
use crate::host::nsmounts::{self, MountKey};

/// The mounts this process made read-only, per fenced volume (to make writable again).
#[derive(Debug, Default)]
pub struct FencedMounts(Mutex<HashMap<VolumeId, HashSet<MountKey>>>);

impl FencedMounts {
    fn add(&self, id: &VolumeId, keys: &[MountKey]) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.entry(id.clone())
            .or_default()
            .extend(keys.iter().copied());
    }

    fn take(&self, id: &VolumeId) -> HashSet<MountKey> {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.remove(id).unwrap_or_default()
    }
}

/// What fencing (or lifting) did to a volume's mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceOutcome {
    /// Newly fenced by this call (false: it already was, and only new mounts were changed).
    pub new: bool,
    pub mounts_changed: usize,
    /// Mounts found but not changed, each with why.
    pub failed: Vec<String>,
    pub namespaces: usize,
    /// Processes stopped because their container kept files open for writing on the volume.
    pub stopped: usize,
}

impl Volumes {
    /// Fences directory volume `id` read-only for `cause`, saying `why`; a fenced volume has its
    /// mounts made since fenced too. The record is written before any mount changes, so a crash
    /// between leaves it fenced (the next round finishes the job).
    pub fn fence(&self, id: &VolumeId, cause: FenceCause, why: &str) -> Result<FenceOutcome> {
        let _guard = self.claim(id)?;
        let record = self.get(id)?;
        if record.kind != VolumeKind::Filesystem {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is not a directory volume; only those are fenced"
            )));
        }
        let new = record.fenced.is_none();
        if new {
            let fenced = VolumeRecord {
                fenced: Some(Fenced {
                    since_unix_ms: now_ms(),
                    cause,
                    why: why.to_string(),
                }),
                ..(*record).clone()
            };
            self.store
                .put(fenced)
                .context(|| format!("recording the fence of volume {id}"))?;
        }
        let data = self.data_path(&record)?;
        let source =
            nsmounts::source_of(&data).context(|| format!("locating {}", data.display()))?;
        let changed = nsmounts::set_read_only(&source, true, &|_| true);
        self.fenced_mounts.add(id, &changed.changed);
        // A container writing through its mount keeps it writable (EBUSY): it is stopped, and
        // kubelet restarts it on the target, read-only now; the next round checks its mount.
        let stopped = nsmounts::stop_processes_in(&changed.busy);
        let outcome = FenceOutcome {
            new,
            mounts_changed: changed.changed.len(),
            failed: changed.failed,
            namespaces: changed.namespaces,
            stopped,
        };
        if new || outcome.mounts_changed > 0 || outcome.stopped > 0 || !outcome.failed.is_empty() {
            let level_warn = !outcome.failed.is_empty();
            if level_warn {
                warn!(volume = %id, ?cause, made_read_only = outcome.mounts_changed, stopped = outcome.stopped, namespaces = outcome.namespaces, failed = ?outcome.failed, "volume fenced read-only, but some of its mounts could not be changed");
            } else {
                info!(volume = %id, ?cause, made_read_only = outcome.mounts_changed, stopped = outcome.stopped, namespaces = outcome.namespaces, why, "volume fenced read-only");
            }
        }
        Ok(outcome)
    }

    /// Lifts volume `id`'s fence, if it has one (of `cause`, when given): the record first,
    /// then its mounts this process fenced and those of publications that asked to write are
    /// made writable. None when there was no such fence.
    pub fn unfence(
        &self,
        id: &VolumeId,
        cause: Option<FenceCause>,
    ) -> Result<Option<FenceOutcome>> {
        // Asked after every clean audit: an unfenced volume answers without its operation
        // slot, so a publish running meanwhile is not turned away.
        if self.get(id)?.fenced.is_none() {
            return Ok(None);
        }
        let _guard = self.claim(id)?;
        let record = self.get(id)?;
        let Some(fenced) = &record.fenced else {
            return Ok(None);
        };
        if cause.is_some_and(|cause| cause != fenced.cause) {
            return Ok(None);
        }
        let lifted = VolumeRecord {
            fenced: None,
            io_limits: Default::default(),
            on_overflow: None,
            ..(*record).clone()
        };
        self.store
            .put(lifted)
            .context(|| format!("recording that volume {id} is no longer fenced"))?;
        let ours = self.fenced_mounts.take(id);
        let writers: HashSet<_> = record
            .pod_publications()
            .filter(|p| !p.readonly)
            .map(|p| p.target.clone())
            .collect();
        let data = self.data_path(&record)?;
        let source =
            nsmounts::source_of(&data).context(|| format!("locating {}", data.display()))?;
        let changed = nsmounts::set_read_only(&source, false, &|found| {
            ours.contains(&found.key) || writers.contains(&found.mount_point)
        });
        info!(volume = %id, cause = ?fenced.cause, made_writable = changed.changed.len(), failed = ?changed.failed, "volume's read-only fence lifted");
        Ok(Some(FenceOutcome {
            new: true,
            mounts_changed: changed.changed.len(),
            failed: changed.failed,
            namespaces: changed.namespaces,
            stopped: 0,
        }))
    }

    /// The fenced volumes (of `cause`, when given).
    pub fn fenced(&self, cause: Option<FenceCause>) -> Vec<(VolumeId, Fenced)> {
        self.store
            .all()
            .iter()
            .filter_map(|r| Some((r.id.clone(), r.fenced.clone()?)))
            .filter(|(_, f)| cause.is_none_or(|cause| f.cause == cause))
            .collect()
    }
}

/// The abnormal condition of a fenced volume, saying why and how to get out.
pub(super) fn fence_problem(record: &VolumeRecord) -> Option<String> {
    let fenced = record.fenced.as_ref()?;
    Some(format!(
        "volume {} is fenced read-only: {}; {}",
        record.id,
        fenced.why,
        way_out(fenced.cause)
    ))
}

/// How a fence of `cause` is lifted, for messages.
pub fn way_out(cause: FenceCause) -> &'static str {
    match cause {
        FenceCause::Overflow => {
            "it becomes writable when measured within its size (expand the claim), or when an admin runs `stickyvol volume unfence` to let a pod free space before the next check"
        }
        FenceCause::Audit => {
            "it becomes writable when a project-id audit finishes (an admin's `stickyvol volume unfence` lets a pod make its tree shallower before the next audit)"
        }
    }
}
