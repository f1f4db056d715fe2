//! The overflow check's Kubernetes calls: evict one pod, find a claim's uid, record an Event.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions};
use kube::Client;
use kube::api::Api;
use tonic::codegen::http;

use crate::cluster::kit::events::{self, Kind, Recorder, Said};
use crate::volume::overflow::ClaimRef;
use crate::volume::state::record::PodRef;

/// What an eviction request came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evicted {
    /// The API server accepted it: the pod is being deleted, with its own grace period.
    Done,
    /// That pod is gone, or the name now belongs to another pod (uid precondition failed).
    Gone,
    /// A PodDisruptionBudget does not allow it now (429).
    RefusedByBudget(String),
    /// Anything else (the API unreachable, forbidden, ...); tried again next round.
    Failed(String),
}

/// Evicts exactly the pod kubelet published the volume for: the eviction carries the pod's uid
/// as a precondition, so a pod of the same name made since (a StatefulSet's next one) is never
/// evicted in its place. Built by hand: kube's `Api::evict` sends the options under a
/// snake_case key the API server ignores, preconditions included.
pub async fn evict(client: &Client, pod: &PodRef) -> Evicted {
    let eviction = Eviction {
        metadata: ObjectMeta {
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            ..ObjectMeta::default()
        },
        delete_options: Some(DeleteOptions {
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..DeleteOptions::default()
        }),
    };
    let mut body = match serde_json::to_value(&eviction) {
        Ok(body) => body,
        Err(err) => return Evicted::Failed(err.to_string()),
    };
    body["apiVersion"] = "policy/v1".into();
    body["kind"] = "Eviction".into();
    // Both are validated names (`request::pod_info`): nothing to escape in the path.
    let url = format!(
        "/api/v1/namespaces/{}/pods/{}/eviction",
        pod.namespace, pod.name
    );
    let request = match http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.to_string().into_bytes())
    {
        Ok(request) => request,
        Err(err) => return Evicted::Failed(err.to_string()),
    };
    match client.request::<serde_json::Value>(request).await {
        Ok(_) => Evicted::Done,
        Err(kube::Error::Api(status)) => match status.code {
            404 | 409 => Evicted::Gone,
            429 => Evicted::RefusedByBudget(status.message),
            _ => Evicted::Failed(format!(
                "{} {}: {}",
                status.code, status.reason, status.message
            )),
        },
        Err(err) => Evicted::Failed(err.to_string()),
    }
}

/// The uid of the claim bound to PV `pv_name`, so the Event shows in `kubectl describe pvc`;
/// None when it cannot be read or is bound elsewhere (a claim of that name made since).
pub async fn claim_uid(client: &Client, claim: &ClaimRef, pv_name: &str) -> Option<String> {
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &claim.namespace);
    let found = claims.get_opt(&claim.name).await.ok()??;
    let bound = found.spec.as_ref()?.volume_name.as_deref() == Some(pv_name);
    bound.then_some(found.metadata.uid).flatten()
}

/// Who writes the overflow check's Events.
pub const REPORTING_CONTROLLER: &str = "stickyvol.csi.io/overflow-check";

/// Records a Warning Event on the claim (its uid when known).
pub async fn record_event(
    recorder: &Recorder,
    claim: &ClaimRef,
    uid: Option<&str>,
    reason: &str,
    action: &str,
    note: String,
) {
    record(recorder, claim, uid, Kind::Warning, (reason, action), note).await;
}

/// Records an Event of `kind` on the claim (its uid when known): (reason, action), note.
pub async fn record(
    recorder: &Recorder,
    claim: &ClaimRef,
    uid: Option<&str>,
    kind: Kind,
    (reason, action): (&str, &str),
    note: String,
) {
    let said = Said {
        kind,
        reason,
        action,
        note,
    };
    let regarding = events::claim(&claim.namespace, &claim.name, uid);
    recorder.record(regarding, said).await;
}
