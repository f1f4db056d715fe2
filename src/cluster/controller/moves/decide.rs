//! The next step of a move, from what the cluster shows now: a pure function of what `observe`
//! read, so that a move picks up where any crash left it (each step is one write whose effect
//! the next observation sees) and the tests can walk every state.
//!
//! The order, and why:
//! 1. (before this: the old PV set to Retain, the state saved on it: nothing below loses data)
//! 2. the pods using the claim are waited for, never stopped;
//! 3. a temporary claim has the new volume provisioned on the target node, by its own
//!    csi-provisioner; the new PV is set to Retain before anything records it;
//! 4. the claim is deleted (by uid): from then on no pod can mount the old volume, so the copy
//!    reads data nobody writes;
//! 5. the target node pulls the old volume, straight from the old node, checksummed;
//! 6. the temporary claim is deleted (the new PV, Retain, keeps its data);
//! 7. the claim is made again bound to the new PV, and the PV pre-bound to it by uid: never an
//!    Available PV that holds data;
//! 8. once bound: the new PV gets the old one's reclaim policy, the old PV is released to Delete.

use super::state::MoveState;

/// A claim as the move sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSeen {
    pub uid: String,
    pub volume_name: Option<String>,
    pub bound: bool,
    pub deleting: bool,
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
    /// The uid its claimRef names.
    pub claim_uid: Option<String>,
    pub copy: Copy,
}

/// Everything a step is decided on.
#[derive(Debug, Clone)]
pub struct Observed {
    pub state: MoveState,
    /// The claim of the moved name now: the original, or one made again.
    pub claim: Option<ClaimSeen>,
    /// Pods using the original claim (not Succeeded or Failed), `namespace/name`.
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
    DeleteClaim,
    WaitForClaimGone,
    AskCopy,
    WaitForCopy,
    /// A copy failed: counted and reported once, then tried again after a pause.
    NoteCopyFailure(String),
    WaitBeforeRetry {
        why: String,
        seconds: u64,
    },
    DeleteTemporaryClaim,
    CreateClaim,
    /// Pre-bind the new PV to the claim made again (its uid).
    BindNewPv(String),
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
        return match (claim.deleting, seen.pods.is_empty()) {
            (true, _) => Step::WaitForClaimGone,
            (false, false) => Step::WaitForPods(seen.pods.clone()),
            (false, true) => Step::DeleteClaim,
        };
    }
    match &new_pv.copy {
        Copy::NotAsked => return Step::AskCopy,
        Copy::Asked => return Step::WaitForCopy,
        Copy::Failed(why) => return after_failure(state, why, seen.now_unix_ms),
        Copy::Done { .. } => {}
    }
    rebind(seen, new_pv_name, new_pv)
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

/// With the data copied: the claim made again and bound to the new PV.
fn rebind(seen: &Observed, new_pv_name: &str, new_pv: &NewPv) -> Step {
    let state = &seen.state;
    let Some(claim) = &seen.claim else {
        return match seen.temporary {
            Some(_) => Step::DeleteTemporaryClaim,
            None => Step::CreateClaim,
        };
    };
    if claim.volume_name.as_deref() != Some(new_pv_name) {
        return Step::Stuck(format!(
            "claim {} was made again during the move, not by it (it is not bound to PV {new_pv_name}); the data is kept on PV {new_pv_name} (Retain) and on the old PV; delete that claim for the move to finish",
            state.claim_name()
        ));
    }
    if seen.temporary.is_some() {
        return Step::DeleteTemporaryClaim;
    }
    if new_pv.claim_uid.as_deref() != Some(claim.uid.as_str()) {
        return Step::BindNewPv(claim.uid.clone());
    }
    if claim.bound {
        Step::Finish
    } else {
        Step::WaitForBinding
    }
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
        }
    }

    fn claim(uid: &str, volume: Option<&str>, bound: bool) -> Option<ClaimSeen> {
        Some(ClaimSeen {
            uid: uid.into(),
            volume_name: volume.map(Into::into),
            bound,
            deleting: false,
        })
    }

    fn seen(new_pv: Option<&str>) -> Observed {
        Observed {
            state: state(new_pv),
            claim: claim("old-uid", Some("pvc-old"), true),
            pods: vec![],
            temporary: None,
            new_pv: new_pv.map(|_| NewPv {
                claim_uid: Some("tmp-uid".into()),
                copy: Copy::NotAsked,
            }),
            now_unix_ms: 1_000_000,
        }
    }

    /// Applies what `step` writes to what the next observation sees.
    fn apply(seen: &mut Observed, step: &Step) {
        let done = Copy::Done {
            sha256: "ab".into(),
            bytes: 1,
        };
        match step {
            Step::CreateTemporaryClaim => seen.temporary = claim("tmp-uid", None, false),
            Step::WaitForNewVolume => seen.temporary = claim("tmp-uid", Some("pvc-new"), true),
            Step::AdoptNewPv(pv) => {
                seen.state.new_pv = Some(pv.clone());
                seen.new_pv = Some(NewPv {
                    claim_uid: Some("tmp-uid".into()),
                    copy: Copy::NotAsked,
                });
            }
            Step::DeleteClaim => seen.claim.as_mut().unwrap().deleting = true,
            Step::WaitForClaimGone => seen.claim = None,
            Step::AskCopy => seen.new_pv.as_mut().unwrap().copy = Copy::Asked,
            Step::WaitForCopy => seen.new_pv.as_mut().unwrap().copy = done,
            Step::DeleteTemporaryClaim => seen.temporary = None,
            Step::CreateClaim => seen.claim = claim("new-uid", Some("pvc-new"), false),
            Step::BindNewPv(uid) => seen.new_pv.as_mut().unwrap().claim_uid = Some(uid.clone()),
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
                DeleteClaim,
                WaitForClaimGone,
                AskCopy,
                WaitForCopy,
                DeleteTemporaryClaim,
                CreateClaim,
                BindNewPv("new-uid".into()),
                WaitForBinding,
            ]
        );
    }

    #[test]
    fn a_pod_that_comes_back_before_the_claim_is_deleted_is_waited_for_again() {
        let mut at = seen(Some("pvc-new"));
        at.pods = vec!["shop/db-0".into()];
        assert_eq!(next(&at), Step::WaitForPods(vec!["shop/db-0".into()]));
        // Once the claim is being deleted, its protection holds it until the pod is gone.
        at.claim.as_mut().unwrap().deleting = true;
        assert_eq!(next(&at), Step::WaitForClaimGone);
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
    fn a_claim_made_again_by_someone_else_stops_the_move_and_nothing_is_deleted() {
        let mut at = seen(Some("pvc-new"));
        at.new_pv.as_mut().unwrap().copy = Copy::Done {
            sha256: "ab".into(),
            bytes: 1,
        };
        // A StatefulSet scaled up during the copy made the claim again, unbound.
        at.claim = claim("sts-uid", None, false);
        let Step::Stuck(why) = next(&at) else {
            panic!("{:?}", next(&at))
        };
        assert!(
            why.contains("made again during the move, not by it"),
            "{why}"
        );
        // The new PV gone: stuck too, the old PV keeps the data.
        at.new_pv = None;
        assert!(matches!(next(&at), Step::Stuck(why) if why.contains("is gone")));
    }

    #[test]
    fn a_restart_after_the_claim_was_made_again_goes_on_from_there() {
        let mut at = seen(Some("pvc-new"));
        at.new_pv.as_mut().unwrap().copy = Copy::Done {
            sha256: "ab".into(),
            bytes: 1,
        };
        at.claim = claim("new-uid", Some("pvc-new"), false);
        at.temporary = claim("tmp-uid", Some("pvc-new"), true);
        assert_eq!(next(&at), Step::DeleteTemporaryClaim);
        at.temporary = None;
        assert_eq!(next(&at), Step::BindNewPv("new-uid".into()));
        at.new_pv.as_mut().unwrap().claim_uid = Some("new-uid".into());
        at.claim.as_mut().unwrap().bound = true;
        assert_eq!(next(&at), Step::Finish);
    }
}
