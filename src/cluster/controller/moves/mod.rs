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
use crate::cluster::kit::names::{MOVE_FROM_DISK, MOVE_TO};
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
        let annotations = claim.metadata.annotations.clone().unwrap_or_default();
        let to = annotations.get(MOVE_TO).cloned().unwrap_or_default();
        let disk = annotations.get(MOVE_FROM_DISK).map(String::as_str);
        let asked = (to.as_str(), disk);
        let refused = match accept::check(&self.client, &self.settings, claim, asked).await {
            Ok(Checked::Started(_)) => return,
            Ok(Checked::May { pv, from }) => {
                match accept::start(&self.client, claim, &pv, (&from, &to, disk)).await {
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
            Err(refusal) if !refusal.lasting => {
                warn!(claim = %named, why = %refusal, "moves: a request's checks could not read the API; next round");
                return;
            }
            Err(refusal) => refusal.why,
        };
        warn!(claim = %named, why = %refused, "moves: request refused");
        let patch = json!({"metadata": {
            "labels": {MOVE_REQUESTED: null},
            "annotations": {MOVE_TO: null, MOVE_FROM_DISK: null, MOVE_REFUSED: refused},
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use serde_json::{Value, json};

    use crate::cluster::kit::fake_api::{self, Answer, respond, status};

    const DRIVER: &str = "stickyvol.csi.io";
    const KEY: &str = "topology.stickyvol.csi.io/node";

    /// Objects by path; every write, as (method, path, body); paths that answer 500.
    #[derive(Default)]
    struct Cluster {
        objects: BTreeMap<String, Value>,
        writes: Vec<(String, String, Value)>,
        broken: Vec<String>,
    }
    type Shared = Arc<Mutex<Cluster>>;

    /// RFC 7386, as the API server applies a merge patch.
    fn merge(target: &mut Value, patch: &Value) {
        let (Some(target_map), Some(patch_map)) = (target.as_object_mut(), patch.as_object())
        else {
            *target = patch.clone();
            return;
        };
        for (key, value) in patch_map {
            if value.is_null() {
                target_map.remove(key);
            } else {
                merge(target_map.entry(key.clone()).or_insert(json!({})), value);
            }
        }
    }

    fn handle(cluster: &Shared, method: &str, path: &str, body: &[u8]) -> Answer {
        let mut cluster = cluster.lock().unwrap();
        if cluster.broken.iter().any(|p| p == path) {
            return respond(500, &status(500, "InternalError"));
        }
        let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        if method != "GET" {
            cluster
                .writes
                .push((method.into(), path.into(), body.clone()));
        }
        match method {
            "GET" => match cluster.objects.get(path) {
                Some(object) => respond(200, object),
                // A collection: its items (the fake ignores label selectors).
                None if path.ends_with('s') => {
                    let prefix = format!("{path}/");
                    let items: Vec<&Value> = (cluster.objects.iter())
                        .filter(|(p, _)| p.starts_with(&prefix) && !p[prefix.len()..].contains('/'))
                        .map(|(_, o)| o)
                        .collect();
                    respond(200, &json!({"metadata": {}, "items": items}))
                }
                None => respond(404, &status(404, "NotFound")),
            },
            "PATCH" => match cluster.objects.get_mut(path) {
                Some(object) => {
                    merge(object, &body);
                    let object = object.clone();
                    respond(200, &object)
                }
                None => respond(404, &status(404, "NotFound")),
            },
            "POST" => respond(201, &body),
            _ => respond(405, &json!({})),
        }
    }

    /// Claim shop/data bound to pvc-old on node a, asking to go to `to`; nodes a and b, both
    /// serving transfers.
    fn cluster(to: &str) -> Shared {
        let cluster = Shared::default();
        let mut c = cluster.lock().unwrap();
        c.objects.insert(
            "/api/v1/namespaces/shop/persistentvolumeclaims/data".into(),
            json!({"metadata": {"name": "data", "namespace": "shop", "uid": "claim-uid",
                                "labels": {MOVE_REQUESTED: "true"}, "annotations": {MOVE_TO: to}},
                   "spec": {"volumeName": "pvc-old", "storageClassName": "stickyvol"},
                   "status": {"phase": "Bound"}}),
        );
        c.objects.insert(
            "/api/v1/persistentvolumes/pvc-old".into(),
            json!({"metadata": {"name": "pvc-old", "resourceVersion": "7"},
                   "spec": {"csi": {"driver": DRIVER, "volumeHandle": "sv-old"},
                            "persistentVolumeReclaimPolicy": "Delete",
                            "capacity": {"storage": "1Gi"}, "storageClassName": "stickyvol",
                            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                                {"key": KEY, "operator": "In", "values": ["a"]}]}]}}}}),
        );
        for node in ["a", "b"] {
            c.objects.insert(
                format!("/api/v1/nodes/{node}"),
                json!({"metadata": {"name": node}}),
            );
            let advert = format!("{DRIVER}-transfer-{node}");
            c.objects.insert(
                format!("/api/v1/namespaces/stickyvol/configmaps/{advert}"),
                json!({"metadata": {"name": advert}}),
            );
        }
        drop(c);
        cluster
    }

    fn mover(cluster: &Shared) -> Mover {
        let shared = cluster.clone();
        let client = fake_api::client(move |m, p, b| handle(&shared, m, p, b));
        let settings = Settings {
            driver: DRIVER.into(),
            topology_key: KEY.into(),
            namespace: "stickyvol".into(),
        };
        Mover::new(client, settings, "controller-0".into())
    }

    fn claim(cluster: &Shared) -> PersistentVolumeClaim {
        let c = cluster.lock().unwrap();
        let path = "/api/v1/namespaces/shop/persistentvolumeclaims/data";
        serde_json::from_value(c.objects[path].clone()).unwrap()
    }

    fn events(cluster: &Shared) -> Vec<String> {
        let c = cluster.lock().unwrap();
        (c.writes.iter())
            .filter(|(_, path, _)| path.ends_with("/events"))
            .map(|(_, _, body)| body["reason"].as_str().unwrap_or("").to_string())
            .collect()
    }

    #[tokio::test]
    async fn a_request_that_passes_the_checks_starts_by_keeping_the_old_pv() {
        let cluster = cluster("b");
        mover(&cluster).request(&claim(&cluster)).await;
        let c = cluster.lock().unwrap();
        let pv = &c.objects["/api/v1/persistentvolumes/pvc-old"];
        assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        assert_eq!(pv["metadata"]["labels"][MOVING], "true");
        let state: MoveState = serde_json::from_str(
            pv["metadata"]["annotations"][state::MOVE_STATE]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!((state.from.as_str(), state.to.as_str()), ("a", "b"));
        assert_eq!(state.reclaim_policy, "Delete");
        assert_eq!(state.claim.uid, "claim-uid");
        // Retain and the state in one write, conditional on the PV read.
        let (_, _, patch) = (c.writes.iter())
            .find(|(m, p, _)| m == "PATCH" && p.ends_with("/pvc-old"))
            .unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        drop(c);
        assert_eq!(events(&cluster), ["MoveStarted"]);
    }

    #[tokio::test]
    async fn a_request_that_cannot_be_done_is_taken_off_with_why() {
        let cluster = cluster("c");
        mover(&cluster).request(&claim(&cluster)).await;
        let after = claim(&cluster);
        let labels = after.metadata.labels.unwrap_or_default();
        let annotations = after.metadata.annotations.unwrap_or_default();
        assert!(!labels.contains_key(MOVE_REQUESTED));
        assert!(!annotations.contains_key(MOVE_TO));
        assert_eq!(annotations[MOVE_REFUSED], "there is no node c");
        let c = cluster.lock().unwrap();
        let pv = &c.objects["/api/v1/persistentvolumes/pvc-old"];
        assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Delete");
        drop(c);
        assert_eq!(events(&cluster), ["MoveRefused"]);
    }

    #[tokio::test]
    async fn a_move_from_a_dead_nodes_disk_needs_no_source_plugin_and_names_the_disk() {
        let c1 = cluster("b");
        let source_gone = |c: &Shared| {
            let mut c = c.lock().unwrap();
            c.objects.remove("/api/v1/nodes/a");
            let advert = format!("/api/v1/namespaces/stickyvol/configmaps/{DRIVER}-transfer-a");
            c.objects.remove(&advert);
        };
        source_gone(&c1);
        // Without a disk the dead source is no source: refused.
        mover(&c1).request(&claim(&c1)).await;
        let refused = claim(&c1).metadata.annotations.unwrap_or_default();
        assert!(refused[MOVE_REFUSED].contains("node a serves no transfers"));

        let c2 = cluster("b");
        source_gone(&c2);
        let path = "/api/v1/namespaces/shop/persistentvolumeclaims/data";
        (c2.lock().unwrap().objects.get_mut(path).unwrap())["metadata"]["annotations"]
            [MOVE_FROM_DISK] = json!("disk-a");
        mover(&c2).request(&claim(&c2)).await;
        let pv = c2.lock().unwrap().objects["/api/v1/persistentvolumes/pvc-old"].clone();
        let state: MoveState = serde_json::from_str(
            pv["metadata"]["annotations"][state::MOVE_STATE]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(state.from_disk.as_deref(), Some("disk-a"));
        assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");

        // A disk name that is a path is refused before anything is read.
        let c3 = cluster("b");
        (c3.lock().unwrap().objects.get_mut(path).unwrap())["metadata"]["annotations"]
            [MOVE_FROM_DISK] = json!("../../etc");
        mover(&c3).request(&claim(&c3)).await;
        let refused = claim(&c3).metadata.annotations.unwrap_or_default();
        assert!(
            refused[MOVE_REFUSED].contains("is not a disk name"),
            "{refused:?}"
        );
        assert!(!refused.contains_key(MOVE_FROM_DISK));
    }

    #[tokio::test]
    async fn a_request_whose_checks_cannot_read_the_api_is_kept_for_the_next_round() {
        let cluster = cluster("b");
        (cluster.lock().unwrap().broken).push("/api/v1/nodes/b".into());
        mover(&cluster).request(&claim(&cluster)).await;
        assert!(cluster.lock().unwrap().writes.is_empty());
        let labels = claim(&cluster).metadata.labels.unwrap_or_default();
        assert_eq!(labels[MOVE_REQUESTED], "true");
    }
}
