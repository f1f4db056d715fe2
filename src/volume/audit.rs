//! The project-id audit: project quotas hold a volume to its size only while every inode in it
//! carries the volume's project id, and outside a user namespace the owner of a file may change
//! that id without privilege (pods with `hostUsers: false` cannot). A tenant could so write past
//! its size (project 0 counts against no limit), fill a neighbour's quota (its id), or tag files
//! with ids of our range. So every volume limited by a project quota is walked periodically
//! (`host::projtree`), every foreign id put back, and the volume reported (log, metrics, its
//! condition in NodeGetVolumeStats) until an audit finds it clean. The interval is the window in
//! which a tenant can exceed its size.
//!
//! A round audits one volume after another on one thread (never overlapping itself), each walk
//! holding one of the node's walk slots, so audits share the node with stats, copies and
//! removals. Rounds start `interval` apart (the next one at once when a round took longer).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::Volumes;
use super::inventory::{PARAM_PVC_NAME, PARAM_PVC_NAMESPACE};
use super::space::audit::Outcome;
use super::space::throttle::node_walks;
use super::state::id::VolumeId;
use super::state::record::{FenceCause, SizeLimit, VolumeKind, VolumeRecord};
use crate::host::caller::{self, Presence};
use crate::host::projtree::{self, Repairs};
use crate::host::tree::Budget;

/// What one volume's audit may spend: it holds a node walk slot, so minutes, not hours. A tree
/// beyond it is reported as not audited (it could hide foreign ids past the budget).
pub const AUDIT_BUDGET: Budget = Budget {
    entries: 1 << 25,
    time: Duration::from_secs(600),
};

/// A volume found with foreign project ids, for whoever reports it further (an Event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tampered {
    pub volume: String,
    /// The claim, where the provisioner passed it (--extra-create-metadata); empty otherwise.
    pub pvc_namespace: String,
    pub pvc_name: String,
    /// The Event's reason: `ProjectIdsRepaired`, or `AuditFenced` for a volume fenced read-only.
    pub reason: &'static str,
    pub message: String,
}

/// What one round did.
#[derive(Debug, Default)]
pub struct Round {
    pub audited: usize,
    pub tampered: Vec<Tampered>,
    pub unfinished: usize,
    pub inodes: u64,
}

impl Volumes {
    /// Audits every volume limited by a project quota once; stops early when the caller of this
    /// thread's work goes away (`host::caller`).
    pub fn audit_projects(&self) -> Round {
        let records = self.store.all();
        self.audits
            .retain(|id| records.iter().any(|record| &record.id == id));
        let mut round = Round::default();
        for record in records.iter() {
            if caller::gone() {
                break;
            }
            let SizeLimit::ProjectQuota { project_id } = record.size_limit else {
                continue;
            };
            if record.kind != VolumeKind::Filesystem || record.orphaned.is_some() {
                continue;
            }
            self.audit_one(record, project_id, &mut round);
        }
        round
    }

    fn audit_one(&self, record: &VolumeRecord, project_id: u32, round: &mut Round) {
        let Ok(pool) = self.pool_of(record) else {
            return;
        };
        let data = pool.data_path(&record.id, record.kind);
        let Some(_slot) = node_walks().take() else {
            return;
        };
        // Deleted meanwhile (its record gone): nothing to audit nor to report.
        if self.get(&record.id).is_err() || !data.exists() {
            return;
        }
        let walked = projtree::repair_tree(&data, project_id, AUDIT_BUDGET, &caller::gone);
        round.audited += 1;
        let id = &record.id;
        let pvc = pvc_of(record);
        match walked {
            Ok(repairs) => {
                round.inodes += repairs.inodes;
                let message = || tamper_message(record, project_id, &repairs);
                if repairs.repaired > 0 || repairs.unchecked > 0 {
                    let text = message();
                    warn!(volume = %id, pvc = %pvc, project_id, repaired = repairs.repaired, unchecked = repairs.unchecked, "{text}");
                    round
                        .tampered
                        .push(report(record, "ProjectIdsRepaired", text));
                }
                // A file its owner keeps from the audit (a lease re-taken after each break)
                // exempts it one round, not two.
                let unchecked_again = repairs.unchecked > 0 && self.audits.left_unchecked(id);
                self.audits.record(id, &Outcome::Walked(&repairs), message);
                if unchecked_again {
                    let why = format!(
                        "the project-id audit of volume {id} could not check {} of its files two rounds in a row",
                        repairs.unchecked
                    );
                    self.fence_for_audit(record, &why, round);
                } else if repairs.unchecked == 0 {
                    self.lift_audit_fence(id);
                }
            }
            Err(err) if caller::gone() => {
                debug!(volume = %id, error = %err, "project audit stopped")
            }
            // Deleted while walked: its tree went away under the walk.
            Err(_) if self.get(id).is_err() => {}
            Err(err) => {
                round.unfinished += 1;
                let why = format!(
                    "the project-id audit of volume {id} did not finish ({err}): files in it may \
                     count against another project than its own"
                );
                warn!(volume = %id, pvc = %pvc, project_id, "{why}");
                self.audits
                    .record(id, &Outcome::Unfinished(why.clone()), String::new);
                self.fence_for_audit(record, &why, round);
            }
        }
    }

    /// Fences a volume whose audit cannot vouch for every inode (see `fence`), with an Event
    /// the first time.
    fn fence_for_audit(&self, record: &VolumeRecord, why: &str, round: &mut Round) {
        let id = &record.id;
        match self.fence(id, FenceCause::Audit, why) {
            Ok(outcome) if outcome.new => {
                let message = format!(
                    "volume {id} is fenced read-only ({} mounts, in the pods' containers too): {why}; {}",
                    outcome.mounts_changed,
                    super::fence::way_out(FenceCause::Audit)
                );
                round.tampered.push(report(record, "AuditFenced", message));
            }
            Ok(_) => {}
            Err(err) => {
                warn!(volume = %id, error = %err, "project-id audit: could not fence the volume; trying again next round")
            }
        }
    }

    /// Lifts the fence of a volume whose audit finished checking every inode.
    fn lift_audit_fence(&self, id: &VolumeId) {
        if let Err(err) = self.unfence(id, Some(FenceCause::Audit)) {
            warn!(volume = %id, error = %err, "project-id audit: could not lift the volume's fence; trying again next round");
        }
    }

    /// Why volume `id` is abnormal after its last project-id audit, if it is.
    pub(super) fn audit_problem(&self, id: &super::state::id::VolumeId) -> Option<String> {
        self.audits.problem(id)
    }

    pub fn audit_totals(&self) -> super::space::audit::AuditTotals {
        self.audits.totals()
    }
}

/// Runs audit rounds `interval` apart until `stop` is set (checked between entries of a walk,
/// and while waiting), handing each round's tampered volumes to `report`. The first round waits
/// one interval: a restart needs no audit at once.
pub fn run_every(
    volumes: Arc<Volumes>,
    interval: Duration,
    stop: Arc<AtomicBool>,
    report: impl Fn(Vec<Tampered>),
) {
    info!(interval = ?interval, "project-id audit starting");
    Presence::serve(stop.clone(), || {
        let mut next = Instant::now() + interval;
        loop {
            while Instant::now() < next {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(caller::LOOK_EVERY.min(next - Instant::now()));
            }
            let started = Instant::now();
            let round = volumes.audit_projects();
            debug!(
                audited = round.audited,
                tampered = round.tampered.len(),
                unfinished = round.unfinished,
                inodes = round.inodes,
                seconds = started.elapsed().as_secs_f64(),
                "project-id audit round done"
            );
            if !round.tampered.is_empty() {
                report(round.tampered);
            }
            next = (started + interval).max(Instant::now());
        }
    });
}

/// A report for an Event on the volume's claim.
fn report(record: &VolumeRecord, reason: &'static str, message: String) -> Tampered {
    Tampered {
        volume: record.id.to_string(),
        pvc_namespace: parameter(record, PARAM_PVC_NAMESPACE),
        pvc_name: parameter(record, PARAM_PVC_NAME),
        reason,
        message,
    }
}

fn parameter(record: &VolumeRecord, key: &str) -> String {
    record.parameters.get(key).cloned().unwrap_or_default()
}

/// "namespace/name" of the volume's claim, or "-" when unknown.
fn pvc_of(record: &VolumeRecord) -> String {
    match (
        parameter(record, PARAM_PVC_NAMESPACE),
        parameter(record, PARAM_PVC_NAME),
    ) {
        (_, name) if name.is_empty() => "-".into(),
        (namespace, name) => format!("{namespace}/{name}"),
    }
}

fn tamper_message(record: &VolumeRecord, project_id: u32, repairs: &Repairs) -> String {
    let found: Vec<String> = repairs
        .foreign
        .iter()
        .map(|(&id, count)| match id == project_id {
            true => format!("{count} directories without the inherit flag"),
            false => format!("{count} in project {id}"),
        })
        .collect();
    let mut message = format!(
        "volume {}: {} of {} inodes had left its project {project_id} ({}) and were put back; \
         until then they could exceed its size or fill another volume's",
        record.id,
        repairs.repaired,
        repairs.inodes,
        found.join(", ")
    );
    if repairs.unchecked > 0 {
        message += &format!(
            "; {} files held under a lease could not be checked",
            repairs.unchecked
        );
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_foreign_projects() {
        use crate::volume::state::id::{NodeTag, VolumeId};
        use crate::volume::state::record::{AccessMode, Allocation};
        let mut record = VolumeRecord {
            id: VolumeId::generate(&NodeTag::of("node-a")),
            name: "pvc-1".into(),
            kind: VolumeKind::Filesystem,
            capacity_bytes: 1 << 20,
            asked_bytes: None,
            pool: "default".into(),
            size_limit: SizeLimit::ProjectQuota {
                project_id: 1_000_000_456,
            },
            allocation: Allocation::Thin,
            access_modes: vec![AccessMode::SingleNodeWriter],
            mount_flags: vec![],
            parameters: Default::default(),
            created_unix_ms: 1,
            content_source: None,
            importing: false,
            unchecked: false,
            orphaned: None,
            fenced: None,
            io_limits: Default::default(),
            on_overflow: None,
            encryption: None,
            publications: vec![],
        };
        let repairs = Repairs {
            inodes: 10,
            repaired: 3,
            unchecked: 1,
            foreign: [(0, 2), (1_000_000_123, 1), (1_000_000_456, 1)].into(),
        };
        let text = tamper_message(&record, 1_000_000_456, &repairs);
        assert!(text.contains("3 of 10 inodes"), "{text}");
        assert!(
            text.contains("2 in project 0, 1 in project 1000000123, 1 directories without"),
            "{text}"
        );
        assert!(text.contains("1 files held under a lease"), "{text}");
        assert_eq!(pvc_of(&record), "-");
        record
            .parameters
            .insert(PARAM_PVC_NAMESPACE.into(), "shop".into());
        record
            .parameters
            .insert(PARAM_PVC_NAME.into(), "data-0".into());
        assert_eq!(pvc_of(&record), "shop/data-0");
    }
}
