//! The overflow check's last step, the one no PodDisruptionBudget can refuse: a volume the
//! check evicts for that still has pods on it `fence_after` after the check first found it
//! above its size (the eviction refused, failing, or impossible without pod names) is fenced
//! read-only (`volume::fence`), in the pods' containers too, with a Warning Event on its claim
//! saying why and how to get out. Every later round fences it again (a restarted container is
//! caught), and a full round that measures it within its size (its claim expanded, or space
//! freed during an admin's unfence) lifts the fence, with a Normal Event.

use std::collections::HashSet;
use std::sync::Arc;

use tracing::warn;

use super::{Settings, Tracker, api, why_overflowing};
use crate::class::OnOverflow;
use crate::cluster::kit::events::{Kind, Recorder};
use crate::volume::Volumes;
use crate::volume::fence::{FenceOutcome, way_out};
use crate::volume::overflow::{Overflowing, claim_of};
use crate::volume::state::id::VolumeId;
use crate::volume::state::record::FenceCause;

/// Fences the volumes of `found` whose grace is over, and again those fenced already.
pub(super) async fn fence_overdue(
    volumes: &Arc<Volumes>,
    recorder: &Recorder,
    settings: &Settings,
    tracker: &mut Tracker,
    found: &[Overflowing],
) {
    let already: HashSet<VolumeId> = volumes
        .fenced(Some(FenceCause::Overflow))
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    for volume in found {
        let Some(seen) = tracker.volumes.get_mut(&volume.id) else {
            continue;
        };
        if seen.fenced && !already.contains(&volume.id) {
            // An admin lifted it: a fresh grace from now.
            seen.fenced = false;
            seen.since = std::time::Instant::now();
            continue;
        }
        let due =
            volume.on_overflow == OnOverflow::Evict && seen.since.elapsed() >= settings.fence_after;
        if !due && !already.contains(&volume.id) {
            continue;
        }
        let why = format!(
            "it {} and was still in use {} s after the overflow check first found it so",
            why_overflowing(volume),
            settings.fence_after.as_secs()
        );
        let Some(outcome) = fence(volumes, &volume.id, why.clone()).await else {
            continue;
        };
        if seen.fenced {
            continue;
        }
        seen.fenced = true;
        if let Some(claim) = &volume.claim {
            let note = fenced_message(volume, &why, &outcome);
            let uid = seen.claim_uid.as_deref();
            api::record_event(recorder, claim, uid, "OverflowFenced", "Fence", note).await;
        }
    }
}

/// Fences one volume off the async threads; None (logged) when it could not be done now.
async fn fence(volumes: &Arc<Volumes>, id: &VolumeId, why: String) -> Option<FenceOutcome> {
    let (volumes, target) = (volumes.clone(), id.clone());
    match tokio::task::spawn_blocking(move || volumes.fence(&target, FenceCause::Overflow, &why))
        .await
    {
        Ok(Ok(outcome)) => Some(outcome),
        // Busy with another operation, or deleted meanwhile: the next round tries again.
        Ok(Err(err)) => {
            warn!(volume = %id, error = %err, "overflow check: could not fence the volume now; trying again next round");
            None
        }
        Err(err) => {
            warn!(volume = %id, error = %err, "overflow check: fencing the volume failed");
            None
        }
    }
}

fn fenced_message(volume: &Overflowing, why: &str, outcome: &FenceOutcome) -> String {
    let failed = match outcome.failed.len() {
        0 => String::new(),
        n => format!(" ({n} could not be changed: {})", outcome.failed.join("; ")),
    };
    let stopped = match outcome.stopped {
        0 => String::new(),
        n => format!(
            "; {n} processes of containers that kept files open for writing on it were stopped (kubelet restarts them with the volume read-only)"
        ),
    };
    format!(
        "volume {} (PV {}) is fenced read-only: {why}. {} of its mounts, in the pods' containers too, are now read-only{failed}{stopped}: reads go on, writes fail. {}",
        volume.id,
        volume.pv_name,
        outcome.mounts_changed,
        way_out(FenceCause::Overflow)
    )
}

/// Lifts the fences of volumes a full round measured within their size (`found` holds those
/// above it).
pub(super) async fn lift(
    volumes: &Arc<Volumes>,
    recorder: &Recorder,
    reuse: std::time::Duration,
    found: &[Overflowing],
) {
    let overflowing: HashSet<&VolumeId> = found.iter().map(|v| &v.id).collect();
    let measuring = volumes.clone();
    let candidates = tokio::task::spawn_blocking(move || measuring.overflow_fences_to_lift(reuse))
        .await
        .unwrap_or_default();
    for id in candidates
        .into_iter()
        .filter(|id| !overflowing.contains(id))
    {
        let lifting = volumes.clone();
        let target = id.clone();
        let lifted = tokio::task::spawn_blocking(move || {
            let claim = lifting.get(&target).ok().and_then(|r| claim_of(&r));
            (lifting.unfence(&target, Some(FenceCause::Overflow)), claim)
        })
        .await;
        match lifted {
            Ok((Ok(Some(outcome)), Some(claim))) => {
                let note = format!(
                    "volume {id} is within its size again: its read-only fence is lifted ({} mounts writable again; a container fenced by an earlier run of the driver stays read-only until it restarts)",
                    outcome.mounts_changed
                );
                let said = ("OverflowFenceLifted", "Unfence");
                api::record(recorder, &claim, None, Kind::Normal, said, note).await;
            }
            Ok((Ok(_), _)) => {}
            Ok((Err(err), _)) => {
                warn!(volume = %id, error = %err, "overflow check: could not lift the volume's fence now; trying again next round")
            }
            Err(err) => {
                warn!(volume = %id, error = %err, "overflow check: lifting the fence failed")
            }
        }
    }
}
