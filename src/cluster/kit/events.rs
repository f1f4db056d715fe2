//! The one Event recorder: every Event this binary writes (on claims, PVs, Nodes and
//! StorageClasses; from the controller's loops and the node's) is an events.k8s.io/v1 Event built
//! and created here.
//!
//! Not kube-runtime's `events::Recorder`: on a repeat of an Event it keeps for 6 minutes it
//! PATCHes a series, which needs `patch` on events in every role that records one, while each
//! loop of ours already announces a change once (a refusal, a decision, an overflow) and never
//! repeats it; and it sends notes uncut, which the API server refuses past 1 kB. This one creates,
//! cuts the note, and logs a refusal: an Event says what the log and the metrics say too.

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};
use tracing::warn;

/// The API server refuses notes over 1 kB.
const NOTE_LIMIT: usize = 1024;

/// Where Events about cluster-scoped objects (Nodes, PVs, StorageClasses) go: kubectl looks
/// for them there.
const CLUSTER_SCOPED_NAMESPACE: &str = "default";

/// Whether an Event reports something to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Normal,
    Warning,
}

/// One loop's Event writer: who reports (`reporting_controller`, a qualified name such as
/// `stickyvol.csi.io/restore-placement`) and from where (this replica or node).
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    controller: String,
    instance: String,
}

/// What an Event says.
#[derive(Debug, Clone)]
pub struct Said<'a> {
    pub kind: Kind,
    /// Why, in one CamelCase word: what `kubectl get events` shows.
    pub reason: &'a str,
    /// What the reporter did or tried, in one CamelCase word.
    pub action: &'a str,
    pub note: String,
}

impl Recorder {
    pub fn new(client: Client, controller: impl Into<String>, instance: impl Into<String>) -> Self {
        Recorder {
            client,
            controller: controller.into(),
            instance: instance.into(),
        }
    }

    /// The client the Events go through.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Records `said` about `regarding`; whether the API server took it. A refusal is logged
    /// here: no loop stops for an Event (one that must be told may try again).
    pub async fn record(&self, regarding: ObjectReference, said: Said<'_>) -> bool {
        let event = self.event(regarding, &said);
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let created = Api::<Event>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await;
        if let Err(err) = &created {
            warn!(reporter = %self.controller, reason = said.reason, error = %err, "could not record an Event");
        }
        created.is_ok()
    }

    /// Records `said` about claim `namespace/name`, read first for its uid (with it the Event
    /// shows in `kubectl describe pvc`; a claim that cannot be read still gets it, listed);
    /// whether the API server took it.
    pub async fn record_on_claim(&self, namespace: &str, name: &str, said: Said<'_>) -> bool {
        let claims = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace);
        // A claim that is gone (a move deletes and remakes it) gets the Event by name alone:
        // not worth a warning at each step.
        let uid = match claims.get_opt(name).await {
            Ok(found) => found.and_then(|claim| claim.metadata.uid),
            Err(err) => {
                warn!(reporter = %self.controller, claim = %format!("{namespace}/{name}"), error = %err, "cannot read the claim an Event is about");
                None
            }
        };
        self.record(claim(namespace, name, uid.as_deref()), said)
            .await
    }

    /// The Event as it is sent.
    fn event(&self, regarding: ObjectReference, said: &Said<'_>) -> Event {
        let namespace =
            (regarding.namespace.clone()).unwrap_or_else(|| CLUSTER_SCOPED_NAMESPACE.into());
        Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}-", generate_prefix(&self.controller))),
                namespace: Some(namespace),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            type_: Some(
                match said.kind {
                    Kind::Normal => "Normal",
                    Kind::Warning => "Warning",
                }
                .into(),
            ),
            reason: Some(said.reason.into()),
            action: Some(said.action.into()),
            note: Some(note(said.note.clone())),
            regarding: Some(regarding),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        }
    }
}

/// `stickyvol.csi.io/overflow-check` → `stickyvol-overflow-check`: the Event names' prefix,
/// which says who wrote it.
fn generate_prefix(controller: &str) -> String {
    let reporter = controller.rsplit('/').next().unwrap_or(controller);
    format!("stickyvol-{reporter}")
}

/// `text`, cut (at a character boundary, marked "...") to fit an Event's note.
pub fn note(mut text: String) -> String {
    if text.len() > NOTE_LIMIT {
        let mut cut = NOTE_LIMIT - 3;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

/// A claim, as an Event's `regarding` (with its uid the Event shows in `kubectl describe pvc`;
/// without, it is still listed).
pub fn claim(namespace: &str, name: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: uid.map(str::to_string),
        ..ObjectReference::default()
    }
}

/// A cluster-scoped object, as an Event's `regarding`.
pub fn cluster_scoped(
    api_version: &str,
    kind: &str,
    name: &str,
    uid: Option<&str>,
) -> ObjectReference {
    ObjectReference {
        api_version: Some(api_version.into()),
        kind: Some(kind.into()),
        name: Some(name.into()),
        uid: uid.map(str::to_string),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::kit::fake_api;
    use std::sync::{Arc, Mutex};

    #[test]
    fn long_notes_are_cut_at_a_character_boundary() {
        assert_eq!(note("short".into()), "short");
        let long = "é".repeat(600);
        let cut = note(long);
        assert!(
            cut.len() <= NOTE_LIMIT && cut.ends_with("..."),
            "{}",
            cut.len()
        );
    }

    /// The claim is read for its uid; one that cannot be read still gets its Event.
    #[tokio::test]
    async fn an_event_on_a_claim_names_the_claim_and_its_uid() {
        let posted = Arc::new(Mutex::new(Vec::new()));
        let seen = posted.clone();
        let client = fake_api::client(move |method, path, body| {
            if method == "GET" {
                return match path {
                    "/api/v1/namespaces/shop/persistentvolumeclaims/data-0" => fake_api::respond(
                        200,
                        &serde_json::json!({"metadata": {"name": "data-0", "namespace": "shop", "uid": "u-1"}}),
                    ),
                    _ => fake_api::respond(404, &fake_api::status(404, "NotFound")),
                };
            }
            seen.lock().unwrap().push(body.to_vec());
            fake_api::respond(201, &serde_json::json!({}))
        });
        let recorder = Recorder::new(client, "stickyvol.csi.io/project-audit", "worker-3");
        let said = || Said {
            kind: Kind::Warning,
            reason: "ProjectIdsRepaired",
            action: "Audit",
            note: "found".into(),
        };
        assert!(recorder.record_on_claim("shop", "data-0", said()).await);
        assert!(recorder.record_on_claim("shop", "gone", said()).await);
        let posted = posted.lock().unwrap();
        let regarding = |i: usize| {
            serde_json::from_slice::<serde_json::Value>(&posted[i]).unwrap()["regarding"].clone()
        };
        assert_eq!(regarding(0)["kind"], "PersistentVolumeClaim");
        assert_eq!(
            (&regarding(0)["namespace"], &regarding(0)["name"]),
            (&serde_json::json!("shop"), &serde_json::json!("data-0"))
        );
        assert_eq!(regarding(0)["uid"], "u-1");
        assert_eq!(regarding(1)["name"], "gone");
        assert!(regarding(1).get("uid").is_none());
    }

    #[tokio::test]
    async fn an_event_goes_to_its_objects_namespace_or_default_with_who_wrote_it() {
        let posted = Arc::new(Mutex::new(Vec::new()));
        let seen = posted.clone();
        let client = fake_api::client(move |method, path, body| {
            seen.lock()
                .unwrap()
                .push((method.to_string(), path.to_string(), body.to_vec()));
            fake_api::respond(201, &serde_json::json!({}))
        });
        let recorder = Recorder::new(client, "stickyvol.csi.io/overflow-check", "worker-3");
        let said = |reason| Said {
            kind: Kind::Warning,
            reason,
            action: "Evict",
            note: "x".repeat(2000),
        };
        recorder
            .record(claim("shop", "data-0", Some("u-1")), said("OnClaim"))
            .await;
        let node = cluster_scoped("v1", "Node", "worker-3", None);
        recorder.record(node, said("OnNode")).await;
        let posted = posted.lock().unwrap();
        let paths: Vec<&str> = posted.iter().map(|(_, p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/apis/events.k8s.io/v1/namespaces/shop/events",
                "/apis/events.k8s.io/v1/namespaces/default/events"
            ]
        );
        let event: serde_json::Value = serde_json::from_slice(&posted[0].2).unwrap();
        assert_eq!(event["regarding"]["uid"], "u-1");
        assert_eq!(event["reason"], "OnClaim");
        assert_eq!(event["type"], "Warning");
        assert_eq!(
            event["reportingController"],
            "stickyvol.csi.io/overflow-check"
        );
        assert_eq!(event["reportingInstance"], "worker-3");
        assert_eq!(
            event["metadata"]["generateName"],
            "stickyvol-overflow-check-"
        );
        assert!(event["note"].as_str().unwrap().len() <= NOTE_LIMIT);
        assert!(event["eventTime"].is_string());
    }
}
