//! What a move's next step is decided on, read from the API: the claim of the moved name, its
//! pods, the temporary claim, the new PV and its copy (`decide::Observed`).

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Client;
use kube::api::{Api, ListParams};

use super::decide::{ClaimSeen, Copy, NewPv, Observed};
use super::state::{MOVE_FINALIZER, MoveState};
use crate::cluster::kit::pull_request::{PULL_TO, PullResult};
use crate::cluster::kit::slim::Pod;

/// Reads what `state`'s next step depends on; `old_pv` is the PV the state is kept on.
pub async fn observe(
    client: &Client,
    old_pv: &str,
    state: MoveState,
) -> Result<Observed, kube::Error> {
    let namespace = &state.claim.namespace;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    let claim = claims.get_opt(&state.claim.name).await?;
    let original = claim
        .as_ref()
        .is_some_and(|c| c.metadata.uid.as_deref() == Some(&state.claim.uid));
    let pods = match original {
        true => pods_using(client, namespace, &state.claim.name).await?,
        false => vec![],
    };
    let temporary = claims.get_opt(&MoveState::temporary_claim(old_pv)).await?;
    let new_pv = match &state.new_pv {
        Some(name) => Api::<PersistentVolume>::all(client.clone())
            .get_opt(name)
            .await?
            .map(|pv| seen_pv(&pv, old_pv)),
        None => None,
    };
    Ok(Observed {
        claim: claim.as_ref().map(seen_claim),
        pods,
        temporary: temporary.as_ref().map(seen_claim),
        new_pv,
        now_unix_ms: crate::volume::state::record::now_ms(),
        state,
    })
}

pub fn seen_claim(claim: &PersistentVolumeClaim) -> ClaimSeen {
    ClaimSeen {
        uid: claim.metadata.uid.clone().unwrap_or_default(),
        volume_name: claim.spec.as_ref().and_then(|s| s.volume_name.clone()),
        bound: (claim.status.as_ref()).and_then(|s| s.phase.as_deref()) == Some("Bound"),
        deleting: claim.metadata.deletion_timestamp.is_some(),
        held: (claim.metadata.finalizers.as_deref())
            .is_some_and(|f| f.iter().any(|f| f == MOVE_FINALIZER)),
    }
}

/// The new PV: whom it is bound to, and where the copy from `old_pv` into it stands.
pub fn seen_pv(pv: &PersistentVolume, old_pv: &str) -> NewPv {
    let claim_name = (pv.spec.as_ref())
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.name.clone());
    let asked = (pv.metadata.labels.as_ref()).is_some_and(|l| l.contains_key(PULL_TO));
    let result = PullResult::on(pv.metadata.annotations.as_ref()).filter(|r| r.from == old_pv);
    let copy = match result {
        Some(PullResult {
            sha256: Some(sha256),
            bytes,
            ..
        }) => Copy::Done {
            sha256,
            bytes: bytes.unwrap_or_default(),
        },
        Some(PullResult { error, .. }) if !asked => {
            Copy::Failed(error.unwrap_or_else(|| "no reason given".into()))
        }
        _ if asked => Copy::Asked,
        _ => Copy::NotAsked,
    };
    NewPv { claim_name, copy }
}

/// `namespace/name` of the pods that use claim `name` and may still run.
pub async fn pods_using(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Vec<String>, kube::Error> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    Ok(pods
        .items
        .iter()
        .filter(|pod| uses(pod, name))
        .map(|pod| format!("{namespace}/{}", pod.metadata.name.as_deref().unwrap_or("")))
        .collect())
}

/// Whether `pod` uses claim `name`: it names it, is on a node, and has not ended. A pod not
/// scheduled yet mounts nothing: it waits for the claim (after `kubectl drain`, for the move),
/// and once the claim is being deleted neither the scheduler nor kubelet starts it with it.
pub fn uses(pod: &Pod, name: &str) -> bool {
    let phase = (pod.status.as_ref()).and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return false;
    }
    let scheduled = (pod.spec.as_ref())
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    if !scheduled {
        return false;
    }
    let volumes = pod.spec.as_ref().map(|s| s.volumes.as_slice());
    volumes.unwrap_or_default().iter().any(|volume| {
        (volume.persistent_volume_claim.as_ref()).is_some_and(|c| c.claim_name == name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_copy_stands_where_the_new_pvs_pull_annotations_say() {
        let pv = |labels: serde_json::Value, result: Option<serde_json::Value>| {
            let annotations = match result {
                Some(r) => json!({"stickyvol.csi.io/pull-result": r.to_string()}),
                None => json!({}),
            };
            let pv: PersistentVolume = serde_json::from_value(json!({
                "metadata": {"name": "pvc-new", "labels": labels, "annotations": annotations},
                "spec": {"claimRef": {"name": "sv-move-pvc-old", "uid": "tmp"}}
            }))
            .unwrap();
            seen_pv(&pv, "pvc-old")
        };
        let asked = json!({PULL_TO: "b"});
        assert_eq!(pv(json!({}), None).copy, Copy::NotAsked);
        assert_eq!(pv(asked.clone(), None).copy, Copy::Asked);
        assert_eq!(
            pv(json!({}), None).claim_name.as_deref(),
            Some("sv-move-pvc-old")
        );
        let done = json!({"from": "pvc-old", "sha256": "ab", "bytes": 3});
        let expected = Copy::Done {
            sha256: "ab".into(),
            bytes: 3,
        };
        assert_eq!(pv(json!({}), Some(done)).copy, expected);
        let failed = json!({"from": "pvc-old", "error": "refused"});
        assert_eq!(
            pv(json!({}), Some(failed.clone())).copy,
            Copy::Failed("refused".into())
        );
        // Asked again after a failure: the old result is not the answer.
        assert_eq!(pv(asked, Some(failed)).copy, Copy::Asked);
        // A result for another source is no answer to this move.
        let other = json!({"from": "pvc-other", "sha256": "ab"});
        assert_eq!(pv(json!({}), Some(other)).copy, Copy::NotAsked);
    }

    #[test]
    fn a_pod_uses_a_claim_from_its_scheduling_until_it_ends() {
        let on = |phase: &str, claim: &str, node: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "db-0"},
                "spec": {"nodeName": node,
                         "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]},
                "status": {"phase": phase}
            }))
            .unwrap()
        };
        let pod = |phase: &str, claim: &str| on(phase, claim, "a");
        // Waiting to be scheduled (a drained node's pod, waiting for the move): not a user.
        assert!(!uses(&on("Pending", "data-db-0", ""), "data-db-0"));
        assert!(uses(&pod("Running", "data-db-0"), "data-db-0"));
        assert!(uses(&pod("Pending", "data-db-0"), "data-db-0"));
        assert!(!uses(&pod("Succeeded", "data-db-0"), "data-db-0"));
        assert!(!uses(&pod("Running", "data-db-1"), "data-db-0"));
    }
}
