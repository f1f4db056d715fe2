//! The loop: watches claims (no store: each event is looked at and dropped; the first list comes
//! in pages), and looks again at those waiting (a refusal, a source not resolved yet, an API
//! error) once a second for those due. A placement writes the selected node at the resourceVersion the rules read, so a claim
//! that changed meanwhile (the scheduler or the provisioner wrote it) is never overwritten: its
//! new version comes through the watch and is looked at afresh. That also makes a second
//! replica harmless. Memory holds only restore claims not yet bound.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{info, warn};

use super::rules::{self, Facts, Location, Refusal, Verdict};
use super::source::{Candidate, Locator};
use crate::cluster::kit::client::{self, Retries};
use crate::cluster::kit::events::{self, Kind, Recorder, Said};
use crate::cluster::kit::names::SELECTED_NODE;
use crate::cluster::kit::task::{Inputs, Loop, Shutdown};
use crate::metrics::Metrics;

/// Who writes our Events.
pub const REPORTING_CONTROLLER: &str = "stickyvol.csi.io/restore-placement";

/// How soon a waiting claim is looked at again: 5 s, doubling with each look that finds it
/// still waiting, up to a minute. Each look costs a few API calls, and a tenant can make many
/// claims that wait (pods that exclude the source's node): the API server must not pay for
/// them every 5 s.
const LOOK_AGAIN: Duration = Duration::from_secs(5);
const MOST_BETWEEN_LOOKS: Duration = Duration::from_secs(60);
/// A claim placed before and found elsewhere (its node's provisioner gave it back: a full
/// pool) is placed again after 5 s, doubling each time up to this.
const MOST_BETWEEN_PLACEMENTS: Duration = Duration::from_secs(300);

#[derive(Debug, Clone)]
pub struct Settings {
    pub driver: String,
    pub topology_key: String,
    /// This replica's name, in its Events.
    pub identity: String,
}

/// A claim placed before: how often, and when it may be placed again.
struct Placed {
    times: u32,
    not_before: Instant,
}

type ClaimKey = (String, String);

struct Placer {
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    locator: Locator,
    /// Claims to look at again, and when.
    later: BTreeMap<ClaimKey, Instant>,
    /// By claim uid: the refusal last announced (announced once while it stays the same).
    announced: HashMap<String, Refusal>,
    /// By claim uid: how many looks in a row found it waiting.
    waited: HashMap<String, u32>,
    placed: HashMap<String, Placed>,
}

/// Runs until `shutdown`.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) {
    let claims = Api::<PersistentVolumeClaim>::all(client.clone());
    // The first list paged (500 a page) and consistent: with `any_semantic` the watch cache
    // answers it whole, whatever the limit (kubernetes/kubernetes#70735), some 75 MB at 50,000
    // claims, past the controller's memory limit.
    let mut events = watcher(claims, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut placer = Placer {
        locator: Locator::new(
            client.clone(),
            settings.driver.clone(),
            settings.topology_key.clone(),
        ),
        client,
        settings,
        metrics,
        later: BTreeMap::new(),
        announced: HashMap::new(),
        waited: HashMap::new(),
        placed: HashMap::new(),
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(claim) | watcher::Event::InitApply(claim))) => {
                    placer.look(&claim).await;
                }
                Some(Ok(watcher::Event::Delete(claim))) => placer.forget(&claim),
                Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => {}
                Some(Err(err)) => warn!(error = %err, "restore placement: watching claims failed; retrying"),
                None => break,
            },
            _ = tick.tick() => placer.look_again().await,
        }
    }
}

fn key(claim: &PersistentVolumeClaim) -> ClaimKey {
    (
        claim.metadata.namespace.clone().unwrap_or_default(),
        claim.metadata.name.clone().unwrap_or_default(),
    )
}

impl Placer {
    fn forget(&mut self, claim: &PersistentVolumeClaim) {
        self.later.remove(&key(claim));
        if let Some(uid) = &claim.metadata.uid {
            self.announced.remove(uid);
            self.waited.remove(uid);
            self.placed.remove(uid);
        }
    }

    async fn look_again(&mut self) {
        let now = Instant::now();
        let due: Vec<ClaimKey> = self
            .later
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for (namespace, name) in due {
            self.later.remove(&(namespace.clone(), name.clone()));
            let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &namespace);
            match api.get_opt(&name).await {
                Ok(Some(claim)) => self.look(&claim).await,
                Ok(None) => {}
                Err(err) => {
                    warn!(claim = %format!("{namespace}/{name}"), error = %err, "restore placement: cannot read the claim; looking again");
                    self.later.insert((namespace, name), now + LOOK_AGAIN);
                }
            }
        }
    }

    async fn look(&mut self, claim: &PersistentVolumeClaim) {
        let Some(candidate) = Candidate::of(claim) else {
            self.forget(claim);
            return;
        };
        match self.verdict(&candidate).await {
            Ok(Verdict::Leave) => {
                self.later.remove(&key(claim));
                self.announced.remove(&candidate.uid);
                self.waited.remove(&candidate.uid);
            }
            Ok(Verdict::Wait(why)) => {
                info!(claim = %format!("{}/{}", candidate.namespace, candidate.name), why = %why, "restore placement: waiting");
                self.wait(&candidate);
            }
            Ok(Verdict::Refuse { reason, message }) => {
                self.refuse(&candidate, reason, message).await
            }
            Ok(Verdict::Place { node }) => self.place(&candidate, &node).await,
            Err(err) => {
                self.metrics.observe_restore_placement("failed");
                warn!(claim = %format!("{}/{}", candidate.namespace, candidate.name), error = %err, "restore placement: reading the claim's source failed; looking again");
                self.wait(&candidate);
            }
        }
    }

    /// Looks at a waiting claim again, later each time it is still waiting.
    fn wait(&mut self, claim: &Candidate) {
        let looks = self.waited.entry(claim.uid.clone()).or_insert(0);
        let after = (LOOK_AGAIN * 2u32.saturating_pow(*looks)).min(MOST_BETWEEN_LOOKS);
        *looks = looks.saturating_add(1);
        self.look_later(claim, after);
    }

    fn look_later(&mut self, claim: &Candidate, after: Duration) {
        self.later.insert(
            (claim.namespace.clone(), claim.name.clone()),
            Instant::now() + after,
        );
    }

    /// Reads what the rules need, the pods only when all else says "place".
    async fn verdict(&mut self, claim: &Candidate) -> Result<Verdict, kube::Error> {
        if !self.locator.class_is_ours(&claim.class).await? {
            return Ok(Verdict::Leave);
        }
        let location = self.locator.locate(claim).await?;
        let node = match &location {
            Location::Node(name) => self.locator.node(name).await?,
            _ => None,
        };
        let source = claim.source.describe();
        let mut facts = Facts {
            source: &source,
            selected_node: claim.selected_node.as_deref(),
            location: &location,
            node: node.as_ref(),
            excluding_pods: &[],
        };
        let verdict = rules::decide(&facts);
        let (Verdict::Place { .. }, Some(node)) = (&verdict, &node) else {
            return Ok(verdict);
        };
        let excluding = self.locator.excluding_pods(claim, node).await?;
        facts.excluding_pods = &excluding;
        Ok(rules::decide(&facts))
    }

    async fn refuse(&mut self, claim: &Candidate, reason: Refusal, message: String) {
        self.wait(claim);
        if self.announced.get(&claim.uid) == Some(&reason) {
            return;
        }
        self.metrics.observe_restore_placement("refused");
        warn!(claim = %format!("{}/{}", claim.namespace, claim.name), reason = reason.as_str(), message = %message, "restore placement: not placed");
        self.event(claim, Kind::Warning, reason.as_str(), message)
            .await;
        self.announced.insert(claim.uid.clone(), reason);
    }

    async fn place(&mut self, claim: &Candidate, node: &str) {
        let before = self.placed.get(&claim.uid).map(|p| (p.times, p.not_before));
        if let Some((_, not_before)) = before
            && Instant::now() < not_before
        {
            self.look_later(claim, not_before - Instant::now());
            return;
        }
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": claim.resource_version,
            "annotations": {SELECTED_NODE: node},
        }});
        let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &claim.namespace);
        match api
            .patch(&claim.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            // Changed meanwhile: its new version comes through the watch. Gone: nothing to do.
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => return,
            Err(err) => {
                self.metrics.observe_restore_placement("failed");
                warn!(claim = %format!("{}/{}", claim.namespace, claim.name), error = %err, "restore placement: could not set the claim's node; looking again");
                self.wait(claim);
                return;
            }
        }
        self.metrics.observe_restore_placement("placed");
        self.announced.remove(&claim.uid);
        self.waited.remove(&claim.uid);
        let times = before.map_or(0, |(t, _)| t);
        let wait = (LOOK_AGAIN * 2u32.saturating_pow(times)).min(MOST_BETWEEN_PLACEMENTS);
        self.placed.insert(
            claim.uid.clone(),
            Placed {
                times: times + 1,
                not_before: Instant::now() + wait,
            },
        );
        let chosen = match &claim.selected_node {
            Some(other) => format!("the scheduler had chosen {other}"),
            None => "before the scheduler chose a node".into(),
        };
        let source = claim.source.describe();
        info!(claim = %format!("{}/{}", claim.namespace, claim.name), node, source = %source, times = times + 1, "restore placement: placed on the source's node");
        let (kind, reason, note) = if times == 0 {
            let note = format!(
                "{source}'s data is on node {node}: the claim is provisioned there ({chosen})"
            );
            (Kind::Normal, "PlacedOnSourceNode", note)
        } else {
            let note = format!(
                "{source}'s data is on node {node}, whose provisioner gave the claim back (see its ProvisioningFailed events): placed there again, attempt {}",
                times + 1
            );
            (Kind::Warning, "PlacedOnSourceNodeAgain", note)
        };
        self.event(claim, kind, reason, note).await;
    }

    async fn event(&self, claim: &Candidate, kind: Kind, reason: &str, note: String) {
        let recorder = Recorder::new(
            self.client.clone(),
            REPORTING_CONTROLLER,
            &self.settings.identity,
        );
        let regarding = events::claim(&claim.namespace, &claim.name, Some(&claim.uid));
        let said = Said {
            kind,
            reason,
            action: "Place",
            note,
        };
        recorder.record(regarding, said).await;
    }
}

/// Restore placement, where the configuration asks for it. Stateless: a look cut short by the
/// stop is done again by the next start's watch, so the stop does not wait for it.
pub async fn start(inputs: &Inputs<'_>, shutdown: Shutdown) -> Result<Option<Loop>, kube::Error> {
    let config = inputs.config;
    if !config.restore_placement {
        return Ok(None);
    }
    let client = client::make(Retries::On).await?;
    let settings = Settings {
        driver: config.driver_name.clone(),
        topology_key: config.topology_key(),
        identity: config.node_id.clone(),
    };
    info!("restore placement starting");
    let run = run(client, settings, inputs.metrics.clone(), shutdown.wait());
    Ok(Some(Loop::new("restore placement", Duration::ZERO, run)))
}

#[cfg(test)]
mod tests {
    //! `look` against a fake API server: objects by path, a merge PATCH that honours the
    //! resourceVersion it carries (409 on a stale one), and every write logged.
    use super::*;
    use std::sync::Mutex;

    use serde_json::{Value, json};

    use crate::cluster::kit::fake_api::{self, Answer, respond, status};

    use crate::volume::state::id::{NodeTag, SnapshotId};

    const DRIVER: &str = "stickyvol.csi.io";
    const KEY: &str = "topology.stickyvol.csi.io/node";
    const CLAIMS: &str = "/api/v1/namespaces/ns/persistentvolumeclaims";

    #[derive(Default)]
    struct Store {
        /// Object path (or collection path, for lists) → the object (or its items).
        objects: HashMap<String, Value>,
        patches: Vec<Value>,
        events: Vec<Value>,
    }
    type Shared = Arc<Mutex<Store>>;

    fn missing() -> Answer {
        respond(404, &status(404, "NotFound"))
    }

    fn handle(store: &Shared, method: &str, path: &str, body: &[u8]) -> Answer {
        let mut store = store.lock().unwrap();
        let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        match method {
            "GET" => match store.objects.get(path) {
                Some(obj) if obj.is_array() => respond(
                    200,
                    &json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": obj}),
                ),
                Some(obj) => respond(200, obj),
                None => missing(),
            },
            "PATCH" => {
                store.patches.push(body.clone());
                let Some(current) = store.objects.get_mut(path) else {
                    return missing();
                };
                if body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
                    return respond(
                        409,
                        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409}),
                    );
                }
                for (k, v) in body["metadata"]["annotations"].as_object().unwrap() {
                    current["metadata"]["annotations"][k] = v.clone();
                }
                respond(200, current)
            }
            "POST" if path.ends_with("/events") => {
                store.events.push(body.clone());
                respond(201, &body)
            }
            _ => respond(405, &json!({})),
        }
    }

    fn placer_on(store: &Shared) -> Placer {
        let shared = store.clone();
        let client =
            fake_api::client(move |method, path, body| handle(&shared, method, path, body));
        Placer {
            locator: Locator::new(client.clone(), DRIVER.into(), KEY.into()),
            client,
            settings: Settings {
                driver: DRIVER.into(),
                topology_key: KEY.into(),
                identity: "controller-0".into(),
            },
            metrics: Arc::new(Metrics::new()),
            later: BTreeMap::new(),
            announced: HashMap::new(),
            waited: HashMap::new(),
            placed: HashMap::new(),
        }
    }

    fn put(store: &Shared, path: &str, obj: Value) {
        store.lock().unwrap().objects.insert(path.into(), obj);
    }

    /// Class `sv` of ours; snapshot `snap` (content `c1`, its handle issued on node `n1`, and
    /// labelled with it); nodes `n0` and `n1` Ready; claim `restore` from `snap`, with `selected`
    /// as its selected node; no pods.
    fn cluster(selected: Option<&str>) -> Shared {
        let store = Shared::default();
        put(
            &store,
            "/apis/storage.k8s.io/v1/storageclasses/sv",
            json!({"metadata": {"name": "sv"}, "provisioner": DRIVER}),
        );
        put(
            &store,
            "/apis/snapshot.storage.k8s.io/v1/namespaces/ns/volumesnapshots/snap",
            json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                   "metadata": {"name": "snap", "namespace": "ns"},
                   "status": {"boundVolumeSnapshotContentName": "c1"}}),
        );
        put(
            &store,
            "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents/c1",
            content_of("n1", "n1"),
        );
        put(&store, "/api/v1/nodes/n0", node("n0", json!({})));
        put(&store, "/api/v1/nodes/n1", node("n1", json!({})));
        put(
            &store,
            "/api/v1/nodes",
            json!([{"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": {"name": "n0"}},
                   {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": {"name": "n1"}}]),
        );
        put(&store, "/api/v1/namespaces/ns/pods", json!([]));
        let mut annotations = json!({});
        if let Some(n) = selected {
            annotations[SELECTED_NODE] = json!(n);
        }
        put(
            &store,
            &format!("{CLAIMS}/restore"),
            json!({"metadata": {"name": "restore", "namespace": "ns", "uid": "u-restore",
                                "resourceVersion": "5", "annotations": annotations},
                   "spec": {"storageClassName": "sv", "dataSource": {
                       "apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap"}}}),
        );
        store
    }

    /// Content `c1`: its handle issued on node `issued_on`, labelled managed-by `labelled`.
    fn content_of(issued_on: &str, labelled: &str) -> Value {
        let handle = SnapshotId::generate(&NodeTag::of(issued_on)).to_string();
        json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
               "metadata": {"name": "c1", "labels": {"snapshot.storage.kubernetes.io/managed-by": labelled}},
               "spec": {"driver": DRIVER}, "status": {"snapshotHandle": handle}})
    }

    fn node(name: &str, spec: Value) -> Value {
        json!({"metadata": {"name": name}, "spec": spec,
               "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    }

    fn claim(store: &Shared, name: &str) -> PersistentVolumeClaim {
        let s = store.lock().unwrap();
        serde_json::from_value(s.objects[&format!("{CLAIMS}/{name}")].clone()).unwrap()
    }

    fn selected(store: &Shared, name: &str) -> Option<String> {
        claim(store, name)
            .metadata
            .annotations
            .and_then(|a| a.get(SELECTED_NODE).cloned())
    }

    fn reasons(store: &Shared) -> Vec<String> {
        let s = store.lock().unwrap();
        s.events
            .iter()
            .map(|e| e["reason"].as_str().unwrap().to_string())
            .collect()
    }

    #[tokio::test]
    async fn a_restore_is_sent_to_its_snapshots_node_with_an_event() {
        for chosen in [None, Some("n2")] {
            let store = cluster(chosen);
            let mut placer = placer_on(&store);
            placer.look(&claim(&store, "restore")).await;
            assert_eq!(selected(&store, "restore").as_deref(), Some("n1"));
            assert_eq!(reasons(&store), ["PlacedOnSourceNode"]);
            let patch = store.lock().unwrap().patches[0].clone();
            assert_eq!(patch["metadata"]["resourceVersion"], "5", "{patch}");
            // Seen again on its node: nothing more.
            placer.look(&claim(&store, "restore")).await;
            assert_eq!(store.lock().unwrap().patches.len(), 1);
        }
    }

    #[tokio::test]
    async fn a_claim_changed_since_it_was_read_is_not_overwritten() {
        let store = cluster(None);
        let mut placer = placer_on(&store);
        let stale = claim(&store, "restore");
        store
            .lock()
            .unwrap()
            .objects
            .get_mut(&format!("{CLAIMS}/restore"))
            .unwrap()["metadata"]["resourceVersion"] = json!("6");
        placer.look(&stale).await;
        assert_eq!(selected(&store, "restore"), None);
        assert!(reasons(&store).is_empty());
    }

    #[tokio::test]
    async fn a_cordoned_node_is_refused_once_and_looked_at_again() {
        let store = cluster(Some("n2"));
        put(
            &store,
            "/api/v1/nodes/n1",
            node("n1", json!({"unschedulable": true})),
        );
        let mut placer = placer_on(&store);
        placer.look(&claim(&store, "restore")).await;
        placer.look(&claim(&store, "restore")).await;
        assert_eq!(selected(&store, "restore").as_deref(), Some("n2"));
        assert_eq!(reasons(&store), ["SourceNodeCordoned"]);
        // Looked at again, later each time: 5 s, then 10 s.
        let due = placer.later[&("ns".to_string(), "restore".to_string())];
        assert!(
            due > Instant::now() + Duration::from_secs(8),
            "the second wait doubles"
        );
        assert_eq!(placer.waited["u-restore"], 2);
        // Uncordoned: placed at the next look.
        put(&store, "/api/v1/nodes/n1", node("n1", json!({})));
        placer.look(&claim(&store, "restore")).await;
        assert_eq!(selected(&store, "restore").as_deref(), Some("n1"));
    }

    #[tokio::test]
    async fn a_gone_node_and_an_excluding_pod_are_refused_with_nothing_placed() {
        let store = cluster(None);
        store.lock().unwrap().objects.remove("/api/v1/nodes/n1");
        let mut placer = placer_on(&store);
        placer.look(&claim(&store, "restore")).await;
        assert_eq!(reasons(&store), ["SourceNodeGone"]);

        let store = cluster(None);
        put(
            &store,
            "/api/v1/namespaces/ns/pods",
            json!([{"metadata": {"name": "web"},
                    "spec": {"nodeSelector": {"disk": "ssd"},
                             "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "restore"}}]},
                    "status": {"phase": "Pending"}}]),
        );
        let mut placer = placer_on(&store);
        placer.look(&claim(&store, "restore")).await;
        assert_eq!(selected(&store, "restore"), None);
        assert_eq!(reasons(&store), ["PodExcludesSourceNode"]);
        let note = store.lock().unwrap().events[0]["note"].to_string();
        assert!(note.contains("web") && note.contains("disk=ssd"), "{note}");
    }

    /// `cluster`, with n1's content stripped of its node label: only its handle says where.
    fn unlabelled() -> Shared {
        let store = cluster(None);
        let mut content = content_of("n1", "n1");
        content["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("labels");
        put(
            &store,
            "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents/c1",
            content,
        );
        store
    }

    #[tokio::test]
    async fn an_unlabelled_content_is_found_by_the_node_tag_of_its_handle() {
        let store = unlabelled();
        let mut placer = placer_on(&store);
        placer.look(&claim(&store, "restore")).await;
        assert_eq!(selected(&store, "restore").as_deref(), Some("n1"));
    }

    /// A restarted controller never saw the node: its tag names no Node, and the restore is
    /// refused as from a gone node (it once asked the API for "nodes/with id tag …" instead).
    #[tokio::test]
    async fn an_unlabelled_content_of_a_node_gone_before_the_controller_started_is_refused() {
        let store = unlabelled();
        store.lock().unwrap().objects.remove("/api/v1/nodes/n1");
        put(
            &store,
            "/api/v1/nodes",
            json!([{"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": {"name": "n0"}}]),
        );
        let mut placer = placer_on(&store);
        placer.look(&claim(&store, "restore")).await;
        assert_eq!(selected(&store, "restore"), None);
        assert_eq!(reasons(&store), ["SourceNodeGone"]);
    }

    #[tokio::test]
    async fn a_content_relabelled_by_another_node_does_not_pull_its_restore() {
        let store = cluster(None);
        // n0's plugin rewrote the label of n1's content: the handle n1 issued still says n1.
        put(
            &store,
            "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents/c1",
            content_of("n1", "n0"),
        );
        let mut placer = placer_on(&store);
        placer.look(&claim(&store, "restore")).await;
        assert_eq!(selected(&store, "restore").as_deref(), Some("n1"));
    }

    #[tokio::test]
    async fn a_clone_goes_to_its_source_pvs_node_and_other_classes_are_left_alone() {
        let store = cluster(None);
        put(
            &store,
            &format!("{CLAIMS}/db"),
            json!({"metadata": {"name": "db", "namespace": "ns"}, "spec": {"volumeName": "pv-db"}}),
        );
        put(
            &store,
            "/api/v1/persistentvolumes/pv-db",
            json!({"metadata": {"name": "pv-db"}, "spec": {
                "csi": {"driver": DRIVER, "volumeHandle": "sv-1"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": KEY, "operator": "In", "values": ["n1"]}]}]}}}}),
        );
        put(
            &store,
            &format!("{CLAIMS}/copy"),
            json!({"metadata": {"name": "copy", "namespace": "ns", "uid": "u-copy", "resourceVersion": "9"},
                   "spec": {"storageClassName": "sv",
                            "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "db"}}}),
        );
        put(
            &store,
            &format!("{CLAIMS}/foreign"),
            json!({"metadata": {"name": "foreign", "namespace": "ns", "uid": "u-f", "resourceVersion": "3"},
                   "spec": {"storageClassName": "other",
                            "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "db"}}}),
        );
        let mut placer = placer_on(&store);
        placer.look(&claim(&store, "copy")).await;
        placer.look(&claim(&store, "foreign")).await;
        assert_eq!(selected(&store, "copy").as_deref(), Some("n1"));
        assert_eq!(selected(&store, "foreign"), None);
        assert_eq!(store.lock().unwrap().patches.len(), 1);
    }
}
