//! The overflow check's Kubernetes calls: ask the controller to evict a volume's pods (or take
//! the request back), find a claim's uid, record an Event.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

use crate::cluster::kit::events::{self, Kind, Recorder, Said};
use crate::cluster::kit::eviction_request::{self, EvictionRequest};
use crate::volume::overflow::ClaimRef;

/// Writes `request` on PV `pv_name` (None: takes any request off it). A node has no eviction
/// right of its own: the controller reads the request, checks each pod and evicts
/// (`kit::eviction_request`). A PV already gone is no error: nothing is left to ask for.
pub async fn ask(
    client: &Client,
    pv_name: &str,
    request: Option<&EvictionRequest>,
) -> Result<(), kube::Error> {
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let patch = Patch::Merge(eviction_request::merge_patch(request));
    match pvs.patch(pv_name, &PatchParams::default(), &patch).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(err),
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
