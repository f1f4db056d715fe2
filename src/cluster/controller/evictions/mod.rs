//! Overflow evictions (controller mode, `--overflow-evictions=on`): the node plugins' overflow
//! check asks for its pods' eviction on the volume's PV (`kit::eviction_request`); this loop
//! watches the PVs that carry a request, checks each pod named (`check`: on the PV's node,
//! using its claim) and evicts it through the Eviction API (`evict`), with Events on the claim
//! and the counts in `stickyvol_overflow_evictions_total`. So a node's credentials evict nothing,
//! and this loop evicts only what a node may ask for: its own volumes' pods.
//!
//! PodDisruptionBudgets are respected, unlike kubelet's own emptyDir eviction: the Eviction
//! API's 429 means a budget refuses now. The pod is left running, an Event says so once, and the
//! node's next write of the request (every round) is the next try, until the budget allows it,
//! the volume fits again (the node takes the request back) or the node's fence makes the volume
//! read-only. What it has done per PV is kept in memory; a restart may announce a refusal again.

pub mod check;
pub mod evict;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{info, warn};

use crate::cluster::kit::client::{self, Retries};
use crate::cluster::kit::events::{self, Kind, Recorder, Said};
use crate::cluster::kit::eviction_request::{self, EvictionRequest, Unusable};
use crate::cluster::kit::slim::Pod;
use crate::cluster::kit::task::{Inputs, Loop, Shutdown};
use crate::metrics::Metrics;
use crate::volume::state::record::PodRef;
use check::Asker;
use evict::Evicted;

/// Who writes this loop's Events.
pub const REPORTING_CONTROLLER: &str = "stickyvol.csi.io/overflow-evictions";

/// What the loop works with.
pub struct Evictor {
    client: Client,
    recorder: Recorder,
    metrics: std::sync::Arc<Metrics>,
    driver: String,
    topology_key: String,
    /// Per PV with a request: what was done for it.
    asked: HashMap<String, Done>,
}

/// What the loop has done for one PV's request, so that a pod is evicted once and each refusal
/// announced once.
#[derive(Debug, Default)]
struct Done {
    /// Pods (by uid) evicted, found gone, or turned down by `check`: not tried again.
    settled: HashSet<String>,
    /// Pods (by uid) a budget refuses, announced once per refusal streak.
    refused: HashSet<String>,
    /// The last unusable request announced (so that each is announced once).
    unusable: Option<String>,
}

impl Evictor {
    pub fn new(
        client: Client,
        metrics: std::sync::Arc<Metrics>,
        (driver, topology_key): (String, String),
        identity: String,
    ) -> Evictor {
        Evictor {
            recorder: Recorder::new(client.clone(), REPORTING_CONTROLLER, identity),
            client,
            metrics,
            driver,
            topology_key,
            asked: HashMap::new(),
        }
    }

    /// One PV as the watch gives it: its request acted on, or its record dropped when it has none.
    pub async fn handle(&mut self, pv: &PersistentVolume) {
        let name = pv.metadata.name.clone().unwrap_or_default();
        let annotation =
            (pv.metadata.annotations.as_ref()).and_then(|a| a.get(eviction_request::ANNOTATION));
        let Some(annotation) = annotation else {
            self.asked.remove(&name);
            return;
        };
        let asker = match check::asker(pv, &self.driver, &self.topology_key) {
            Ok(asker) => asker,
            Err(why) => {
                self.unusable(pv, &name, format!("PV {name} {why}")).await;
                return;
            }
        };
        match eviction_request::parse(annotation, crate::volume::state::record::now_ms()) {
            Ok(request) => self.act(&name, &asker, &request).await,
            // A leftover of a node that stopped asking: nothing to say.
            Err(Unusable::Expired) => {}
            Err(Unusable::Malformed(why)) => {
                let note = format!("the eviction request on PV {name} {why}");
                self.unusable(pv, &name, note).await;
            }
        }
    }

    /// Forgets a PV whose request is gone (taken back, or the PV deleted).
    pub fn forget(&mut self, pv: &PersistentVolume) {
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        self.asked.remove(name);
    }

    /// Announces, once per text, a request this loop will not act on, on its PV.
    async fn unusable(&mut self, pv: &PersistentVolume, name: &str, note: String) {
        let done = self.asked.entry(name.to_string()).or_default();
        if done.unusable.as_ref() == Some(&note) {
            return;
        }
        warn!(pv = %name, why = %note, "overflow evictions: a request not acted on");
        self.metrics.observe_overflow_eviction("not_allowed");
        let regarding =
            events::cluster_scoped("v1", "PersistentVolume", name, pv.metadata.uid.as_deref());
        let said = Said {
            kind: Kind::Warning,
            reason: "EvictionRequestRefused",
            action: "Check",
            note: note.clone(),
        };
        self.recorder.record(regarding, said).await;
        done.unusable = Some(note);
    }

    /// Evicts each pod of `request` not settled yet that `check` allows.
    async fn act(&mut self, name: &str, asker: &Asker, request: &EvictionRequest) {
        for pod in &request.pods {
            let done = self.asked.entry(name.to_string()).or_default();
            if done.settled.contains(&pod.uid) {
                continue;
            }
            let outcome = match self.checked(asker, pod).await {
                Ok(()) => evict::evict(&self.client, pod).await,
                Err(outcome) => outcome,
            };
            self.metrics.observe_overflow_eviction(outcome.result());
            let done = self.asked.entry(name.to_string()).or_default();
            let said = outcome_event(done, asker, pod, &request.why, &outcome);
            if let Some((kind, reason, note)) = said {
                let regarding = events::claim(
                    &asker.claim_namespace,
                    &asker.claim_name,
                    asker.claim_uid.as_deref(),
                );
                let said = Said {
                    kind,
                    reason,
                    action: "Evict",
                    note,
                };
                self.recorder.record(regarding, said).await;
            }
        }
    }

    /// Ok when the pod named may be evicted for this request; else the outcome without an
    /// eviction: gone (no such pod, or another uid), turned down, or the read failed.
    async fn checked(&self, asker: &Asker, pod: &PodRef) -> Result<(), Evicted> {
        let pods = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace);
        let found = match pods.get_opt(&pod.name).await {
            Ok(found) => found,
            Err(err) => return Err(Evicted::Failed(format!("reading the pod: {err}"))),
        };
        let found = found.filter(|p| p.metadata.uid.as_deref() == Some(&pod.uid));
        let Some(found) = found else {
            return Err(Evicted::Gone);
        };
        check::may_evict(asker, &found).map_err(Evicted::NotAllowed)
    }
}

/// What `done` learns from an eviction's outcome, and the Event on the claim it calls for, if
/// any: (kind, reason, note).
fn outcome_event(
    done: &mut Done,
    asker: &Asker,
    pod: &PodRef,
    why: &str,
    outcome: &Evicted,
) -> Option<(Kind, &'static str, String)> {
    if !matches!(outcome, Evicted::RefusedByBudget(_)) {
        done.refused.remove(&pod.uid);
    }
    let named = format!("pod {}/{}", pod.namespace, pod.name);
    match outcome {
        Evicted::Done => {
            info!(pod = %pod.name, namespace = %pod.namespace, node = %asker.node, volume = %asker.volume, "overflow evictions: pod evicted");
            done.settled.insert(pod.uid.clone());
            let note = format!("evicted {named}: volume {} {why}", asker.volume);
            Some((Kind::Warning, "OverflowEvicted", note))
        }
        Evicted::Gone => {
            done.settled.insert(pod.uid.clone());
            None
        }
        Evicted::NotAllowed(reason) => {
            warn!(pod = %pod.name, namespace = %pod.namespace, node = %asker.node, why = %reason, "overflow evictions: a node asked for a pod it may not evict; refused");
            done.settled.insert(pod.uid.clone());
            let note = format!(
                "node {} asked to evict {named} for volume {}, refused: {reason}",
                asker.node, asker.volume
            );
            Some((Kind::Warning, "EvictionRequestRefused", note))
        }
        Evicted::RefusedByBudget(reason) => {
            warn!(pod = %pod.name, namespace = %pod.namespace, why = %reason, "overflow evictions: a PodDisruptionBudget refuses the eviction; tried again at the node's next request");
            let note = format!(
                "eviction of {named} refused by a PodDisruptionBudget ({}); volume {} stays above its size, asked again every round until its mounts are fenced read-only",
                truncate(reason),
                asker.volume
            );
            (done.refused.insert(pod.uid.clone())).then_some((
                Kind::Warning,
                "OverflowEvictionRefused",
                note,
            ))
        }
        Evicted::Failed(reason) => {
            warn!(pod = %pod.name, namespace = %pod.namespace, error = %reason, "overflow evictions: eviction failed; tried again at the node's next request");
            None
        }
    }
}

/// At most 200 characters of a message from the API server.
fn truncate(text: &str) -> String {
    text.chars().take(200).collect()
}

/// Watches the PVs that carry a request (by label: only those) until `shutdown`.
pub async fn run(mut evictor: Evictor, shutdown: impl Future<Output = ()>) {
    let pvs = Api::<PersistentVolume>::all(evictor.client.clone());
    let config = watcher::Config::default().labels(eviction_request::LABEL);
    let mut changes = watcher(pvs, config).default_backoff().boxed();
    tokio::pin!(shutdown);
    loop {
        let event = tokio::select! {
            _ = &mut shutdown => break,
            event = changes.next() => match event {
                Some(Ok(event)) => event,
                Some(Err(err)) => {
                    warn!(error = %err, "overflow evictions: watching PVs failed; retrying");
                    continue;
                }
                None => break,
            },
        };
        match event {
            watcher::Event::Apply(pv) | watcher::Event::InitApply(pv) => evictor.handle(&pv).await,
            watcher::Event::Delete(pv) => evictor.forget(&pv),
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }
}

/// The loop, where the configuration asks for it (a watch: nothing to wait for at the stop).
pub async fn start(inputs: &Inputs<'_>, shutdown: Shutdown) -> Result<Option<Loop>, kube::Error> {
    let config = inputs.config;
    if !config.overflow_evictions {
        return Ok(None);
    }
    // Without kube's retries: they would repeat a budget's 429 for minutes (its Retry-After)
    // inside one request; the node's next write is the retry.
    let client = client::make(Retries::Off).await?;
    info!("overflow evictions starting");
    let evictor = Evictor::new(
        client,
        inputs.metrics.clone(),
        (config.driver_name.clone(), config.topology_key()),
        config.node_id.clone(),
    );
    let run = run(evictor, shutdown.wait());
    Ok(Some(Loop::new("overflow evictions", Duration::ZERO, run)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    use serde_json::{Value, json};

    use crate::cluster::kit::fake_api::{self, Answer, respond, status};

    const DRIVER: &str = "stickyvol.csi.io";
    const KEY: &str = "topology.stickyvol.csi.io/node";
    const UID: &str = "0f6c1a52-1b7e-4c54-9d7e-2c1f3e0b9a11";

    #[derive(Default)]
    struct Api {
        /// Pod path → the pod.
        pods: HashMap<String, Value>,
        /// (path, body) of each eviction sent.
        evictions: Vec<(String, Value)>,
        /// Evictions a budget refuses before it allows one.
        refusals: usize,
        /// (reason, note, regarding kind) of each Event.
        events: Vec<(String, String, String)>,
    }
    type Shared = Arc<Mutex<Api>>;

    fn handle(api: &Shared, method: &str, path: &str, body: &[u8]) -> Answer {
        let mut api = api.lock().unwrap();
        let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        match method {
            "GET" => match api.pods.get(path) {
                Some(pod) => respond(200, pod),
                None => respond(404, &status(404, "NotFound")),
            },
            "POST" if path.ends_with("/events") => {
                let kind = body["regarding"]["kind"].as_str().unwrap_or("").to_string();
                let said = (body["reason"].to_string(), body["note"].to_string(), kind);
                api.events.push(said);
                respond(201, &body)
            }
            "POST" if path.ends_with("/eviction") => {
                api.evictions.push((path.to_string(), body));
                if api.refusals > 0 {
                    api.refusals -= 1;
                    return respond(
                        429,
                        &status(
                            429,
                            "Cannot evict pod as it would violate the pod's disruption budget.",
                        ),
                    );
                }
                respond(201, &json!({"kind": "Status", "status": "Success"}))
            }
            _ => respond(405, &json!({})),
        }
    }

    fn evictor(api: &Shared) -> Evictor {
        let shared = api.clone();
        let client = fake_api::client(move |m, p, b| handle(&shared, m, p, b));
        let metrics = std::sync::Arc::new(Metrics::new());
        Evictor::new(
            client,
            metrics,
            (DRIVER.into(), KEY.into()),
            "controller-0".into(),
        )
    }

    /// A pod `web-0` in `shop` on `node`, using claim `data`.
    fn put_pod(api: &Shared, node: &str) {
        let pod = json!({
            "metadata": {"name": "web-0", "namespace": "shop", "uid": UID},
            "spec": {"nodeName": node, "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]},
        });
        let path = "/api/v1/namespaces/shop/pods/web-0".to_string();
        api.lock().unwrap().pods.insert(path, pod);
    }

    /// PV `pvc-1` of claim shop/data pinned to n1, carrying `annotation` as its request.
    fn pv(driver: &str, annotation: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "pvc-1", "uid": "pv-uid",
                         "labels": {eviction_request::LABEL: "true"},
                         "annotations": {eviction_request::ANNOTATION: annotation}},
            "spec": {
                "csi": {"driver": driver, "volumeHandle": "vol-1"},
                "claimRef": {"namespace": "shop", "name": "data", "uid": "claim-uid"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": KEY, "operator": "In", "values": ["n1"]}]}]}},
            }
        }))
        .unwrap()
    }

    fn request(uid: &str, expires_unix_ms: u64) -> String {
        let request = EvictionRequest {
            pods: vec![PodRef {
                namespace: "shop".into(),
                name: "web-0".into(),
                uid: uid.into(),
            }],
            why: "uses 20 bytes, more than its size of 10 bytes".into(),
            expires_unix_ms,
        };
        serde_json::to_string(&request).unwrap()
    }

    fn fresh() -> String {
        request(UID, crate::volume::state::record::now_ms() + 60_000)
    }

    fn reasons(api: &Shared) -> Vec<String> {
        let api = api.lock().unwrap();
        api.events
            .iter()
            .map(|(r, ..)| r.trim_matches('"').to_string())
            .collect()
    }

    #[tokio::test]
    async fn a_pod_on_the_asking_node_using_its_volume_is_evicted_by_uid_once() {
        let api = Shared::default();
        put_pod(&api, "n1");
        let mut evictor = evictor(&api);
        evictor.handle(&pv(DRIVER, &fresh())).await;
        {
            let api = api.lock().unwrap();
            assert_eq!(api.evictions.len(), 1);
            let (path, body) = &api.evictions[0];
            assert_eq!(path, "/api/v1/namespaces/shop/pods/web-0/eviction");
            assert_eq!(body["deleteOptions"]["preconditions"]["uid"], UID);
            let (_, note, kind) = &api.events[0];
            assert_eq!(kind, "PersistentVolumeClaim");
            assert!(
                note.contains("evicted pod shop/web-0: volume vol-1 uses 20 bytes"),
                "{note}"
            );
        }
        assert_eq!(reasons(&api), ["OverflowEvicted"]);
        // The node's next write of the request: evicted already, not again.
        evictor.handle(&pv(DRIVER, &fresh())).await;
        assert_eq!(api.lock().unwrap().evictions.len(), 1);
    }

    #[tokio::test]
    async fn a_pod_on_another_node_is_never_evicted_and_the_refusal_is_said_once() {
        let api = Shared::default();
        put_pod(&api, "n2");
        let mut evictor = evictor(&api);
        evictor.handle(&pv(DRIVER, &fresh())).await;
        evictor.handle(&pv(DRIVER, &fresh())).await;
        assert!(api.lock().unwrap().evictions.is_empty());
        assert_eq!(reasons(&api), ["EvictionRequestRefused"]);
        let note = api.lock().unwrap().events[0].1.clone();
        assert!(
            note.contains("node n1 asked to evict pod shop/web-0"),
            "{note}"
        );
        assert!(note.contains("runs on n2, not on n1"), "{note}");
    }

    #[tokio::test]
    async fn a_request_naming_another_pods_uid_evicts_nothing() {
        let api = Shared::default();
        put_pod(&api, "n1");
        let mut evictor = evictor(&api);
        let other = request(
            "11111111-2222-3333-4444-555555555555",
            crate::volume::state::record::now_ms() + 60_000,
        );
        evictor.handle(&pv(DRIVER, &other)).await;
        assert!(api.lock().unwrap().evictions.is_empty());
        assert!(reasons(&api).is_empty());
    }

    #[tokio::test]
    async fn a_budget_refusal_is_said_once_and_tried_again_at_each_request() {
        let api = Shared::default();
        put_pod(&api, "n1");
        api.lock().unwrap().refusals = 2;
        let mut evictor = evictor(&api);
        for _ in 0..3 {
            evictor.handle(&pv(DRIVER, &fresh())).await;
        }
        assert_eq!(
            api.lock().unwrap().evictions.len(),
            3,
            "asked at each request"
        );
        assert_eq!(
            reasons(&api),
            ["OverflowEvictionRefused", "OverflowEvicted"]
        );
    }

    #[tokio::test]
    async fn expired_foreign_and_malformed_requests_evict_nothing() {
        let api = Shared::default();
        put_pod(&api, "n1");
        let mut evictor = evictor(&api);
        evictor.handle(&pv(DRIVER, &request(UID, 1))).await;
        assert!(
            reasons(&api).is_empty(),
            "an expired request is a leftover: nothing said"
        );
        evictor.handle(&pv("other.csi.io", &fresh())).await;
        evictor.handle(&pv(DRIVER, "{not json")).await;
        evictor.handle(&pv(DRIVER, "{not json")).await;
        assert!(api.lock().unwrap().evictions.is_empty());
        assert_eq!(
            reasons(&api),
            ["EvictionRequestRefused", "EvictionRequestRefused"]
        );
        let kinds: Vec<String> = api
            .lock()
            .unwrap()
            .events
            .iter()
            .map(|e| e.2.clone())
            .collect();
        assert_eq!(kinds, ["PersistentVolume", "PersistentVolume"]);
    }
}
