//! The Eviction API call: one pod, named by uid, with its own grace period. Only the
//! controller makes it, for a pod `check` found on the asking node and using its volume.

use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions};
use kube::Client;
use tonic::codegen::http;

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
    /// Not sent: the pod is not one the asking node may have evicted (`check` says why).
    NotAllowed(String),
    /// Anything else (the API unreachable, forbidden, ...); tried again at the next request.
    Failed(String),
}

impl Evicted {
    /// The `result` label it is counted under in `stickyvol_overflow_evictions_total`.
    pub fn result(&self) -> &'static str {
        match self {
            Evicted::Done => "evicted",
            Evicted::Gone => "gone",
            Evicted::RefusedByBudget(_) => "refused",
            Evicted::NotAllowed(_) => "not_allowed",
            Evicted::Failed(_) => "failed",
        }
    }
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
    // Both are validated names (`eviction_request::parse`): nothing to escape in the path.
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
