//! Taking one step of a move (`act`'s writes), then saying what the move does now: a sentence
//! in its state, and an Event on its claim each time that sentence changes.

use k8s_openapi::api::core::v1::PersistentVolume;
use tracing::info;

use super::Mover;
use super::act::Writer;
use super::decide::{Copy, Observed, Step};
use super::state::{MOVE_FINALIZER, MoveState};
use crate::cluster::kit::events::{Kind, Said};

impl Mover {
    /// Takes `step`; the state as it now is, or None once the move has ended.
    pub(super) async fn take(
        &self,
        writer: &Writer<'_>,
        old: &PersistentVolume,
        seen: Observed,
        step: &Step,
    ) -> Result<Option<MoveState>, kube::Error> {
        let mut state = seen.state.clone();
        let (namespace, name) = (&state.claim.namespace, &state.claim.name);
        let new_pv = state.new_pv.clone().unwrap_or_default();
        match step {
            Step::CreateTemporaryClaim => writer.create_temporary_claim(&state, old).await?,
            Step::AdoptNewPv(pv) => {
                writer.retain(pv).await?;
                state.new_pv = Some(pv.clone());
            }
            Step::HoldClaim | Step::ReleaseClaim => {
                let claim = (namespace.as_str(), name.as_str(), state.claim.uid.as_str());
                writer.hold_claim(claim, *step == Step::HoldClaim).await?;
            }
            Step::DeleteClaim => {
                let uid = Some(state.claim.uid.as_str());
                writer.delete_claim(namespace, name, uid).await?;
            }
            Step::AskCopy => {
                writer.ask_copy(&state, &new_pv).await?;
                state.failure_seen_unix_ms = None;
            }
            Step::NoteCopyFailure(_) => {
                state.copy_failures += 1;
                state.failure_seen_unix_ms = Some(seen.now_unix_ms);
            }
            Step::DeleteTemporaryClaim => {
                // Kept, whatever changed it since: deleting the claim must not delete the data.
                writer.retain(&new_pv).await?;
                let temporary = MoveState::temporary_claim(writer.old_pv);
                let uid = seen.temporary.as_ref().map(|t| t.uid.as_str());
                writer.delete_claim(namespace, &temporary, uid).await?;
            }
            Step::CreateClaim => writer.create_claim(&state, &new_pv).await?,
            Step::PreBindNewPv => writer.pre_bind(&state, &new_pv).await?,
            Step::Finish => {
                writer.finish(&state, &new_pv).await?;
                let note = moved(&state, writer.old_pv, &seen);
                info!(claim = %state.claim_name(), from = %state.from, to = %state.to, "moves: done");
                self.say(&state, Kind::Normal, "Moved", note).await;
                return Ok(None);
            }
            _ => {}
        }
        let (kind, reason, status) = sentence(&state, writer.old_pv, &seen, step);
        let said = status != state.status;
        state.status = status;
        if state != seen.state {
            writer.save(&state).await?;
        }
        if said {
            self.say(&state, kind, reason, state.status.clone()).await;
        }
        Ok(Some(state))
    }

    /// An Event on the moved claim (the original, or the one made again).
    pub(super) async fn say(&self, state: &MoveState, kind: Kind, reason: &str, note: String) {
        let said = Said {
            kind,
            reason,
            action: "Move",
            note,
        };
        let claim = &state.claim;
        (self.recorder)
            .record_on_claim(&claim.namespace, &claim.name, said)
            .await;
    }
}

/// What the move does while `step` is its next: (kind, reason, sentence).
fn sentence(
    state: &MoveState,
    old_pv: &str,
    seen: &Observed,
    step: &Step,
) -> (Kind, &'static str, String) {
    let (to, from) = (&state.to, &state.from);
    let new_pv = state.new_pv.as_deref().unwrap_or_default();
    match step {
        Step::WaitForPods(pods) => (
            Kind::Normal,
            "MoveWaiting",
            format!(
                "waiting for the pods using the claim to end (scale their workload down): {}",
                pods.join(", ")
            ),
        ),
        Step::CreateTemporaryClaim | Step::WaitForNewVolume => (
            Kind::Normal,
            "MoveProvisioning",
            format!(
                "node {to}'s csi-provisioner makes the new volume, for claim {}/{} (its Events say why if it cannot)",
                state.claim.namespace,
                MoveState::temporary_claim(old_pv)
            ),
        ),
        Step::AdoptNewPv(_) | Step::HoldClaim | Step::DeleteClaim => (
            Kind::Normal,
            "MoveReleasing",
            format!(
                "new volume: PV {new_pv} on node {to}; the claim is deleted and held (finalizer {MOVE_FINALIZER}) so that no pod writes the old volume while it is copied"
            ),
        ),
        Step::AskCopy | Step::WaitForCopy => (
            Kind::Normal,
            "MoveCopying",
            format!("node {to} copies PV {old_pv} from node {from} into PV {new_pv}, node to node"),
        ),
        Step::NoteCopyFailure(why) | Step::WaitBeforeRetry { why, .. } => (
            Kind::Warning,
            "MoveCopyFailed",
            format!(
                "the copy failed ({} time(s) so far): {why}; tried again after a pause",
                state.copy_failures
            ),
        ),
        Step::DeleteTemporaryClaim
        | Step::PreBindNewPv
        | Step::ReleaseClaim
        | Step::WaitForClaimGone
        | Step::CreateClaim
        | Step::WaitForBinding => (
            Kind::Normal,
            "MoveBinding",
            format!(
                "copied and verified ({}); the claim is made again, bound to PV {new_pv}",
                copied(seen)
            ),
        ),
        Step::Stuck(why) => (Kind::Warning, "MoveStuck", why.clone()),
        Step::Finish => (Kind::Normal, "Moved", moved(state, old_pv, seen)),
    }
}

/// "N bytes, sha256 …" of the copy, as the target node reported it.
fn copied(seen: &Observed) -> String {
    match seen.new_pv.as_ref().map(|pv| &pv.copy) {
        Some(Copy::Done { sha256, bytes }) => format!("{bytes} bytes, sha256 {sha256}"),
        _ => "the copy's result is not on the PV".into(),
    }
}

/// The last line of a move.
fn moved(state: &MoveState, old_pv: &str, seen: &Observed) -> String {
    let seconds = seen.now_unix_ms.saturating_sub(state.started_unix_ms) / 1000;
    format!(
        "moved from node {} (PV {old_pv}, now released to Delete) to node {} (PV {}): {}, in {seconds} s",
        state.from,
        state.to,
        state.new_pv.as_deref().unwrap_or_default(),
        copied(seen)
    )
}
