//! The node-loss reconciler: while it holds the Lease, it keeps a view of Nodes, our PVs and
//! StorageClasses from watches (`view`, `watch`), and runs a round when a change may change a
//! decision (a node lost or back, a PV of a lost node, a class), again every interval while a
//! round has work left (an action, a pod not yet waiting), and otherwise every few minutes.
//! A round reads again, consistently, each PV on a lost node and the claims, pods and
//! StatefulSets of the namespaces concerned; `decide` says what to do and this carries it out
//! with uid preconditions (an object replaced meanwhile is never deleted), after reading the
//! Node once more, records an Event the first time each decision is made, and counts every
//! action.

use std::collections::{BTreeSet, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use tokio::time::Instant;
use tracing::{info, warn};

use super::decide::{
    self, Action, AttributesClassView, Decision, ObjectRef, Options, PvView, Reason, Snapshot,
};
use super::lease::Election;
use super::view::ClusterView;
use super::{observe, watch};
use crate::cluster::kit::client::{self, Retries};
use crate::cluster::kit::events::{self, Kind, Recorder, Said};
use crate::cluster::kit::names::{OUT_OF_SERVICE_TAINT, PROVISIONER_FINALIZER};
use crate::cluster::kit::release_notice;
use crate::cluster::kit::slim::{self, Pod, StatefulSet};
use crate::cluster::kit::task::{Inputs, Loop, Shutdown};
use crate::metrics::Metrics;
use crate::volume::state::record::now_ms;

/// The Lease the replicas compete for (in their own namespace).
pub const LEASE_NAME: &str = "stickyvol-node-loss";

/// Who writes our Events.
pub const REPORTING_CONTROLLER: &str = "stickyvol.csi.io/node-loss";

/// How long after a change that matters its round runs: a Node's deletion and the changes it
/// brings (its PVs') are looked at in one round.
const SETTLE: Duration = Duration::from_millis(200);

/// With no work left, a round still runs this often (from the view: no request unless a PV
/// sits on a lost node).
pub const RESYNC: Duration = Duration::from_secs(300);

#[derive(Debug, Clone)]
pub struct Settings {
    pub driver: String,
    pub topology_key: String,
    pub dry_run: bool,
    /// Between the Lease's renewals, and between rounds while work is left.
    pub interval: Duration,
    /// The Lease's namespace and name, and this replica's identity in it (its pod name).
    pub lease_namespace: String,
    pub lease_name: String,
    pub identity: String,
}

/// Reads what `decide` needs beyond `view`: each of our PVs on a lost node, read again
/// consistently (the view keeps only their node), and, when there are any, the claims, pods
/// and StatefulSets of their claims' namespaces, read consistently.
pub async fn snapshot(
    client: &Client,
    settings: &Settings,
    view: &ClusterView,
) -> Result<Snapshot, kube::Error> {
    let mut snapshot = Snapshot {
        nodes: view.nodes(),
        classes: view.classes(),
        ..Snapshot::default()
    };
    let pvs = Api::<slim::PersistentVolume>::all(client.clone());
    for name in view.on_lost_nodes() {
        let Some(pv) = pvs.get_opt(&name).await? else {
            continue;
        };
        let pv = observe::pv(&pv, &settings.topology_key);
        if pv.driver == settings.driver && pv.node.as_deref().is_some_and(|n| view.lost(n)) {
            snapshot.pvs.push(pv);
        }
    }
    snapshot.attributes_classes = attributes_classes(client, &snapshot.pvs).await?;
    let namespaces: BTreeSet<String> = snapshot
        .pvs
        .iter()
        .filter_map(|pv| pv.claim.as_ref().map(|c| c.namespace.clone()))
        .collect();
    let all = ListParams::default();
    for ns in &namespaces {
        let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
        let claims = claims.list(&all).await?;
        snapshot.claims.extend(claims.iter().map(observe::claim));
        let pods = Api::<Pod>::namespaced(client.clone(), ns)
            .list(&all)
            .await?;
        snapshot.pods.extend(pods.iter().map(observe::pod));
        let sets = Api::<StatefulSet>::namespaced(client.clone(), ns);
        let sets = sets.list(&all).await?;
        snapshot
            .statefulsets
            .extend(sets.iter().map(observe::statefulset));
    }
    Ok(snapshot)
}

/// The VolumeAttributesClasses `pvs` name, read now. One that is gone (or an API server
/// without them) is none; any other error fails the round rather than fall back to the
/// StorageClass's policy, which the class may have overridden with `keep`.
async fn attributes_classes(
    client: &Client,
    pvs: &[PvView],
) -> Result<Vec<AttributesClassView>, kube::Error> {
    let names: BTreeSet<&String> = pvs
        .iter()
        .filter_map(|pv| pv.attributes_class.as_ref())
        .collect();
    let api = Api::<VolumeAttributesClass>::all(client.clone());
    let mut found = Vec::new();
    for name in names {
        if let Some(class) = api.get_opt(name).await? {
            found.push(observe::attributes_class(&class));
        }
    }
    Ok(found)
}

fn delete_params(uid: &str) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

/// A delete that finds the object gone (or replaced: the uid precondition fails) has nothing
/// left to do.
fn settled<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(err) => Err(err),
    }
}

async fn delete_pods(client: &Client, pods: &[ObjectRef]) -> Result<(), kube::Error> {
    for pod in pods {
        let api = Api::<Pod>::namespaced(client.clone(), &pod.namespace);
        settled(api.delete(&pod.name, &delete_params(&pod.uid)).await)?;
    }
    Ok(())
}

/// Carries one action out. The claim goes first: deleting the pod first would let the
/// StatefulSet recreate it on the same claim.
pub async fn carry_out(client: &Client, action: &Action) -> Result<(), kube::Error> {
    match action {
        Action::Nothing => Ok(()),
        Action::ReleaseClaim { claim, pods } => {
            let api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &claim.namespace);
            settled(api.delete(&claim.name, &delete_params(&claim.uid)).await)?;
            delete_pods(client, pods).await
        }
        Action::DeletePods { pods } => delete_pods(client, pods).await,
        Action::DeletePv { pv } => {
            let api = Api::<slim::PersistentVolume>::all(client.clone());
            settled(api.delete(&pv.name, &delete_params(&pv.uid)).await)?;
            drop_provisioner_finalizer(&api, pv).await
        }
        Action::DropPvFinalizer { pv } => {
            drop_provisioner_finalizer(&Api::<slim::PersistentVolume>::all(client.clone()), pv)
                .await
        }
    }
}

/// Drops the provisioner's finalizer from PV `pv` (that provisioner ran on the deleted node), at
/// the resourceVersion read: after a conflict the PV still holds it, and the next round decides
/// `DropPvFinalizer`. pv-protection's finalizer is Kubernetes' own to remove.
async fn drop_provisioner_finalizer(
    api: &Api<slim::PersistentVolume>,
    pv: &ObjectRef,
) -> Result<(), kube::Error> {
    let Some(current) = api.get_opt(&pv.name).await? else {
        return Ok(());
    };
    if current.metadata.uid.as_deref() != Some(pv.uid.as_str()) {
        return Ok(());
    }
    let held = current.metadata.finalizers.unwrap_or_default();
    if !held.iter().any(|f| f == PROVISIONER_FINALIZER) {
        return Ok(());
    }
    let finalizers: Vec<String> = held
        .into_iter()
        .filter(|f| f != PROVISIONER_FINALIZER)
        .collect();
    let patch = serde_json::json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": current.metadata.resource_version,
        }
    });
    settled(
        api.patch(&pv.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    )
}

/// What the Event for a decision says, and about what: the claim it acts on (or the PV).
fn said(decision: &Decision, pv_uid: &str) -> (ObjectReference, Said<'static>) {
    let (regarding, note_subject) = match &decision.action {
        Action::ReleaseClaim { claim, .. } => (
            events::claim(&claim.namespace, &claim.name, Some(&claim.uid)),
            format!("claim {claim}"),
        ),
        _ => (
            events::cluster_scoped("v1", "PersistentVolume", &decision.pv, Some(pv_uid)),
            format!("PV {}", decision.pv),
        ),
    };
    let reason = match (&decision.action, decision.dry_run) {
        (Action::Nothing, _) => "NodeLossKept",
        (_, true) => "NodeLossDryRun",
        (Action::ReleaseClaim { .. }, false) => "NodeLossReleased",
        (Action::DeletePods { .. }, false) => "NodeLossPodsDeleted",
        (Action::DeletePv { .. } | Action::DropPvFinalizer { .. }, false) => "NodeLossPvDeleted",
    };
    let note = format!(
        "node {} is {} (onNodeLoss: {}): {}: {}{}",
        decision.node,
        decision.loss.as_str(),
        decision.policy,
        note_subject,
        decision.reason,
        if decision.dry_run {
            " (dry run: nothing done)"
        } else {
            ""
        }
    );
    let said = Said {
        kind: if decision.action == Action::Nothing {
            Kind::Normal
        } else {
            Kind::Warning
        },
        reason,
        action: decision.action.kind(),
        note,
    };
    (regarding, said)
}

/// One round: read, decide, act, report. `reported` holds the decisions already announced by
/// an Event, so a decision that stays the same round after round is announced once.
pub async fn round(
    client: &Client,
    settings: &Settings,
    view: &ClusterView,
    metrics: &Metrics,
    reported: &mut HashSet<(String, String, String)>,
) -> Result<Vec<Decision>, kube::Error> {
    let snapshot = snapshot(client, settings, view).await?;
    let decisions = decide::decide(
        &snapshot,
        Options {
            driver: &settings.driver,
            dry_run: settings.dry_run,
        },
    );
    let mut now_reported = HashSet::new();
    for decision in &decisions {
        let key = (
            decision.pv.clone(),
            decision.action.kind().to_string(),
            decision.reason.to_string(),
        );
        let pv_uid = snapshot
            .pvs
            .iter()
            .find(|pv| pv.name == decision.pv)
            .map(|pv| pv.uid.as_str())
            .unwrap_or_default();
        if let Some(action) = decision.to_carry_out() {
            // Just before acting, the node must still be lost: it may have come back since
            // the view last heard of it.
            if still_lost(client, &decision.node).await? {
                let result = match tell_node(client, settings, &decision.node, action).await {
                    Ok(()) => carry_out(client, action).await,
                    Err(err) => Err(err),
                };
                metrics.observe_node_loss(action.kind(), result.is_ok());
                match result {
                    Ok(()) => {
                        info!(pv = %decision.pv, node = %decision.node, action = action.kind(), reason = %decision.reason, "node loss: done")
                    }
                    Err(err) => {
                        warn!(pv = %decision.pv, action = action.kind(), error = %err, "node loss: action failed, retried next round")
                    }
                }
            }
        }
        if !reported.contains(&key) {
            announce(client, settings, metrics, decision, pv_uid).await;
        }
        now_reported.insert(key);
    }
    // Forget decisions no longer made, so one made again is announced again.
    *reported = now_reported;
    Ok(decisions)
}

/// Before a PV of `node` goes: the node's release notice, so that a driver that ran through its
/// node's loss reads its PVs again (`kit::release_notice`). Written first, so that no crash
/// between the two loses it; a notice not written stops the delete until the next round.
async fn tell_node(
    client: &Client,
    settings: &Settings,
    node: &str,
    action: &Action,
) -> Result<(), kube::Error> {
    if !matches!(
        action,
        Action::DeletePv { .. } | Action::DropPvFinalizer { .. }
    ) {
        return Ok(());
    }
    let namespace = &settings.lease_namespace;
    release_notice::post(client, namespace, &settings.driver, node, now_ms()).await
}

/// A decision made for the first time: counted (a dry run's), recorded by an Event, logged.
async fn announce(
    client: &Client,
    settings: &Settings,
    metrics: &Metrics,
    decision: &Decision,
    pv_uid: &str,
) {
    // Counted once per decision, as announced, not every round it stays the same.
    if decision.dry_run && decision.action != Action::Nothing {
        metrics.observe_node_loss_dry_run(decision.action.kind());
    }
    let (regarding, said) = said(decision, pv_uid);
    Recorder::new(client.clone(), REPORTING_CONTROLLER, &settings.identity)
        .record(regarding, said)
        .await;
    info!(pv = %decision.pv, node = %decision.node, loss = decision.loss.as_str(), action = decision.action.kind(), dry_run = decision.dry_run, reason = %decision.reason, "node loss decision");
}

async fn still_lost(client: &Client, node: &str) -> Result<bool, kube::Error> {
    Ok(
        match Api::<slim::Node>::all(client.clone()).get_opt(node).await? {
            None => true,
            Some(n) => observe::node(&n)
                .taints
                .iter()
                .any(|t| t == OUT_OF_SERVICE_TAINT),
        },
    )
}

/// Whether a round's decisions leave work that no watched change announces: an action (the
/// next step follows it), or a claim waiting on pods, which are not watched.
pub fn work_left(decisions: &[Decision]) -> bool {
    decisions.iter().any(|d| {
        d.action != Action::Nothing
            || matches!(d.reason, Reason::NoPodWaiting | Reason::InUseOnLiveNode(_))
    })
}

/// The loop's state: the view, who leads, what was announced, and when the next round is due.
struct Reconciler {
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    view: ClusterView,
    reported: HashSet<(String, String, String)>,
    leading: bool,
    next_round: Option<Instant>,
}

impl Reconciler {
    /// A round due no later than `after` from now.
    fn due_within(&mut self, after: Duration) {
        let at = Instant::now() + after;
        self.next_round = Some(self.next_round.map_or(at, |due| due.min(at)));
    }

    async fn elect(&mut self, election: &mut Election) {
        let now_leading = match election.try_lead().await {
            Ok(lead) => lead,
            Err(err) => {
                warn!(error = %err, "node loss: lease not reachable; not acting");
                false
            }
        };
        if now_leading != self.leading {
            info!(identity = %self.settings.identity, leading = now_leading, "node loss: leadership changed");
            self.leading = now_leading;
            self.metrics.set_node_loss_leader(now_leading);
            self.reported.clear();
            if now_leading {
                self.due_within(Duration::ZERO);
            }
        }
    }

    /// The round due now, if this replica leads and the view is whole; when the next is due.
    async fn round_due(&mut self) {
        self.next_round = None;
        if !self.leading || !self.view.ready() {
            // Leadership or the end of a list brings the next one.
            return;
        }
        let result = round(
            &self.client,
            &self.settings,
            &self.view,
            &self.metrics,
            &mut self.reported,
        )
        .await;
        let again = match result {
            Ok(decisions) if work_left(&decisions) => self.settings.interval,
            Ok(_) => RESYNC,
            Err(err) => {
                warn!(error = %err, "node loss: round failed, retried next interval");
                self.settings.interval
            }
        };
        self.due_within(again);
    }
}

/// Runs until `shutdown`: watches, elects, and while leader runs the rounds due.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) {
    let leases = Api::<Lease>::namespaced(client.clone(), &settings.lease_namespace);
    // Three intervals: a leader that misses two renewals in a row is replaced.
    let mut election = Election::new(
        leases,
        &settings.lease_name,
        &settings.identity,
        settings.interval * 3,
    );
    let mut changes = watch::changes(&client).boxed();
    let mut renew = tokio::time::interval(settings.interval);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reconciler = Reconciler {
        view: ClusterView::new(&settings.driver, &settings.topology_key),
        client,
        settings,
        metrics,
        reported: HashSet::new(),
        leading: false,
        next_round: None,
    };
    tokio::pin!(shutdown);
    loop {
        let due = reconciler.next_round;
        tokio::select! {
            _ = &mut shutdown => break,
            change = changes.next() => match change {
                Some(change) => {
                    if watch::apply(&mut reconciler.view, change) {
                        reconciler.due_within(SETTLE);
                    }
                }
                None => break,
            },
            _ = renew.tick() => reconciler.elect(&mut election).await,
            _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                reconciler.round_due().await;
            }
        }
    }
    if reconciler.leading
        && let Err(err) = election.release().await
    {
        warn!(error = %err, "node loss: could not release the lease");
    }
}

/// How long a stop waits for the reconciler to hand its Lease over: bounded, so that a hung API
/// call does not hold the stop past the pod's grace period.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The reconciler, where the configuration asks for one. Serving without it would hide a
/// setting that does nothing: no client configuration stops the start.
pub async fn start(inputs: &Inputs<'_>, shutdown: Shutdown) -> Result<Option<Loop>, kube::Error> {
    let config = inputs.config;
    let Some(node_loss) = config.node_loss.clone() else {
        return Ok(None);
    };
    let client = client::make(Retries::On).await?;
    let settings = Settings {
        driver: config.driver_name.clone(),
        topology_key: config.topology_key(),
        dry_run: node_loss.dry_run,
        interval: node_loss.interval,
        lease_namespace: node_loss.lease_namespace,
        lease_name: LEASE_NAME.into(),
        identity: node_loss.identity,
    };
    info!(dry_run = settings.dry_run, interval = ?settings.interval, "node-loss reconciler starting");
    let run = run(client, settings, inputs.metrics.clone(), shutdown.wait());
    Ok(Some(Loop::new("node-loss reconciler", STOP_GRACE, run)))
}

#[cfg(test)]
mod tests {
    //! The loop against a fake API server: an in-memory store behind a tower service, answering
    //! the few paths the reconciler uses the way the API server does (lists, 404s, uid
    //! preconditions, resourceVersion conflicts), and logging every write.
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use serde_json::{Value, json};

    use crate::cluster::kit::fake_api::{self, Answer, respond, status};

    const DRIVER: &str = "stickyvol.csi.io";
    const KEY: &str = "topology.stickyvol.csi.io/node";

    #[derive(Default)]
    struct Store {
        /// Collection path (e.g. /api/v1/namespaces/ns/pods) → objects by name.
        objects: BTreeMap<String, BTreeMap<String, Value>>,
        version: u64,
        /// Every write: "METHOD path".
        writes: Vec<String>,
        events: Vec<Value>,
        /// How many of the next PATCHes answer 409, as when the object changed since read.
        patch_conflicts: usize,
    }

    type Shared = Arc<Mutex<Store>>;

    /// Splits a path into (collection, name): the name is the last segment when the segment
    /// before it is a known resource.
    fn split(path: &str) -> (String, Option<String>) {
        const RESOURCES: &[&str] = &[
            "nodes",
            "persistentvolumes",
            "persistentvolumeclaims",
            "pods",
            "statefulsets",
            "storageclasses",
            "volumeattributesclasses",
            "leases",
            "events",
            "configmaps",
        ];
        let parts: Vec<&str> = path.split('/').collect();
        if parts.len() >= 2 && RESOURCES.contains(&parts[parts.len() - 2]) {
            (
                parts[..parts.len() - 1].join("/"),
                Some(parts[parts.len() - 1].to_string()),
            )
        } else {
            (path.to_string(), None)
        }
    }

    /// A PUT (`whole`) or a merge PATCH of finalizers, as the API server answers them: a stale
    /// resourceVersion is a conflict, and an object being deleted goes with its last finalizer.
    fn replace(
        store: &mut Store,
        collection: &str,
        name: &str,
        whole: bool,
        body: Value,
    ) -> Answer {
        store.version += 1;
        let version = store.version.to_string();
        let Some(current) = store
            .objects
            .get_mut(collection)
            .and_then(|m| m.get_mut(name))
        else {
            return respond(404, &status(404, "NotFound"));
        };
        let wanted = body["metadata"]["resourceVersion"].as_str();
        if wanted.is_some_and(|v| Some(v) != current["metadata"]["resourceVersion"].as_str()) {
            return respond(409, &status(409, "Conflict"));
        }
        if whole {
            *current = body;
        } else if let Some(f) = body["metadata"].get("finalizers") {
            current["metadata"]["finalizers"] = f.clone();
        }
        current["metadata"]["resourceVersion"] = json!(version);
        let reply = respond(200, current);
        // The last finalizer of an object being deleted gone: the object goes.
        let done = !current["metadata"]["deletionTimestamp"].is_null()
            && current["metadata"]["finalizers"]
                .as_array()
                .is_none_or(|f| f.is_empty());
        if done {
            store.objects.get_mut(collection).unwrap().remove(name);
        }
        reply
    }

    /// A DELETE, its uid precondition kept; finalizers hold the object, marked as being deleted.
    fn delete(store: &mut Store, collection: &str, name: &str, body: &Value) -> Answer {
        let Some(objects) = store.objects.get_mut(collection) else {
            return respond(404, &status(404, "NotFound"));
        };
        let Some(current) = objects.get(name) else {
            return respond(404, &status(404, "NotFound"));
        };
        let uid = body["preconditions"]["uid"].as_str();
        if uid.is_some_and(|u| Some(u) != current["metadata"]["uid"].as_str()) {
            return respond(409, &status(409, "Conflict"));
        }
        let held = current["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if held {
            let obj = objects.get_mut(name).unwrap();
            obj["metadata"]["deletionTimestamp"] = json!("2026-11-26T00:00:00Z");
            return respond(200, obj);
        }
        let gone = objects.remove(name).unwrap();
        respond(200, &gone)
    }

    fn handle(store: &Shared, method: &str, path: &str, body: &[u8]) -> Answer {
        let mut store = store.lock().unwrap();
        let (collection, name) = split(path);
        if method != "GET" {
            store.writes.push(format!("{method} {path}"));
        }
        let body: Value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(body).unwrap()
        };
        match (method, name) {
            ("GET", None) => {
                let items: Vec<Value> = store
                    .objects
                    .get(&collection)
                    .map(|m| m.values().cloned().collect())
                    .unwrap_or_default();
                respond(
                    200,
                    &json!({"metadata": {"resourceVersion": "1"}, "items": items}),
                )
            }
            ("GET", Some(name)) => {
                match store.objects.get(&collection).and_then(|m| m.get(&name)) {
                    Some(obj) => respond(200, obj),
                    None => respond(404, &status(404, "NotFound")),
                }
            }
            ("POST", None) if collection.ends_with("/events") => {
                store.events.push(body.clone());
                respond(201, &body)
            }
            ("POST", None) => {
                store.version += 1;
                let mut obj = body;
                obj["metadata"]["resourceVersion"] = json!(store.version.to_string());
                let name = obj["metadata"]["name"].as_str().unwrap().to_string();
                let objects = store.objects.entry(collection).or_default();
                if objects.contains_key(&name) {
                    return respond(409, &status(409, "AlreadyExists"));
                }
                objects.insert(name, obj.clone());
                respond(201, &obj)
            }
            // Server-side apply of a ConfigMap (the release notice): made, or replaced.
            ("PATCH", Some(name)) if collection.ends_with("/configmaps") => {
                store.version += 1;
                let mut obj = body;
                obj["metadata"]["resourceVersion"] = json!(store.version.to_string());
                let objects = store.objects.entry(collection).or_default();
                objects.insert(name, obj.clone());
                respond(200, &obj)
            }
            ("PATCH", Some(_)) if store.patch_conflicts > 0 => {
                store.patch_conflicts -= 1;
                respond(409, &status(409, "Conflict"))
            }
            ("PUT", Some(name)) | ("PATCH", Some(name)) => {
                replace(&mut store, &collection, &name, method == "PUT", body)
            }
            ("DELETE", Some(name)) => delete(&mut store, &collection, &name, &body),
            _ => respond(405, &status(405, "MethodNotAllowed")),
        }
    }

    fn client(store: &Shared) -> Client {
        let store = store.clone();
        fake_api::client(move |method, path, body| handle(&store, method, path, body))
    }

    fn put(store: &Shared, collection: &str, obj: Value) {
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        let mut s = store.lock().unwrap();
        s.objects
            .entry(collection.to_string())
            .or_default()
            .insert(name, obj);
    }

    fn node(name: &str, taints: Value) -> Value {
        json!({"metadata": {"name": name, "uid": format!("uid-{name}")}, "spec": {"taints": taints}})
    }

    /// Node `a` alive; `pv-b` of class `sv` pinned to node `b` (absent unless added), bound to
    /// `ns/data-db-0`, which the controller of StatefulSet `db` made (its selector's label, made
    /// after the set), and whose pod `db-0` is Pending.
    fn cluster(on_node_loss: &str) -> Shared {
        let store = Shared::default();
        put(&store, "/api/v1/nodes", node("a", json!([])));
        put(
            &store,
            "/api/v1/persistentvolumes",
            json!({
                "metadata": {"name": "pv-b", "uid": "uid-pv-b", "resourceVersion": "1",
                             "finalizers": [PROVISIONER_FINALIZER]},
                "spec": {
                    "csi": {"driver": DRIVER, "volumeHandle": "sv-1"},
                    "storageClassName": "sv",
                    "persistentVolumeReclaimPolicy": "Delete",
                    "claimRef": {"namespace": "ns", "name": "data-db-0", "uid": "uid-claim"},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": KEY, "operator": "In", "values": ["b"]}]}]}}
                }
            }),
        );
        put(
            &store,
            "/api/v1/persistentvolumes",
            json!({
                "metadata": {"name": "pv-other", "uid": "uid-pv-other"},
                "spec": {"csi": {"driver": "other.csi.io", "volumeHandle": "x"},
                         "storageClassName": "sv",
                         "nodeAffinity": {"required": {"nodeSelectorTerms": [
                            {"matchExpressions": [{"key": KEY, "operator": "In", "values": ["b"]}]}]}}}
            }),
        );
        put(
            &store,
            "/apis/storage.k8s.io/v1/storageclasses",
            json!({
                "metadata": {"name": "sv"}, "provisioner": DRIVER,
                "parameters": {"onNodeLoss": on_node_loss}
            }),
        );
        put(
            &store,
            "/api/v1/namespaces/ns/persistentvolumeclaims",
            json!({
                "metadata": {"name": "data-db-0", "namespace": "ns", "uid": "uid-claim",
                             "creationTimestamp": "2026-11-27T07:00:05Z", "labels": {"app": "db"}},
                "spec": {"volumeName": "pv-b"}
            }),
        );
        put(
            &store,
            "/apis/apps/v1/namespaces/ns/statefulsets",
            json!({
                "metadata": {"name": "db", "namespace": "ns", "uid": "uid-db",
                             "creationTimestamp": "2026-11-27T07:00:00Z"},
                "spec": {"selector": {"matchLabels": {"app": "db"}}, "template": {}, "serviceName": "db",
                         "volumeClaimTemplates": [{"metadata": {"name": "data"}}]}
            }),
        );
        put(
            &store,
            "/api/v1/namespaces/ns/pods",
            json!({
                "metadata": {"name": "db-0", "namespace": "ns", "uid": "uid-pod",
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                                  "name": "db", "uid": "uid-db", "controller": true}]},
                "spec": {"containers": [],
                         "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}}]},
                "status": {"phase": "Pending"}
            }),
        );
        store
    }

    fn settings(dry_run: bool) -> Settings {
        Settings {
            driver: DRIVER.into(),
            topology_key: KEY.into(),
            dry_run,
            interval: Duration::from_millis(10),
            lease_namespace: "stickyvol".into(),
            lease_name: "stickyvol-node-loss".into(),
            identity: "controller-0".into(),
        }
    }

    /// The apply of node b's release notice.
    const NOTICE_WRITE: &str =
        "PATCH /api/v1/namespaces/stickyvol/configmaps/stickyvol.csi.io-released-b";

    fn writes(store: &Shared) -> Vec<String> {
        std::mem::take(&mut store.lock().unwrap().writes)
            .into_iter()
            .filter(|w| !w.contains("/events"))
            .collect()
    }

    fn event_reasons(store: &Shared) -> Vec<String> {
        std::mem::take(&mut store.lock().unwrap().events)
            .iter()
            .map(|e| e["reason"].as_str().unwrap().to_string())
            .collect()
    }

    async fn one_round(
        store: &Shared,
        dry_run: bool,
        reported: &mut HashSet<(String, String, String)>,
    ) -> Vec<Decision> {
        counted_round(store, dry_run, reported, &Metrics::new()).await
    }

    async fn counted_round(
        store: &Shared,
        dry_run: bool,
        reported: &mut HashSet<(String, String, String)>,
        metrics: &Metrics,
    ) -> Vec<Decision> {
        let client = client(store);
        let view = ClusterView::listed(&client, DRIVER, KEY).await.unwrap();
        round(&client, &settings(dry_run), &view, metrics, reported)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn the_volume_attributes_class_of_the_pv_overrides_its_storage_class() {
        // The StorageClass says release; the PV's VolumeAttributesClass says keep: nothing.
        let store = cluster("release");
        let vac = |name: &str, policy: &str| {
            json!({"metadata": {"name": name}, "driverName": DRIVER,
                   "parameters": {"onNodeLoss": policy}})
        };
        let name_class = |store: &Shared, class: &str| {
            let mut s = store.lock().unwrap();
            let pv = s
                .objects
                .get_mut("/api/v1/persistentvolumes")
                .and_then(|pvs| pvs.get_mut("pv-b"))
                .unwrap();
            pv["spec"]["volumeAttributesClassName"] = json!(class);
        };
        put(
            &store,
            "/apis/storage.k8s.io/v1/volumeattributesclasses",
            vac("hold", "keep"),
        );
        name_class(&store, "hold");
        let mut reported = HashSet::new();
        one_round(&store, false, &mut reported).await;
        assert_eq!(writes(&store), Vec::<String>::new());

        // And the other way round: the class keeps, the attributes class releases.
        let store = cluster("keep");
        put(
            &store,
            "/apis/storage.k8s.io/v1/volumeattributesclasses",
            vac("go", "release"),
        );
        name_class(&store, "go");
        let mut reported = HashSet::new();
        one_round(&store, false, &mut reported).await;
        assert_eq!(
            writes(&store),
            [
                "DELETE /api/v1/namespaces/ns/persistentvolumeclaims/data-db-0",
                "DELETE /api/v1/namespaces/ns/pods/db-0",
            ]
        );

        // An attributes class that is gone, or that says nothing of it: the StorageClass's.
        let store = cluster("keep");
        name_class(&store, "gone");
        one_round(&store, false, &mut HashSet::new()).await;
        assert_eq!(writes(&store), Vec::<String>::new());
    }

    #[tokio::test]
    async fn release_deletes_the_claim_then_the_pod_then_the_pv_and_reports_once() {
        let store = cluster("release");
        let mut reported = HashSet::new();
        one_round(&store, false, &mut reported).await;
        assert_eq!(
            writes(&store),
            [
                "DELETE /api/v1/namespaces/ns/persistentvolumeclaims/data-db-0",
                "DELETE /api/v1/namespaces/ns/pods/db-0",
            ]
        );
        assert_eq!(event_reasons(&store), ["NodeLossReleased"]);
        // The claim gone, the PV is released: the next round deletes it, and drops the
        // provisioner's finalizer that holds it.
        one_round(&store, false, &mut reported).await;
        // Node b's release notice first, so that a driver that ran through b's loss reads
        // its PVs again (written before the delete: no crash between them can lose it).
        assert_eq!(
            writes(&store),
            [
                NOTICE_WRITE,
                "DELETE /api/v1/persistentvolumes/pv-b",
                "PATCH /api/v1/persistentvolumes/pv-b"
            ]
        );
        assert_eq!(event_reasons(&store), ["NodeLossPvDeleted"]);
        let notice = store.lock().unwrap().objects["/api/v1/namespaces/stickyvol/configmaps"]
            ["stickyvol.csi.io-released-b"]
            .clone();
        assert_eq!(notice["data"]["node"], "b");
        assert_eq!(
            notice["metadata"]["labels"]["stickyvol.csi.io/release-notice"],
            DRIVER
        );
        // Nothing of ours is left on b: the next round writes nothing; the other driver's PV
        // was never touched.
        assert_eq!(one_round(&store, false, &mut reported).await, vec![]);
        assert_eq!(writes(&store), Vec::<String>::new());
        let s = store.lock().unwrap();
        assert!(s.objects["/api/v1/persistentvolumes"].contains_key("pv-other"));
    }

    #[tokio::test]
    async fn a_finalizer_left_by_a_conflict_is_dropped_next_round_and_the_pv_counted_once() {
        let store = cluster("release");
        // The claim is gone already: the PV is released.
        store
            .lock()
            .unwrap()
            .objects
            .remove("/api/v1/namespaces/ns/persistentvolumeclaims");
        let metrics = Metrics::new();
        let mut reported = HashSet::new();
        store.lock().unwrap().patch_conflicts = 1;
        counted_round(&store, false, &mut reported, &metrics).await;
        assert_eq!(
            writes(&store),
            [
                NOTICE_WRITE,
                "DELETE /api/v1/persistentvolumes/pv-b",
                "PATCH /api/v1/persistentvolumes/pv-b"
            ]
        );
        let pvs = "/api/v1/persistentvolumes";
        assert!(store.lock().unwrap().objects[pvs].contains_key("pv-b"));
        // Being deleted, still held by the provisioner's finalizer: dropped, not deleted again.
        let decisions = counted_round(&store, false, &mut reported, &metrics).await;
        assert_eq!(decisions[0].action.kind(), "drop_pv_finalizer");
        assert_eq!(
            writes(&store),
            [NOTICE_WRITE, "PATCH /api/v1/persistentvolumes/pv-b"]
        );
        assert!(!store.lock().unwrap().objects[pvs].contains_key("pv-b"));
        assert_eq!(
            counted_round(&store, false, &mut reported, &metrics).await,
            vec![]
        );
        assert_eq!(metrics.node_loss_count("delete_pv", "done"), 1);
        assert_eq!(metrics.node_loss_count("drop_pv_finalizer", "done"), 1);
    }

    #[tokio::test]
    async fn a_pv_delete_drops_only_the_provisioners_finalizer() {
        let store = cluster("release");
        let pvs = "/api/v1/persistentvolumes";
        store
            .lock()
            .unwrap()
            .objects
            .get_mut(pvs)
            .unwrap()
            .get_mut("pv-b")
            .unwrap()["metadata"]["finalizers"] =
            json!(["kubernetes.io/pv-protection", PROVISIONER_FINALIZER]);
        let pv = ObjectRef {
            namespace: String::new(),
            name: "pv-b".into(),
            uid: "uid-pv-b".into(),
        };
        carry_out(&client(&store), &Action::DeletePv { pv: pv.clone() })
            .await
            .unwrap();
        {
            let s = store.lock().unwrap();
            let left = &s.objects[pvs]["pv-b"]["metadata"];
            assert_eq!(left["finalizers"], json!(["kubernetes.io/pv-protection"]));
            assert!(!left["deletionTimestamp"].is_null());
        }
        // Again (the next round, say): nothing fails, nothing else is removed, and with the
        // finalizer gone there is nothing to patch.
        writes(&store);
        carry_out(&client(&store), &Action::DeletePv { pv: pv.clone() })
            .await
            .unwrap();
        assert_eq!(writes(&store), ["DELETE /api/v1/persistentvolumes/pv-b"]);
        // A PV of that name but another uid (re-created) is neither deleted nor patched.
        store
            .lock()
            .unwrap()
            .objects
            .get_mut(pvs)
            .unwrap()
            .get_mut("pv-b")
            .unwrap()["metadata"]["uid"] = json!("uid-new");
        writes(&store);
        carry_out(&client(&store), &Action::DeletePv { pv })
            .await
            .unwrap();
        assert_eq!(writes(&store), ["DELETE /api/v1/persistentvolumes/pv-b"]);
        let s = store.lock().unwrap();
        assert_eq!(
            s.objects[pvs]["pv-b"]["metadata"]["finalizers"],
            json!(["kubernetes.io/pv-protection"])
        );
    }

    #[tokio::test]
    async fn a_claim_older_than_the_statefulset_named_after_it_is_not_deleted_and_the_event_says_why()
     {
        // Someone who may create StatefulSets names one `db` with a template `data`, after the
        // claim data-db-0 that was there before it; its pod waits for that claim.
        let store = cluster("release");
        store
            .lock()
            .unwrap()
            .objects
            .get_mut("/apis/apps/v1/namespaces/ns/statefulsets")
            .unwrap()
            .get_mut("db")
            .unwrap()["metadata"]["creationTimestamp"] = json!("2026-11-27T07:30:00Z");
        let mut reported = HashSet::new();
        let decisions = one_round(&store, false, &mut reported).await;
        assert_eq!(decisions[0].action, Action::Nothing);
        assert_eq!(writes(&store), Vec::<String>::new());
        let events = std::mem::take(&mut store.lock().unwrap().events);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0]["reason"], "NodeLossKept");
        let note = events[0]["note"].as_str().unwrap();
        assert!(
            note.contains("named like a StatefulSet's but its controller did not make it")
                && note.contains("the claim was created before the StatefulSet"),
            "{note}"
        );
    }

    #[tokio::test]
    async fn a_pv_is_read_again_before_it_is_decided_on() {
        // The view (a watch) still has pv-b on lost node b, but the PV is gone from the API:
        // nothing is decided on the view alone.
        let store = cluster("release");
        let client = client(&store);
        let view = ClusterView::listed(&client, DRIVER, KEY).await.unwrap();
        assert_eq!(view.on_lost_nodes(), ["pv-b"]);
        store
            .lock()
            .unwrap()
            .objects
            .get_mut("/api/v1/persistentvolumes")
            .unwrap()
            .remove("pv-b");
        let metrics = Metrics::new();
        let decisions = round(
            &client,
            &settings(false),
            &view,
            &metrics,
            &mut HashSet::new(),
        )
        .await
        .unwrap();
        assert_eq!(decisions, vec![]);
        assert_eq!(writes(&store), Vec::<String>::new());
    }

    #[tokio::test]
    async fn work_is_left_while_an_action_follows_or_a_pod_is_awaited() {
        let store = cluster("release");
        let decisions = one_round(&store, false, &mut HashSet::new()).await;
        assert!(work_left(&decisions), "the claim released, its PV is next");
        let keep = cluster("keep");
        let decisions = one_round(&keep, false, &mut HashSet::new()).await;
        assert!(
            !work_left(&decisions),
            "keep: only a class change changes it"
        );
        // No pod of the set waits yet (the old one not yet gone): pods are not watched.
        let waiting = cluster("release");
        waiting
            .lock()
            .unwrap()
            .objects
            .remove("/api/v1/namespaces/ns/pods");
        let decisions = one_round(&waiting, true, &mut HashSet::new()).await;
        assert_eq!(decisions[0].reason, decide::Reason::NoPodWaiting);
        assert!(work_left(&decisions));
    }

    #[tokio::test]
    async fn keep_writes_nothing_but_one_event() {
        let store = cluster("keep");
        let mut reported = HashSet::new();
        let decisions = one_round(&store, false, &mut reported).await;
        assert_eq!(decisions.len(), 1);
        assert_eq!(writes(&store), Vec::<String>::new());
        assert_eq!(event_reasons(&store), ["NodeLossKept"]);
        one_round(&store, false, &mut reported).await;
        assert_eq!(
            event_reasons(&store),
            Vec::<String>::new(),
            "announced once"
        );
    }

    #[tokio::test]
    async fn dry_run_writes_nothing_but_events() {
        let store = cluster("release");
        let metrics = Metrics::new();
        let mut reported = HashSet::new();
        for _ in 0..3 {
            let decisions = counted_round(&store, true, &mut reported, &metrics).await;
            assert_eq!(decisions[0].action.kind(), "release_claim");
        }
        assert_eq!(writes(&store), Vec::<String>::new());
        assert_eq!(event_reasons(&store), ["NodeLossDryRun"]);
        // One decision, announced once and counted once, however many rounds it stays.
        assert_eq!(metrics.node_loss_count("release_claim", "dry_run"), 1);
    }

    #[tokio::test]
    async fn a_not_ready_node_or_one_that_came_back_is_left_alone() {
        for taints in [
            json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]),
            json!([]),
        ] {
            let store = cluster("release");
            put(&store, "/api/v1/nodes", node("b", taints));
            assert_eq!(one_round(&store, false, &mut HashSet::new()).await, vec![]);
            assert_eq!(writes(&store), Vec::<String>::new());
            assert_eq!(event_reasons(&store), Vec::<String>::new());
        }
    }

    #[tokio::test]
    async fn an_out_of_service_taint_releases_the_claim_but_keeps_the_pv() {
        let store = cluster("release");
        put(
            &store,
            "/api/v1/nodes",
            node(
                "b",
                json!([{"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}]),
            ),
        );
        let mut reported = HashSet::new();
        one_round(&store, false, &mut reported).await;
        assert_eq!(writes(&store).len(), 2);
        let decisions = one_round(&store, false, &mut reported).await;
        assert_eq!(decisions[0].reason, decide::Reason::NodeMayReturn);
        assert_eq!(writes(&store), Vec::<String>::new());
    }

    #[tokio::test]
    async fn a_claim_replaced_meanwhile_is_not_deleted() {
        // The decision names the old claim's uid; the API holds a new claim of that name.
        let store = cluster("release");
        let action = Action::ReleaseClaim {
            claim: ObjectRef {
                namespace: "ns".into(),
                name: "data-db-0".into(),
                uid: "uid-old".into(),
            },
            pods: vec![],
        };
        carry_out(&client(&store), &action).await.unwrap();
        let s = store.lock().unwrap();
        assert!(
            s.objects["/api/v1/namespaces/ns/persistentvolumeclaims"].contains_key("data-db-0")
        );
    }

    #[tokio::test]
    async fn one_of_two_candidates_leads_and_the_other_takes_over_when_it_lets_go() {
        let store = Shared::default();
        let leases = |store: &Shared| Api::<Lease>::namespaced(client(store), "stickyvol");
        let long = Duration::from_secs(60);
        let mut first = Election::new(leases(&store), "l", "first", long);
        let mut second = Election::new(leases(&store), "l", "second", long);
        assert!(first.try_lead().await.unwrap());
        assert!(!second.try_lead().await.unwrap());
        assert!(first.try_lead().await.unwrap(), "renews");
        assert!(!second.try_lead().await.unwrap());
        first.release().await.unwrap();
        assert!(second.try_lead().await.unwrap());
        assert!(!first.try_lead().await.unwrap());
        // A stale write (an old resourceVersion) is refused, so two writers cannot both win.
        let mut stale = leases(&store).get("l").await.unwrap();
        assert!(second.try_lead().await.unwrap());
        stale.spec.as_mut().unwrap().holder_identity = Some("first".into());
        let err = leases(&store)
            .replace("l", &kube::api::PostParams::default(), &stale)
            .await
            .unwrap_err();
        assert!(matches!(err, kube::Error::Api(s) if s.code == 409));
    }
}
