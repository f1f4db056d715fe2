//! The next step of a move, from what the cluster shows now: a pure function of what `observe`
//! read, so that a move picks up where any crash left it (each step is one write whose effect
//! the next observation sees) and the tests can walk every state.
//!
//! The order, and why:
//! 1. (before this: the old PV set to Retain, the state saved on it: nothing below loses data)
//! 2. the pods on a node using the claim are waited for, never stopped (a pod waiting to be
//!    scheduled, as after `kubectl drain`, mounts nothing);
//! 3. a temporary claim has the new volume provisioned on the target node, by its own
//!    csi-provisioner; the new PV is set to Retain before anything records it;
//! 4. the claim is held (a finalizer of ours), then deleted by uid: while it is being deleted no
//!    pod can start with it, and it still exists, so a StatefulSet does not make it again; the
//!    old volume is not written while it is copied;
//! 5. the target node pulls the old volume, straight from the old node, checksummed;
//! 6. the temporary claim is deleted (the new PV, Retain, keeps its data) and the new PV is
//!    pre-bound to the claim's name: whichever claim of that name comes next binds to it, ours
//!    or one a StatefulSet makes, never another;
//! 7. the claim is let go (the finalizer removed) and made again bound to the new PV;
//! 8. once bound: the new PV gets the old one's reclaim policy, the old PV is released to Delete.

use super::state::MoveState;

/// A claim as the move sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSeen {
    pub uid: String,
    pub volume_name: Option<String>,
    pub bound: bool,
    pub deleting: bool,
    /// It carries the move's finalizer.
    pub held: bool,
}

/// Where the copy into the new PV stands (its pull annotations).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Copy {
    NotAsked,
    Asked,
    Done { sha256: String, bytes: u64 },
    Failed(String),
}

/// The new PV as the move sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPv {
    /// The claim name its claimRef names (the temporary claim's, then the moved claim's).
    pub claim_name: Option<String>,
    pub copy: Copy,
}

/// Everything a step is decided on.
#[derive(Debug, Clone)]
pub struct Observed {
    pub state: MoveState,
    /// The claim of the moved name now: the original, or one made again.
    pub claim: Option<ClaimSeen>,
    /// Pods on a node using the original claim (not Succeeded or Failed), `namespace/name`.
    pub pods: Vec<String>,
    pub temporary: Option<ClaimSeen>,
    /// The new PV, when the state names one (None: it is gone).
    pub new_pv: Option<NewPv>,
    pub now_unix_ms: u64,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    WaitForPods(Vec<String>),
    CreateTemporaryClaim,
    WaitForNewVolume,
    /// The temporary claim is bound to this PV: set it to Retain, then record it.
    AdoptNewPv(String),
    /// Put the move's finalizer on the claim, so that deleting it leaves it in place.
    HoldClaim,
    DeleteClaim,
    AskCopy,
    WaitForCopy,
    /// A copy failed: counted and reported once, then tried again after a pause.
    NoteCopyFailure(String),
    WaitBeforeRetry {
        why: String,
        seconds: u64,
    },
    DeleteTemporaryClaim,
    /// Point the new PV's claimRef at the claim's name (no uid: whichever claim of that name).
    PreBindNewPv,
    /// Take the move's finalizer off the held claim: it goes.
    ReleaseClaim,
    WaitForClaimGone,
    CreateClaim,
    WaitForBinding,
    Finish,
    /// Something outside the move is in its way: said, and looked at again each round.
    Stuck(String),
}

/// The pause before copy attempt n+1 after n failures: 10 s doubling, at most 5 minutes.
pub fn retry_after_ms(failures: u32) -> u64 {
    (10_000u64 << failures.saturating_sub(1).min(5)).min(300_000)
}

pub fn next(seen: &Observed) -> Step {
    let state = &seen.state;
    let original = seen
        .claim
        .as_ref()
        .filter(|claim| claim.uid == state.claim.uid);
    let Some(new_pv_name) = &state.new_pv else {
        if original.is_some() && !seen.pods.is_empty() {
            return Step::WaitForPods(seen.pods.clone());
        }
        return match &seen.temporary {
            None => Step::CreateTemporaryClaim,
            Some(temporary) => match (&temporary.volume_name, temporary.bound) {
                (Some(pv), true) => Step::AdoptNewPv(pv.clone()),
                _ => Step::WaitForNewVolume,
            },
        };
    };
    let Some(new_pv) = &seen.new_pv else {
        return Step::Stuck(format!(
            "PV {new_pv_name}, made for the move on node {}, is gone; the data stays on the old PV (Retain)",
            state.to
        ));
    };
    if let Some(claim) = original {
        match (claim.held, claim.deleting, seen.pods.is_empty()) {
            // A pod that started before the claim was deleted still runs: waited for.
            (_, _, false) => return Step::WaitForPods(seen.pods.clone()),
            (false, false, true) => return Step::HoldClaim,
            (true, false, true) => return Step::DeleteClaim,
            // Being deleted and held (or gone but for other finalizers): frozen, copied.
            (_, true, true) => {}
        }
    }
    match &new_pv.copy {
        Copy::NotAsked => return Step::AskCopy,
        Copy::Asked => return Step::WaitForCopy,
        Copy::Failed(why) => return after_failure(state, why, seen.now_unix_ms),
        Copy::Done { .. } => {}
    }
    rebind(seen, new_pv_name, new_pv, original)
}

/// After a failed copy: note it once, then wait the pause out, then ask again.
fn after_failure(state: &MoveState, why: &str, now: u64) -> Step {
    let Some(seen_at) = state.failure_seen_unix_ms else {
        return Step::NoteCopyFailure(why.to_string());
    };
    let due = seen_at + retry_after_ms(state.copy_failures);
    if now >= due {
        Step::AskCopy
    } else {
        Step::WaitBeforeRetry {
            why: why.to_string(),
            seconds: (due - now).div_ceil(1000),
        }
    }
}

/// With the data copied: the new PV pre-bound to the claim's name, the claim let go and made
/// again, bound to it.
fn rebind(
    seen: &Observed,
    new_pv_name: &str,
    new_pv: &NewPv,
    original: Option<&ClaimSeen>,
) -> Step {
    let state = &seen.state;
    if seen.temporary.is_some() {
        return Step::DeleteTemporaryClaim;
    }
    if new_pv.claim_name.as_deref() != Some(state.claim.name.as_str()) {
        return Step::PreBindNewPv;
    }
    if let Some(original) = original {
        return match original.held {
            true => Step::ReleaseClaim,
            // Deleted by someone else (a StatefulSet scaled down): goes by itself.
            false => Step::WaitForClaimGone,
        };
    }
    let Some(claim) = &seen.claim else {
        return Step::CreateClaim;
    };
    // Ours, or one a StatefulSet made in the meantime: either binds to the pre-bound PV.
    match claim.volume_name.as_deref() {
        Some(pv) if pv != new_pv_name => stuck_on(state, new_pv_name),
        Some(_) if claim.bound => Step::Finish,
        _ => Step::WaitForBinding,
    }
}

/// The claim was made again and bound to another volume: nothing of the move's is deleted.
fn stuck_on(state: &MoveState, new_pv_name: &str) -> Step {
    Step::Stuck(format!(
        "claim {} was made again during the move and bound to another volume; the data is kept on PV {new_pv_name} (Retain) and on the old PV; delete that claim for the move to finish",
        state.claim_name()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::controller::moves::state::SavedClaim;
    use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;

    fn state(new_pv: Option<&str>) -> MoveState {
        MoveState {
            to: "b".into(),
            from: "a".into(),
            claim: SavedClaim {
                namespace: "shop".into(),
                name: "data-0".into(),
                uid: "old-uid".into(),
                labels: Default::default(),
                annotations: Default::default(),
                owner_references: vec![],
                spec: PersistentVolumeClaimSpec::default(),
            },
            reclaim_policy: "Delete".into(),
            started_unix_ms: 0,
            new_pv: new_pv.map(Into::into),
            copy_failures: 0,
            failure_seen_unix_ms: None,
            status: String::new(),
            from_disk: None,
        }
    }

    fn claim(uid: &str, volume: Option<&str>, bound: bool) -> Option<ClaimSeen> {
        Some(ClaimSeen {
            uid: uid.into(),
            volume_name: volume.map(Into::into),
            bound,
            deleting: false,
            held: false,
        })
    }

    fn new_pv(claim_name: &str, copy: Copy) -> Option<NewPv> {
        Some(NewPv {
            claim_name: Some(claim_name.into()),
            copy,
        })
    }

    fn done() -> Copy {
        Copy::Done {
            sha256: "ab".into(),
            bytes: 1,
        }
    }

    fn seen(new: Option<&str>) -> Observed {
        Observed {
            state: state(new),
            claim: claim("old-uid", Some("pvc-old"), true),
            pods: vec![],
            temporary: None,
            new_pv: new.and_then(|_| new_pv("sv-move-pvc-old", Copy::NotAsked)),
            now_unix_ms: 1_000_000,
        }
    }

    /// Applies what `step` writes (and what Kubernetes then does) to the next observation.
    fn apply(seen: &mut Observed, step: &Step) {
        match step {
            Step::CreateTemporaryClaim => seen.temporary = claim("tmp-uid", None, false),
            Step::WaitForNewVolume => seen.temporary = claim("tmp-uid", Some("pvc-new"), true),
            Step::AdoptNewPv(pv) => {
                seen.state.new_pv = Some(pv.clone());
                seen.new_pv = new_pv("sv-move-pvc-old", Copy::NotAsked);
            }
            Step::HoldClaim => seen.claim.as_mut().unwrap().held = true,
            Step::DeleteClaim => seen.claim.as_mut().unwrap().deleting = true,
            Step::AskCopy => seen.new_pv.as_mut().unwrap().copy = Copy::Asked,
            Step::WaitForCopy => seen.new_pv.as_mut().unwrap().copy = done(),
            Step::DeleteTemporaryClaim => seen.temporary = None,
            Step::PreBindNewPv => seen.new_pv.as_mut().unwrap().claim_name = Some("data-0".into()),
            Step::ReleaseClaim => seen.claim = None,
            Step::CreateClaim => seen.claim = claim("new-uid", Some("pvc-new"), false),
            Step::WaitForBinding => seen.claim.as_mut().unwrap().bound = true,
            other => panic!("no step {other:?} on the straight path"),
        }
    }

    #[test]
    fn a_move_without_trouble_takes_each_step_once_in_order() {
        let mut at = seen(None);
        at.pods = vec!["shop/db-0".into()];
        assert_eq!(next(&at), Step::WaitForPods(vec!["shop/db-0".into()]));
        at.pods.clear();
        let mut steps = vec![];
        while next(&at) != Step::Finish {
            let step = next(&at);
            apply(&mut at, &step);
            steps.push(step);
            assert!(steps.len() < 20, "{steps:?}");
        }
        use Step::*;
        assert_eq!(
            steps,
            [
                CreateTemporaryClaim,
                WaitForNewVolume,
                AdoptNewPv("pvc-new".into()),
                HoldClaim,
                DeleteClaim,
                AskCopy,
                WaitForCopy,
                DeleteTemporaryClaim,
                PreBindNewPv,
                ReleaseClaim,
                CreateClaim,
                WaitForBinding,
            ]
        );
    }

    #[test]
    fn a_pod_that_starts_before_the_claim_is_deleted_is_waited_for_before_the_copy() {
        let mut at = seen(Some("pvc-new"));
        at.pods = vec!["shop/db-0".into()];
        assert_eq!(next(&at), Step::WaitForPods(vec!["shop/db-0".into()]));
        // Still running once the claim is being deleted (it started just before): no copy yet.
        let claim = at.claim.as_mut().unwrap();
        (claim.held, claim.deleting) = (true, true);
        assert_eq!(next(&at), Step::WaitForPods(vec!["shop/db-0".into()]));
        at.pods.clear();
        assert_eq!(next(&at), Step::AskCopy);
    }

    #[test]
    fn a_claim_deleted_by_its_statefulset_is_copied_then_waited_for() {
        let mut at = seen(Some("pvc-new"));
        // whenScaled: Delete: deleted by the StatefulSet, not held by the move.
        at.claim.as_mut().unwrap().deleting = true;
        assert_eq!(next(&at), Step::AskCopy);
        at.new_pv = new_pv("data-0", done());
        assert_eq!(next(&at), Step::WaitForClaimGone);
        at.claim = None;
        assert_eq!(next(&at), Step::CreateClaim);
    }

    #[test]
    fn a_claim_a_statefulset_makes_meanwhile_binds_to_the_pre_bound_pv() {
        let mut at = seen(Some("pvc-new"));
        at.new_pv = new_pv("data-0", done());
        // Made from the template, no volume named: the PV controller binds it to the new PV.
        at.claim = claim("sts-uid", None, false);
        assert_eq!(next(&at), Step::WaitForBinding);
        at.claim = claim("sts-uid", Some("pvc-new"), true);
        assert_eq!(next(&at), Step::Finish);
        // Bound to another volume: stuck, nothing deleted.
        at.claim = claim("sts-uid", Some("pvc-other"), true);
        let Step::Stuck(why) = next(&at) else {
            panic!("{:?}", next(&at))
        };
        assert!(why.contains("bound to another volume"), "{why}");
        at.new_pv = None;
        assert!(matches!(next(&at), Step::Stuck(why) if why.contains("is gone")));
    }

    #[test]
    fn a_failed_copy_is_noted_once_then_retried_after_a_growing_pause() {
        let mut at = seen(Some("pvc-new"));
        at.claim = None;
        at.new_pv.as_mut().unwrap().copy = Copy::Failed("node a is unreachable".into());
        assert_eq!(
            next(&at),
            Step::NoteCopyFailure("node a is unreachable".into())
        );
        at.state.copy_failures = 1;
        at.state.failure_seen_unix_ms = Some(at.now_unix_ms);
        assert!(matches!(
            next(&at),
            Step::WaitBeforeRetry { seconds: 10, .. }
        ));
        at.now_unix_ms += 10_000;
        assert_eq!(next(&at), Step::AskCopy);
        assert_eq!(retry_after_ms(2), 20_000);
        assert_eq!(retry_after_ms(40), 300_000);
    }

    #[test]
    fn a_restart_after_the_claim_was_made_again_goes_on_from_there() {
        let mut at = seen(Some("pvc-new"));
        at.new_pv = new_pv("sv-move-pvc-old", done());
        at.claim = None;
        at.temporary = claim("tmp-uid", Some("pvc-new"), true);
        assert_eq!(next(&at), Step::DeleteTemporaryClaim);
        at.temporary = None;
        assert_eq!(next(&at), Step::PreBindNewPv);
        at.new_pv = new_pv("data-0", done());
        assert_eq!(next(&at), Step::CreateClaim);
        at.claim = claim("new-uid", Some("pvc-new"), true);
        assert_eq!(next(&at), Step::Finish);
    }
}
