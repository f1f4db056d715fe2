//! The overflow check (node driver, `--overflow-check-interval`): a directory volume whose size
//! nothing enforces and that is measured above it gets its pods evicted (`onOverflow: evict`, as
//! kubelet evicts a pod whose emptyDir passes its sizeLimit) or is only reported (`report`), with
//! a Warning Event on its claim and metrics either way. Which volumes overflow, and what
//! measuring them costs, is `volume::overflow`'s; this is the loop that acts (`api` makes the
//! calls, `fence` makes the mounts of a volume still overflowing after its grace read-only).
//!
//! A node plugin evicts nothing itself: its credentials could then evict pods on any node. It
//! writes the pods it wants evicted on the volume's PV (`kit::eviction_request`), again every
//! round while the volume overflows, and takes the request back once it no longer does; the
//! controller checks each pod and evicts it through the Eviction API
//! (`controller::evictions`), which respects PodDisruptionBudgets. A budget that refuses for
//! good meets the fence.
//!
//! Events are recorded when something changes (a volume starts overflowing, is fenced), never
//! every round.

pub mod api;
mod fence;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tracing::{info, warn};

use crate::class::OnOverflow;
use crate::cluster::kit::client::Retries;
use crate::cluster::kit::events::Recorder;
use crate::cluster::kit::eviction_request::{self, EvictionRequest};
use crate::cluster::kit::task::{Inputs, Loop, NodeWork, Shutdown};
use crate::metrics::Metrics;
use crate::volume::Volumes;
use crate::volume::overflow::Overflowing;
use crate::volume::state::id::VolumeId;
use crate::volume::state::record::PodRef;

/// How often the loop looks whether stats noticed an overflow (a mutex and a set: cheap).
const NOTICE_POLL: Duration = Duration::from_secs(1);
/// Pods named in one Event; the rest are counted.
const PODS_NAMED: usize = 5;

#[derive(Debug, Clone)]
pub struct Settings {
    pub driver: String,
    pub node: String,
    /// Between full rounds; a measurement up to 1.5 intervals old is reused.
    pub interval: Duration,
    /// How long a volume it acts on may stay above its size with pods on it before its mounts
    /// are fenced read-only.
    pub fence_after: Duration,
}

/// What the check has announced and done, per volume, while it overflows.
#[derive(Debug, Default)]
pub struct Tracker {
    volumes: HashMap<VolumeId, Seen>,
}

#[derive(Debug)]
struct Seen {
    /// When the check first found it overflowing (this streak): its grace runs from here.
    since: std::time::Instant,
    /// Fenced read-only by this check (announced once).
    fenced: bool,
    /// The class's choice, for the gauge (None until `act` has seen the volume).
    on_overflow: Option<OnOverflow>,
    /// The PV an eviction request was written on (None: none is, or it was taken back).
    asked_on: Option<String>,
    /// The claim's uid once read (None: unknown, or not bound to this volume).
    claim_uid: Option<String>,
}

impl Default for Seen {
    fn default() -> Seen {
        Seen {
            since: std::time::Instant::now(),
            fenced: false,
            on_overflow: None,
            asked_on: None,
            claim_uid: None,
        }
    }
}

fn pod_list(pods: &[PodRef]) -> String {
    let mut named: Vec<String> = pods
        .iter()
        .take(PODS_NAMED)
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    if pods.len() > PODS_NAMED {
        named.push(format!("and {} more", pods.len() - PODS_NAMED));
    }
    named.join(", ")
}

/// Why a volume counts as overflowing: what it uses, or why it cannot be measured.
fn why_overflowing(volume: &Overflowing) -> String {
    match &volume.unmeasured {
        None if volume.held_unlinked_bytes > 0 => format!(
            "uses {} bytes ({} of them in deleted files its pods keep open), more than its size of {} bytes",
            volume.used_bytes, volume.held_unlinked_bytes, volume.capacity_bytes
        ),
        None => format!(
            "uses {} bytes, more than its size of {} bytes",
            volume.used_bytes, volume.capacity_bytes
        ),
        // A tenant must not escape the check by making its tree unmeasurable.
        Some(why) => format!(
            "cannot be measured: {why}; treated as above its size of {} bytes",
            volume.capacity_bytes
        ),
    }
}

/// The first Event about an overflowing volume: what it uses, and what follows.
fn overflow_message(volume: &Overflowing) -> String {
    let what = format!(
        "volume {} (PV {}) {}; its pool cannot limit sizes",
        volume.id,
        volume.pv_name,
        why_overflowing(volume)
    );
    let fix = match volume.unmeasured {
        None => "free space in it or expand the claim",
        Some(_) => {
            "make its tree measurable again (shallower, smaller, or left still while walked)"
        }
    };
    match (volume.on_overflow, volume.pods.is_empty()) {
        (OnOverflow::Report, _) => {
            format!("{what}. onOverflow: report: no pod is evicted; {fix}")
        }
        (OnOverflow::Evict, true) => format!(
            "{what}. onOverflow: evict, but kubelet named no pod for it (CSIDriver podInfoOnMount off when it was mounted?): nothing evicted"
        ),
        (OnOverflow::Evict, false) => format!(
            "{what}. onOverflow: evict: the controller evicts {}, as kubelet evicts a pod whose emptyDir passes its sizeLimit; the data stays: {fix} before a pod uses it again",
            pod_list(&volume.pods)
        ),
    }
}

/// Acts on one overflowing volume: announces it when new, asks for its pods' eviction.
async fn act(
    client: &Client,
    recorder: &Recorder,
    settings: &Settings,
    tracker: &mut Tracker,
    volume: &Overflowing,
) {
    let new = !tracker.volumes.contains_key(&volume.id);
    let seen = tracker.volumes.entry(volume.id.clone()).or_default();
    seen.on_overflow = Some(volume.on_overflow);
    if new {
        match &volume.unmeasured {
            None => {
                warn!(volume = %volume.id, pv = %volume.pv_name, used = volume.used_bytes, size = volume.capacity_bytes, on_overflow = %volume.on_overflow, pods = volume.pods.len(), "overflow check: volume above its size")
            }
            Some(why) => {
                warn!(volume = %volume.id, pv = %volume.pv_name, why, last_used = volume.used_bytes, size = volume.capacity_bytes, on_overflow = %volume.on_overflow, pods = volume.pods.len(), "overflow check: volume cannot be measured; treated as above its size")
            }
        }
        if let Some(claim) = &volume.claim {
            seen.claim_uid = api::claim_uid(client, claim, &volume.pv_name).await;
            let uid = seen.claim_uid.as_deref();
            let message = overflow_message(volume);
            api::record_event(recorder, claim, uid, "VolumeOverflow", "Measure", message).await;
        }
    }
    if volume.on_overflow == OnOverflow::Evict {
        ask(client, settings, seen, volume).await;
    }
}

/// Asks the controller to evict the volume's pods, again (a new expiry, a change the controller
/// sees, its retry), or takes the request back when kubelet names no pod for it any more.
async fn ask(client: &Client, settings: &Settings, seen: &mut Seen, volume: &Overflowing) {
    if volume.pods.is_empty() {
        withdraw(client, seen).await;
        return;
    }
    let request = EvictionRequest {
        pods: volume
            .pods
            .iter()
            .take(eviction_request::MAX_PODS)
            .cloned()
            .collect(),
        why: why_overflowing(volume),
        // Outlives the rounds between two writes, with one to spare: a request stays valid while
        // the node keeps asking, and means nothing soon after it stops.
        expires_unix_ms: crate::volume::state::record::now_ms()
            + 3 * settings.interval.as_millis() as u64,
    };
    match api::ask(client, &volume.pv_name, Some(&request)).await {
        Ok(()) => {
            if seen.asked_on.is_none() {
                info!(volume = %volume.id, pv = %volume.pv_name, pods = %pod_list(&volume.pods), "overflow check: asked the controller to evict the volume's pods");
            }
            seen.asked_on = Some(volume.pv_name.clone());
        }
        Err(err) => {
            warn!(volume = %volume.id, pv = %volume.pv_name, error = %err, "overflow check: could not ask for the eviction; asked again next round");
        }
    }
}

/// Takes back the eviction request `seen` wrote, if any (kept to try again next round if the
/// API server does not answer).
async fn withdraw(client: &Client, seen: &mut Seen) {
    let Some(pv_name) = seen.asked_on.clone() else {
        return;
    };
    match api::ask(client, &pv_name, None).await {
        Ok(()) => seen.asked_on = None,
        Err(err) => {
            warn!(pv = %pv_name, error = %err, "overflow check: could not take back an eviction request; it expires by itself");
        }
    }
}

/// One round: measures (see `volume::overflow`) all watched volumes, or those in `only`, and acts
/// on the overflowing ones.
pub async fn round(
    client: &Client,
    volumes: &Arc<Volumes>,
    settings: &Settings,
    metrics: &Metrics,
    tracker: &mut Tracker,
    only: Option<HashSet<VolumeId>>,
) {
    let listed = volumes.clone();
    // Half an interval of slack: kubelet's stats come about every minute, not exactly, and
    // one that lands a little late must still spare the check a walk.
    let reuse = settings.interval + settings.interval / 2;
    let full = only.is_none();
    let found =
        match tokio::task::spawn_blocking(move || listed.overflowing(reuse, only.as_ref())).await {
            Ok(found) => found,
            Err(err) => {
                warn!(error = %err, "overflow check: could not measure the volumes");
                return;
            }
        };
    if full {
        forget_fitting(client, tracker, &found).await;
    }
    let recorder = Recorder::new(client.clone(), api::REPORTING_CONTROLLER, &settings.node);
    for volume in &found {
        act(client, &recorder, settings, tracker, volume).await;
    }
    fence::fence_overdue(volumes, &recorder, settings, tracker, &found).await;
    if full {
        fence::lift(volumes, &recorder, reuse, &found).await;
    }
    // From what the check knows, not only this round's find: a round for the volumes stats
    // noticed announces them at once, and the gauge must say so as soon (the next full round
    // drops those back within their size).
    let (evicting, reporting) = tracker.overflowing();
    metrics.set_overflowing_volumes(evicting, reporting);
}

/// Forgets the volumes a full round no longer finds overflowing (back within their size,
/// unpublished, deleted), taking back their eviction requests: each is announced anew if it
/// overflows again.
async fn forget_fitting(client: &Client, tracker: &mut Tracker, found: &[Overflowing]) {
    let current: HashSet<&VolumeId> = found.iter().map(|v| &v.id).collect();
    let fitting: Vec<VolumeId> = (tracker.volumes.keys())
        .filter(|id| !current.contains(id))
        .cloned()
        .collect();
    for id in fitting {
        if let Some(mut seen) = tracker.volumes.remove(&id) {
            withdraw(client, &mut seen).await;
        }
    }
}

impl Tracker {
    /// The volumes known to overflow: (onOverflow evict, report).
    fn overflowing(&self) -> (usize, usize) {
        let evicting = self
            .volumes
            .values()
            .filter(|seen| seen.on_overflow == Some(OnOverflow::Evict))
            .count();
        (evicting, self.volumes.len() - evicting)
    }
}

/// A full round every interval, and a round for the volumes stats found above their size as
/// soon as they do, until `shutdown`.
pub async fn run(work: NodeWork, settings: Settings, shutdown: impl Future<Output = ()>) {
    let NodeWork {
        client,
        volumes,
        metrics,
    } = work;
    let mut tracker = Tracker::default();
    tokio::pin!(shutdown);
    // The first full round waits an interval too: after a start, kubelet's stats measure the
    // volumes in use within a minute, and a round at once would walk them all in a burst.
    let mut next_full = tokio::time::Instant::now() + settings.interval;
    loop {
        if tokio::time::Instant::now() >= next_full {
            // Noticed ones are part of a full round.
            volumes.take_noticed_overflows();
            round(&client, &volumes, &settings, &metrics, &mut tracker, None).await;
            next_full = tokio::time::Instant::now() + settings.interval;
        } else {
            let noticed = volumes.take_noticed_overflows();
            if !noticed.is_empty() {
                round(
                    &client,
                    &volumes,
                    &settings,
                    &metrics,
                    &mut tracker,
                    Some(noticed),
                )
                .await;
            }
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(NOTICE_POLL) => {}
        }
    }
}

/// The overflow check, where the configuration asks for one and this instance has volumes.
/// Without credentials the driver serves anyway, and says so. A round cut by the stop is
/// done again after the next start.
pub async fn start(inputs: &Inputs<'_>, shutdown: Shutdown) -> Result<Option<Loop>, kube::Error> {
    let config = inputs.config;
    let Some(interval) = config.overflow_check else {
        return Ok(None);
    };
    // Without kube's retries: the next round is the retry, and a round must not stall on one
    // PV while the fence's grace runs for the others.
    let Some(work) = inputs.node_work("overflow check", Retries::Off).await else {
        return Ok(None);
    };
    let settings = Settings {
        driver: config.driver_name.clone(),
        node: config.node_id.clone(),
        interval,
        fence_after: config.overflow_fence_after,
    };
    info!(interval = ?settings.interval, "overflow check starting");
    let run = run(work, settings, shutdown.wait());
    Ok(Some(Loop::new("overflow check", Duration::ZERO, run)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::state::id::NodeTag;

    fn pod(i: usize) -> PodRef {
        PodRef {
            namespace: "ns".into(),
            name: format!("p{i}"),
            uid: format!("u{i}"),
        }
    }

    fn volume(on_overflow: OnOverflow, pods: Vec<PodRef>) -> Overflowing {
        Overflowing {
            id: VolumeId::generate(&NodeTag::of("n")),
            pv_name: "pvc-1".into(),
            claim: None,
            on_overflow,
            used_bytes: 20,
            held_unlinked_bytes: 0,
            unmeasured: None,
            capacity_bytes: 10,
            pods,
        }
    }

    #[test]
    fn the_first_event_says_what_follows_from_the_policy() {
        let evict = overflow_message(&volume(OnOverflow::Evict, vec![pod(1)]));
        assert!(
            evict.contains("uses 20 bytes, more than its size of 10 bytes"),
            "{evict}"
        );
        assert!(evict.contains("the controller evicts ns/p1"), "{evict}");
        let report = overflow_message(&volume(OnOverflow::Report, vec![pod(1)]));
        assert!(report.contains("no pod is evicted"), "{report}");
        let blind = overflow_message(&volume(OnOverflow::Evict, Vec::new()));
        assert!(blind.contains("podInfoOnMount"), "{blind}");
        let many = overflow_message(&volume(OnOverflow::Evict, (0..8).map(pod).collect()));
        assert!(many.contains("ns/p4, and 3 more"), "{many}");
        assert!(!many.contains("ns/p5"), "{many}");
    }

    #[test]
    fn the_first_event_says_plainly_when_a_volume_cannot_be_measured() {
        let mut deep = volume(OnOverflow::Evict, vec![pod(1)]);
        deep.used_bytes = 0;
        deep.unmeasured = Some("holds directories more than 4096 levels deep".into());
        let message = overflow_message(&deep);
        assert!(
            message.contains(&format!(
                "volume {} (PV pvc-1) cannot be measured: holds directories more than 4096 levels deep; treated as above its size of 10 bytes",
                deep.id
            )),
            "{message}"
        );
        assert!(message.contains("the controller evicts ns/p1"), "{message}");
        assert!(!message.contains("uses 0 bytes"), "{message}");
        deep.on_overflow = OnOverflow::Report;
        let report = overflow_message(&deep);
        assert!(
            report.contains("cannot be measured") && report.contains("no pod is evicted"),
            "{report}"
        );
    }
}
