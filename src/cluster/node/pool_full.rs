//! Thin block and image volumes on a full pool (`volume::starved`): each gets a Warning Event on
//! its claim when its pool fills ("PoolFull"), and a Normal one when the pool has room again
//! ("PoolSpaceBack"), so the claim's owner sees in `kubectl describe pvc` why the pod's writes
//! failed, beside the volume's abnormal condition, the `stickyvol_pool_starved_volumes` metric
//! and the StickyvolPoolFilesystemFull alert.
//!
//! A look every `LOOK_EVERY` costs one statvfs per pool while no pool is full. The Kubernetes
//! client is made at the first starved volume: a node whose pools never fill never talks to the
//! API server for this. The node's ServiceAccount already has what this needs: `get` on
//! persistentvolumeclaims (the claim's uid) and `create` on events.k8s.io events.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::cluster::kit::client::{self, Retries};
use crate::cluster::kit::events::{Kind, Recorder, Said};
use crate::cluster::kit::task::{Inputs, Loop, Shutdown};
use crate::volume::Volumes;
use crate::volume::starved::Starved;
use crate::volume::state::id::VolumeId;

/// Who writes these Events.
pub const REPORTING_CONTROLLER: &str = "stickyvol.csi.io/pool-full";
/// How soon a pool that fills is told on the claims of the volumes it starves.
const LOOK_EVERY: Duration = Duration::from_secs(10);

/// The check, where this instance has volumes.
pub async fn start(inputs: &Inputs<'_>, shutdown: Shutdown) -> Result<Option<Loop>, kube::Error> {
    let Some(volumes) = inputs.volumes else {
        return Ok(None);
    };
    let run = watch(volumes.clone(), inputs.config.node_id.clone(), shutdown);
    Ok(Some(Loop::new("pool-full check", Duration::ZERO, run)))
}

async fn watch(volumes: Arc<Volumes>, node: String, shutdown: Shutdown) {
    let mut told = Told::default();
    let mut recorder = Lazy::Unmade;
    let stopped = shutdown.wait();
    tokio::pin!(stopped);
    loop {
        let look = volumes.clone();
        let starved = tokio::task::spawn_blocking(move || look.starved())
            .await
            .unwrap_or_default();
        for (volume, said) in told.changes(starved) {
            announce(&mut recorder, &node, &volume, said).await;
        }
        tokio::select! {
            _ = &mut stopped => return,
            _ = tokio::time::sleep(LOOK_EVERY) => {}
        }
    }
}

/// The volumes told of their pool being full, until it has room again.
#[derive(Debug, Default)]
struct Told {
    starved: BTreeMap<VolumeId, Starved>,
}

impl Told {
    /// The Events this look calls for: a Warning for each newly starved volume, a Normal one for
    /// each that no longer is (its pool has room again, or the volume went).
    fn changes(&mut self, now: Vec<Starved>) -> Vec<(Starved, Said<'static>)> {
        let now: BTreeMap<VolumeId, Starved> = now.into_iter().map(|v| (v.id.clone(), v)).collect();
        let mut said = Vec::new();
        for (id, volume) in &now {
            if !self.starved.contains_key(id) {
                warn!(volume = %id, pool = %volume.pool, "{}", volume.message);
                said.push((volume.clone(), full(volume)));
            }
        }
        for (id, volume) in std::mem::take(&mut self.starved) {
            if !now.contains_key(&id) {
                info!(volume = %id, pool = %volume.pool, "pool has room again for the volume's writes");
                said.push((volume.clone(), room_again(&volume)));
            }
        }
        self.starved = now;
        said
    }
}

fn full(volume: &Starved) -> Said<'static> {
    Said {
        kind: Kind::Warning,
        reason: "PoolFull",
        action: "CheckPoolSpace",
        note: volume.message.clone(),
    }
}

fn room_again(volume: &Starved) -> Said<'static> {
    Said {
        kind: Kind::Normal,
        reason: "PoolSpaceBack",
        action: "CheckPoolSpace",
        note: format!(
            "pool {} has free space again: volume {} can write the rest of its size",
            volume.pool, volume.id
        ),
    }
}

/// The recorder, made at the first Event; never, without a client configuration.
enum Lazy {
    Unmade,
    Made(Recorder),
    Unavailable,
}

async fn announce(recorder: &mut Lazy, node: &str, volume: &Starved, said: Said<'_>) {
    let Some(claim) = &volume.claim else {
        return;
    };
    if let Lazy::Unmade = recorder {
        *recorder = match client::make(Retries::On).await {
            Ok(made) => Lazy::Made(Recorder::new(made, REPORTING_CONTROLLER, node)),
            Err(err) => {
                info!(error = %err, "pool-full check: no Kubernetes client configuration, so no Events on claims");
                Lazy::Unavailable
            }
        };
    }
    let Lazy::Made(recorder) = recorder else {
        return;
    };
    recorder
        .record_on_claim(&claim.namespace, &claim.name, said)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::overflow::ClaimRef;
    use crate::volume::state::id::NodeTag;

    fn starved(id: &VolumeId) -> Starved {
        Starved {
            id: id.clone(),
            pool: "default".into(),
            claim: Some(ClaimRef {
                namespace: "shop".into(),
                name: "data-0".into(),
            }),
            message: format!("the filesystem of pool default is full and volume {id} ..."),
        }
    }

    fn reasons(said: Vec<(Starved, Said<'static>)>) -> Vec<(VolumeId, &'static str)> {
        said.into_iter().map(|(v, s)| (v.id, s.reason)).collect()
    }

    #[test]
    fn a_volume_is_told_once_when_its_pool_fills_and_once_when_it_has_room_again() {
        let tag = NodeTag::of("n1");
        let (a, b) = (VolumeId::generate(&tag), VolumeId::generate(&tag));
        let mut told = Told::default();
        assert_eq!(
            reasons(told.changes(vec![starved(&a)])),
            [(a.clone(), "PoolFull")]
        );
        // Still full: nothing new to say.
        assert!(told.changes(vec![starved(&a)]).is_empty());
        assert_eq!(
            reasons(told.changes(vec![starved(&a), starved(&b)])),
            [(b.clone(), "PoolFull")]
        );
        let back = reasons(told.changes(vec![]));
        assert_eq!(back.len(), 2);
        assert!(
            back.iter().all(|(_, reason)| *reason == "PoolSpaceBack"),
            "{back:?}"
        );
        assert!(told.changes(vec![]).is_empty());
    }
}
