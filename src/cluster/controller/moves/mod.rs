//! Moves (controller mode, `--moves=on`): a claim of ours goes to another node with its data,
//! when asked by `stickyvol cluster move` or by hand (the label `stickyvol.csi.io/move-requested`
//! and the annotation `stickyvol.csi.io/move-to` on the claim). `accept` checks the request and
//! starts the move (the old PV to Retain, the state saved on it); each round then reads where
//! each move stands (`observe`), decides its next step (`decide`, pure) and takes it (`act`),
//! until the claim is bound to the new PV and the old one released to Delete. The state lives on
//! the old PV, so a restart of the controller or of either node continues where it stopped.
//! Each change of what a move does is an Event on its claim and a sentence in its state.

pub mod accept;
pub mod act;
pub mod decide;
pub mod observe;
pub mod state;
mod take;

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tracing::{info, warn};

use crate::cluster::kit::client::{self, Retries};
use crate::cluster::kit::events::{self, Kind, Recorder, Said};
use crate::cluster::kit::names::MOVE_TO;
use crate::cluster::kit::task::{Inputs, Loop, Shutdown};
use accept::{Checked, Settings};
use act::Writer;
use decide::Step;
use state::{MOVE_REQUESTED, MOVING, MoveState};

/// Who writes this loop's Events.
pub const REPORTING_CONTROLLER: &str = "stickyvol.csi.io/moves";
/// On a claim whose move request was refused: why (the request itself is taken off).
pub const MOVE_REFUSED: &str = "stickyvol.csi.io/move-refused";
/// Between rounds: a move waits on other controllers (csi-provisioner, the PV controller, the
/// target node's pull), each of which acts within seconds.
const ROUND: Duration = Duration::from_secs(2);
/// Steps taken for one move in one round before the next move's turn.
const STEPS_PER_ROUND: usize = 8;

/// What the loop works with.
pub struct Mover {
    client: Client,
    recorder: Recorder,
    settings: Settings,
}

impl Mover {
    pub fn new(client: Client, settings: Settings, identity: String) -> Mover {
        Mover {
            recorder: Recorder::new(client.clone(), REPORTING_CONTROLLER, identity),
            client,
            settings,
        }
    }

    /// One round: new requests started (or refused), then each move taken forward.
    pub async fn round(&self) -> Result<(), kube::Error> {
        let claims = Api::<PersistentVolumeClaim>::all(self.client.clone());
        let asked = claims
            .list(&ListParams::default().labels(MOVE_REQUESTED))
            .await?;
        for claim in &asked.items {
            self.request(claim).await;
        }
        let pvs = Api::<PersistentVolume>::all(self.client.clone());
        let moving = pvs.list(&ListParams::default().labels(MOVING)).await?;
        for pv in &moving.items {
            self.advance(pv).await;
        }
        Ok(())
    }

    /// A claim asking to move: started, refused, or (started before) nothing.
    async fn request(&self, claim: &PersistentVolumeClaim) {
        let named = accept::claim_name(claim);
        let to = (claim.metadata.annotations.as_ref())
            .and_then(|a| a.get(MOVE_TO))
            .cloned()
            .unwrap_or_default();
        let refused = match accept::check(&self.client, &self.settings, claim, &to).await {
            Ok(Checked::Started(_)) => return,
            Ok(Checked::May { pv, from }) => {
                match accept::start(&self.client, claim, &pv, (&from, &to)).await {
                    Ok(state) => {
                        info!(claim = %named, from, to, "moves: started");
                        let note = format!(
                            "moving to node {to} from node {from}: PV {} is kept (Retain) until the move ends",
                            pv.metadata.name.as_deref().unwrap_or_default()
                        );
                        self.say(&state, Kind::Normal, "MoveStarted", note).await;
                        return;
                    }
                    // Changed since read: the next round reads it again.
                    Err(err) => {
                        warn!(claim = %named, error = %err, "moves: could not start");
                        return;
                    }
                }
            }
            Err(why) => why,
        };
        warn!(claim = %named, why = %refused, "moves: request refused");
        let patch = json!({"metadata": {
            "labels": {MOVE_REQUESTED: null},
            "annotations": {MOVE_TO: null, MOVE_REFUSED: refused},
        }});
        let meta = &claim.metadata;
        let namespace = meta.namespace.as_deref().unwrap_or_default();
        let name = meta.name.as_deref().unwrap_or_default();
        let claims = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace);
        if let Err(err) = claims
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            warn!(claim = %named, error = %err, "moves: could not take a refused request off");
        }
        let regarding = events::claim(namespace, name, meta.uid.as_deref());
        let said = Said {
            kind: Kind::Warning,
            reason: "MoveRefused",
            action: "Move",
            note: format!("not moved to node {to}: {refused}"),
        };
        self.recorder.record(regarding, said).await;
    }

    /// Takes the move kept on `old` forward, a step at a time, until it waits.
    async fn advance(&self, old: &PersistentVolume) {
        let name = old.metadata.name.as_deref().unwrap_or_default();
        let ours = (old.spec.as_ref())
            .and_then(|s| s.csi.as_ref())
            .is_some_and(|c| c.driver == self.settings.driver);
        let state = match MoveState::on(old.metadata.annotations.as_ref()) {
            Some(Ok(state)) if ours => state,
            Some(Err(why)) if ours => {
                warn!(
                    pv = name,
                    why, "moves: a move's state cannot be read; left alone"
                );
                return;
            }
            _ => return,
        };
        let writer = Writer {
            client: &self.client,
            old_pv: name,
        };
        let mut state = state;
        for _ in 0..STEPS_PER_ROUND {
            let seen = match observe::observe(&self.client, name, state.clone()).await {
                Ok(seen) => seen,
                Err(err) => {
                    warn!(pv = name, error = %err, "moves: reading a move's objects failed; next round");
                    return;
                }
            };
            let step = decide::next(&seen);
            let waits = waits(&step);
            match self.take(&writer, old, seen, &step).await {
                Ok(Some(next)) if !waits => state = next,
                Ok(_) => return,
                Err(err) => {
                    warn!(pv = name, step = ?step, error = %err, "moves: a step failed; next round");
                    return;
                }
            }
        }
    }
}

/// Whether `step` waits for someone else (the round ends for this move).
fn waits(step: &Step) -> bool {
    matches!(
        step,
        Step::WaitForPods(_)
            | Step::WaitForNewVolume
            | Step::WaitForClaimGone
            | Step::WaitForCopy
            | Step::WaitBeforeRetry { .. }
            | Step::WaitForBinding
            | Step::Stuck(_)
            | Step::Finish
    )
}

/// Runs rounds until `shutdown`.
pub async fn run(mover: Mover, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        if let Err(err) = mover.round().await {
            warn!(error = %err, "moves: listing requests and moves failed; next round");
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(ROUND) => {}
        }
    }
}

/// The loop, where the configuration asks for it.
pub async fn start(inputs: &Inputs<'_>, shutdown: Shutdown) -> Result<Option<Loop>, kube::Error> {
    let config = inputs.config;
    let Some(namespace) = config.moves.clone() else {
        return Ok(None);
    };
    let client = client::make(Retries::On).await?;
    info!("moves starting");
    let settings = Settings {
        driver: config.driver_name.clone(),
        topology_key: config.topology_key(),
        namespace,
    };
    let mover = Mover::new(client, settings, config.node_id.clone());
    // A round cut by the stop is taken again by the next start: nothing to wait for.
    let run = run(mover, shutdown.wait());
    Ok(Some(Loop::new("moves", Duration::ZERO, run)))
}
