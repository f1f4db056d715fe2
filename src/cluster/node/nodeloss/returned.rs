//! A node that comes back after its claims were released: its driver finds the volumes whose
//! PV is gone and moves their data to lost+found (`volume::orphan`), never deleting it, and
//! reports each (log, Event, metric; `stickyvol volumes` shows them).
//!
//! A candidate's PV (the record's `csi.storage.k8s.io/pv/name`) is read with a consistent GET
//! when there is reason to: every candidate when the driver starts, and round after round for a
//! while after the controller's release notice says it deleted PVs of this node (`notice`; the
//! controller deletes them only while the node is lost, and a driver that ran through that
//! learns of it there); a volume when it becomes a candidate (made, or unpublished); and a
//! suspect every interval until it is settled. A PV seen present is not read again until one
//! of those. In steady state the check costs the API server one watch of one ConfigMap
//! (renewed every few minutes) and no reads, and it reads no Node: a node plugin's
//! credentials reach only its node.
//!
//! A volume is orphaned only when its PV was absent (or named another volume) on two reads at
//! least `confirm` apart on this process's monotonic clock. The volume has then been seen by
//! this process for `confirm` too, which a volume whose PV is still being made (the
//! provisioner creates it after CreateVolume returns) has not. The wall clock decides nothing:
//! a node back from power loss may start with it far behind, and NTP steps it forward between
//! two reads. An error, a PV present, or a published volume clears the suspicion: nothing is
//! ever decided on a failed read.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::Client;
use kube::api::Api;
use tracing::{debug, info, warn};

use super::notice::Notices;
use super::report::{self, Entry, State};
use crate::cluster::kit::client::Retries;
use crate::cluster::kit::events::{self, Kind, Recorder, Said};
use crate::cluster::kit::release_notice::{self, TakenBack};
use crate::cluster::kit::task::{Inputs, Loop, NodeWork, Shutdown};
use crate::config::is_object_name;
use crate::metrics::Metrics;
use crate::volume::Volumes;
use crate::volume::orphan::Candidate;
use crate::volume::state::id::VolumeId;
use crate::volume::state::record::now_ms;

/// The metric's action label.
pub const ACTION: &str = "orphan_to_lost_found";

#[derive(Debug, Clone)]
pub struct Settings {
    pub driver: String,
    pub node: String,
    pub interval: Duration,
    /// How long a PV must stay absent, on the monotonic clock, before the data moves.
    pub confirm: Duration,
    /// Where the node's report goes (`report`); None: no report.
    pub report: Option<report::Target>,
    /// The node's release notice, where the driver knows its namespace.
    pub notice: Option<NoticeTarget>,
}

/// Where the controller writes this node's release notice.
#[derive(Debug, Clone)]
pub struct NoticeTarget {
    pub namespace: String,
    pub name: String,
}

/// What one read of a candidate's PV showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// A PV of our driver naming this volume.
    Present,
    /// No PV of that name, or one of another driver or volume.
    Absent,
    /// The read failed: nothing can be concluded.
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    /// Absent once: looked at again next round.
    Suspect,
    Orphaned,
}

/// One reading of both clocks: the monotonic one decides, the wall one is only shown.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub monotonic: Instant,
    pub unix_ms: u64,
}

impl Now {
    pub fn read() -> Self {
        Self {
            monotonic: Instant::now(),
            unix_ms: now_ms(),
        }
    }
}

/// When each suspect's PV was first seen absent.
pub type Suspects = HashMap<VolumeId, Now>;

/// What the check knows of the candidates between rounds.
#[derive(Debug, Default)]
pub struct Looks {
    pub suspects: Suspects,
    /// Candidates whose PV was seen present: not read again until the next release notice.
    pub present: HashSet<VolumeId>,
}

impl Looks {
    /// Every candidate is read again at the next round.
    pub fn forget_present(&mut self) {
        self.present.clear();
    }
}

/// The rule, pure: see the module comment.
pub fn judge(
    suspects: &mut Suspects,
    candidate: &Candidate,
    seen: Seen,
    now: Now,
    confirm: Duration,
) -> Verdict {
    if seen != Seen::Absent {
        suspects.remove(&candidate.id);
        return Verdict::Keep;
    }
    let first = suspects
        .entry(candidate.id.clone())
        .or_insert(now)
        .monotonic;
    // Two reads at different times, even with a zero `confirm`.
    let absent_for = now.monotonic.saturating_duration_since(first);
    if absent_for >= confirm && now.monotonic > first {
        suspects.remove(&candidate.id);
        Verdict::Orphaned
    } else {
        Verdict::Suspect
    }
}

/// What a GET of the PV showed about volume `id`.
pub fn seen(read: &Result<Option<PersistentVolume>, kube::Error>, driver: &str, id: &str) -> Seen {
    match read {
        Err(_) => Seen::Unknown,
        Ok(None) => Seen::Absent,
        Ok(Some(pv)) => {
            let csi = pv.spec.as_ref().and_then(|s| s.csi.as_ref());
            if csi.is_some_and(|c| c.driver == driver && c.volume_handle == id) {
                Seen::Present
            } else {
                Seen::Absent
            }
        }
    }
}

/// One round: reads the PV of each candidate not seen present (`Looks`), judges, and moves
/// the orphans. Returns the volumes whose PV is absent but not yet for long enough.
pub async fn round(
    client: &Client,
    volumes: &Arc<Volumes>,
    settings: &Settings,
    metrics: &Metrics,
    looks: &mut Looks,
) -> Vec<Entry> {
    let listed = volumes.clone();
    let candidates = match tokio::task::spawn_blocking(move || listed.orphan_candidates()).await {
        Ok(candidates) => candidates,
        Err(err) => {
            warn!(error = %err, "orphan check: could not list the volumes");
            return Vec::new();
        }
    };
    // A volume published, deleted or orphaned meanwhile is no suspect any more, and is read
    // again when it is a candidate again.
    let current: HashSet<&VolumeId> = candidates.iter().map(|c| &c.id).collect();
    looks.suspects.retain(|id, _| current.contains(id));
    looks.present.retain(|id| current.contains(id));
    let unread: Vec<&Candidate> = (candidates.iter())
        .filter(|c| !looks.present.contains(&c.id))
        .collect();
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let mut absent = Vec::new();
    for candidate in unread {
        if !is_object_name(&candidate.pv_name) {
            debug!(volume = %candidate.id, "orphan check: the record's PV name is not a valid name; not looked up");
            continue;
        }
        let read = pvs.get_opt(&candidate.pv_name).await;
        if let Err(err) = &read {
            warn!(volume = %candidate.id, pv = %candidate.pv_name, error = %err, "orphan check: cannot read the PV; nothing decided");
        }
        let seen = seen(&read, &settings.driver, candidate.id.as_str());
        if seen == Seen::Present {
            looks.present.insert(candidate.id.clone());
        }
        let suspects = &mut looks.suspects;
        match judge(suspects, candidate, seen, Now::read(), settings.confirm) {
            Verdict::Keep => {}
            Verdict::Suspect => {
                info!(volume = %candidate.id, pv = %candidate.pv_name, "orphan check: the volume's PV is absent; checked again before anything moves");
                absent.push(Entry {
                    volume_id: candidate.id.to_string(),
                    pv: candidate.pv_name.clone(),
                    state: State::PvAbsent,
                    since_unix_ms: suspects.get(&candidate.id).map_or(0, |first| first.unix_ms),
                    lost_path: None,
                });
            }
            Verdict::Orphaned => {
                let owner = volumes.clone();
                let (id, pv) = (candidate.id.clone(), candidate.pv_name.clone());
                let result = tokio::task::spawn_blocking(move || owner.orphan(&id, &pv)).await;
                match result {
                    Ok(Ok(path)) => {
                        metrics.observe_node_loss(ACTION, true);
                        report(client, settings, candidate, &path.display().to_string()).await;
                    }
                    Ok(Err(err)) => {
                        metrics.observe_node_loss(ACTION, false);
                        warn!(volume = %candidate.id, error = %err, "orphan check: could not move the data to lost+found");
                    }
                    Err(err) => {
                        metrics.observe_node_loss(ACTION, false);
                        warn!(volume = %candidate.id, error = %err, "orphan check: the move failed unexpectedly");
                    }
                }
            }
        }
    }
    absent
}

/// The node's report: the orphaned volumes, then those whose PV is absent (None if listing the
/// records panicked: no report is better than one that drops every orphan).
async fn report_entries(volumes: &Arc<Volumes>, absent: Vec<Entry>) -> Option<Vec<Entry>> {
    let listed = volumes.clone();
    let orphaned = tokio::task::spawn_blocking(move || listed.orphaned())
        .await
        .ok()?;
    let entries = orphaned
        .into_iter()
        .map(|(id, orphaned)| Entry {
            volume_id: id.to_string(),
            pv: orphaned.pv_name,
            state: State::Orphaned,
            since_unix_ms: orphaned.since_unix_ms,
            lost_path: Some(orphaned.lost_path.display().to_string()),
        })
        .chain(absent)
        .collect();
    Some(entries)
}

/// Who writes the orphan check's Events.
pub const REPORTING_CONTROLLER: &str = "stickyvol.csi.io/orphan-check";

/// An Event on this node's Node object (the PV it would concern is gone).
async fn report(client: &Client, settings: &Settings, candidate: &Candidate, lost_path: &str) {
    let said = Said {
        kind: Kind::Warning,
        reason: "VolumeOrphaned",
        action: "MoveToLostFound",
        note: format!(
            "volume {} of PV {} (gone) moved to {lost_path} on node {}; inspect and remove it by hand",
            candidate.id, candidate.pv_name, settings.node
        ),
    };
    let node = events::cluster_scoped("v1", "Node", &settings.node, None);
    Recorder::new(client.clone(), REPORTING_CONTROLLER, &settings.node)
        .record(node, said)
        .await;
}

/// Publishes the node's report when it changed since last published (`last`; None: not known
/// to be published, as at start or after the Node was made again, which took the report with
/// the old one).
async fn publish_report(
    client: &Client,
    volumes: &Arc<Volumes>,
    target: &report::Target,
    absent: Vec<Entry>,
    last: &mut Option<Vec<Entry>>,
    published: &mut bool,
) {
    let Some(entries) = report_entries(volumes, absent).await else {
        return;
    };
    if last.as_ref() == Some(&entries) {
        return;
    }
    match report::publish(client, target, &entries, published).await {
        Ok(()) => *last = Some(entries),
        Err(err) => {
            warn!(error = %err, "orphan check: could not write this node's report; written again next round")
        }
    }
}

/// Runs until `shutdown`: a round at start and every interval (reading only the PVs there is
/// reason to read: see the module comment), and one at once when a release notice comes.
pub async fn run(work: NodeWork, settings: Settings, shutdown: impl Future<Output = ()>) {
    let NodeWork {
        client,
        volumes,
        metrics,
    } = work;
    let mut looks = Looks::default();
    let mut notices = Notices::default();
    let mut notice_events = match &settings.notice {
        Some(target) => release_notice::watch(&client, &target.namespace, &target.name).boxed(),
        None => futures::stream::pending().boxed(),
    };
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A report may be left from before this start.
    let (mut published, mut last) = (true, None);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tick.tick() => {}
            event = notice_events.next() => match event {
                Some(Ok(event)) => {
                    let Some(version) = release_notice::version_in(&event) else {
                        continue;
                    };
                    if !notices.seen(version, Instant::now()) {
                        continue;
                    }
                    info!(node = %settings.node, "orphan check: the controller released PVs of this node while it was away; every volume's PV is read again");
                    last = None;
                }
                Some(Err(err)) => {
                    debug!(error = %err, "orphan check: watching this node's release notice failed; retrying");
                    continue;
                }
                None => {
                    notice_events = futures::stream::pending().boxed();
                    continue;
                }
            },
        }
        if notices.recheck(Instant::now(), settings.confirm) {
            looks.forget_present();
        }
        let absent = round(&client, &volumes, &settings, &metrics, &mut looks).await;
        if let Some(target) = &settings.report {
            publish_report(&client, &volumes, target, absent, &mut last, &mut published).await;
        }
        take_back_notice(&client, &settings, &mut notices).await;
    }
}

/// Takes back the release notice once it has had every PV read again for its window.
async fn take_back_notice(client: &Client, settings: &Settings, notices: &mut Notices) {
    let (Some(target), Some(version)) = (
        &settings.notice,
        notices.due(Instant::now(), settings.confirm),
    ) else {
        return;
    };
    match release_notice::take_back(client, &target.namespace, &target.name, &version).await {
        Ok(TakenBack::Done) => {
            info!(notice = %target.name, "orphan check: every PV read again since the release notice; notice taken back");
            notices.taken_back(&version);
        }
        Ok(TakenBack::Changed) => notices.taken_back(&version),
        Err(err) => {
            warn!(notice = %target.name, error = %err, "orphan check: could not take back the release notice; tried again next round")
        }
    }
}

/// The check of a node that comes back, where the configuration asks for one and this instance
/// has volumes. The node's volumes matter more than its report: without credentials the driver
/// serves anyway, and says so. The stop does not wait: a move under way finishes on its
/// blocking thread; the loop itself just stops.
pub async fn start(inputs: &Inputs<'_>, shutdown: Shutdown) -> Result<Option<Loop>, kube::Error> {
    let config = inputs.config;
    let Some(check) = config.orphan_check.clone() else {
        return Ok(None);
    };
    let Some(work) = inputs.node_work("orphan check", Retries::On).await else {
        return Ok(None);
    };
    let settings = Settings {
        driver: config.driver_name.clone(),
        node: config.node_id.clone(),
        interval: check.interval,
        // Two looks at least one and a half intervals apart (see the opening of this module):
        // met at the third look, two intervals after the first. Each read comes a little after
        // its round's tick, so two whole intervals fell a hair short at the third look and
        // waited for a fourth (seen on the cluster: 180 s instead of 120).
        confirm: check.interval * 3 / 2,
        notice: check.report_namespace.as_ref().and_then(|namespace| {
            Some(NoticeTarget {
                namespace: namespace.clone(),
                name: release_notice::name(&config.driver_name, &config.node_id)?,
            })
        }),
        report: check.report_namespace.map(|namespace| report::Target {
            driver: config.driver_name.clone(),
            node: config.node_id.clone(),
            namespace,
        }),
    };
    info!(interval = ?settings.interval, report = ?settings.report.as_ref().map(|r| &r.namespace), "orphan check starting");
    let run = run(work, settings, shutdown.wait());
    Ok(Some(Loop::new("orphan check", Duration::ZERO, run)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const MIN: u64 = 60;
    /// 2026-11-27T08:00Z on the wall clock, when it is right.
    const WALL: u64 = 1_795_766_400_000;

    fn candidate() -> Candidate {
        Candidate {
            id: VolumeId::generate(&crate::volume::state::id::NodeTag::of("n")),
            pv_name: "pvc-1".into(),
        }
    }

    /// The clocks `secs` seconds after `start` on the monotonic clock, the wall clock reading
    /// `wall_ms`.
    fn at(start: Instant, secs: u64, wall_ms: u64) -> Now {
        Now {
            monotonic: start + Duration::from_secs(secs),
            unix_ms: wall_ms,
        }
    }

    /// Both clocks going at the same pace from `start`.
    fn steady(start: Instant, secs: u64) -> Now {
        at(start, secs, WALL + secs * 1000)
    }

    #[test]
    fn orphaned_only_after_two_absent_reads_confirm_apart() {
        let confirm = Duration::from_secs(120);
        let c = candidate();
        let mut s = Suspects::new();
        let t = Instant::now();
        assert_eq!(
            judge(&mut s, &c, Seen::Absent, steady(t, 0), confirm),
            Verdict::Suspect
        );
        assert_eq!(s[&c.id].unix_ms, WALL, "the wall time is kept to be shown");
        assert_eq!(
            judge(&mut s, &c, Seen::Absent, steady(t, MIN), confirm),
            Verdict::Suspect,
            "not yet confirm apart"
        );
        assert_eq!(
            judge(&mut s, &c, Seen::Absent, steady(t, 2 * MIN), confirm),
            Verdict::Orphaned
        );
        assert!(s.is_empty());
    }

    #[test]
    fn a_wall_clock_stepped_between_rounds_neither_shortens_nor_stretches_the_confirmation() {
        let confirm = Duration::from_secs(120);
        let c = candidate();
        let t = Instant::now();
        // Back from power loss with the clock a day behind: the volume is just made and its
        // PV not yet; then NTP steps the clock forward, and the next round comes a minute on.
        let behind = WALL - 24 * 3600 * 1000;
        let mut s = Suspects::new();
        assert_eq!(
            judge(&mut s, &c, Seen::Absent, at(t, 0, behind), confirm),
            Verdict::Suspect
        );
        assert_eq!(
            judge(&mut s, &c, Seen::Absent, at(t, MIN, WALL + 60_000), confirm),
            Verdict::Suspect,
            "a day of wall time in one minute is one minute"
        );
        assert_eq!(
            judge(
                &mut s,
                &c,
                Seen::Absent,
                at(t, 2 * MIN, WALL + 120_000),
                confirm
            ),
            Verdict::Orphaned
        );
        // A clock stepped back does not make it wait for the wall clock to catch up.
        let mut s = Suspects::new();
        judge(&mut s, &c, Seen::Absent, at(t, 0, WALL), confirm);
        assert_eq!(
            judge(&mut s, &c, Seen::Absent, at(t, 2 * MIN, behind), confirm),
            Verdict::Orphaned
        );
    }

    #[test]
    fn a_failed_read_or_a_present_pv_clears_the_suspicion() {
        let confirm = Duration::from_secs(120);
        let c = candidate();
        let t = Instant::now();
        for between in [Seen::Unknown, Seen::Present] {
            let mut s = Suspects::new();
            judge(&mut s, &c, Seen::Absent, steady(t, 10 * MIN), confirm);
            assert_eq!(
                judge(&mut s, &c, between, steady(t, 11 * MIN), confirm),
                Verdict::Keep
            );
            // The clock starts again.
            assert_eq!(
                judge(&mut s, &c, Seen::Absent, steady(t, 13 * MIN), confirm),
                Verdict::Suspect
            );
        }
        let mut s = Suspects::new();
        for i in 0..10 {
            assert_eq!(
                judge(&mut s, &c, Seen::Unknown, steady(t, i * MIN), confirm),
                Verdict::Keep,
                "errors never lead anywhere"
            );
        }
    }

    #[test]
    fn a_zero_confirm_still_needs_two_reads_at_different_times() {
        let c = candidate();
        let t = Instant::now();
        let mut s = Suspects::new();
        assert_eq!(
            judge(&mut s, &c, Seen::Absent, steady(t, 0), Duration::ZERO),
            Verdict::Suspect
        );
        assert_eq!(
            judge(&mut s, &c, Seen::Absent, steady(t, 0), Duration::ZERO),
            Verdict::Suspect
        );
        assert_eq!(
            judge(&mut s, &c, Seen::Absent, steady(t, 1), Duration::ZERO),
            Verdict::Orphaned
        );
    }

    #[test]
    fn only_a_pv_of_our_driver_naming_the_volume_is_its_pv() {
        let pv = |driver: &str, handle: &str| -> PersistentVolume {
            serde_json::from_value(json!({
                "metadata": {"name": "pvc-1"},
                "spec": {"csi": {"driver": driver, "volumeHandle": handle}}
            }))
            .unwrap()
        };
        let d = "stickyvol.csi.io";
        assert_eq!(seen(&Ok(Some(pv(d, "v1"))), d, "v1"), Seen::Present);
        assert_eq!(seen(&Ok(Some(pv(d, "v2"))), d, "v1"), Seen::Absent);
        assert_eq!(seen(&Ok(Some(pv("other", "v1"))), d, "v1"), Seen::Absent);
        let bare: PersistentVolume =
            serde_json::from_value(json!({"metadata": {"name": "pvc-1"}})).unwrap();
        assert_eq!(seen(&Ok(Some(bare)), d, "v1"), Seen::Absent);
        assert_eq!(seen(&Ok(None), d, "v1"), Seen::Absent);
        let err = kube::Error::Api(Box::new(kube::core::Status::failure(
            "boom",
            "InternalError",
        )));
        assert_eq!(seen(&Err(err), d, "v1"), Seen::Unknown);
    }

    #[test]
    fn hostile_pv_names_are_not_looked_up() {
        assert!(is_object_name("pvc-0b6c1a2e-7f00-4d1e-aa00-000000000000"));
        for bad in [
            "",
            "../nodes/x",
            "a/b",
            "A",
            "-a",
            "a-",
            "a?b",
            &"a".repeat(254),
        ] {
            assert!(!is_object_name(bad), "{bad}");
        }
    }
}
