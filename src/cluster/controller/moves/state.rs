//! What a move keeps, and where: its state on the *old* PV (the one object that lives through
//! the whole move: kept with Retain from the first step, deleted only at the last), as JSON in
//! one annotation, with a label so the controller lists only PVs being moved. The claim is
//! saved there too, as it was when the move began: it is deleted and made again, bound to the
//! new PV, with its labels, annotations and owners.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::{Deserialize, Serialize};

use crate::cluster::kit::names::{MOVE_FROM_DISK, MOVE_TO, SELECTED_NODE};

/// On a claim: a move is asked for (with `stickyvol.csi.io/move-to` naming the node).
pub const MOVE_REQUESTED: &str = "stickyvol.csi.io/move-requested";
/// On the old PV while it is moved (a label), and its `MoveState` (an annotation).
pub const MOVING: &str = "stickyvol.csi.io/moving";
pub const MOVE_STATE: &str = "stickyvol.csi.io/move";
/// On the claim while it is copied: deleted, it stays (so that no pod starts with it and no
/// StatefulSet makes it again) until the move lets it go.
pub const MOVE_FINALIZER: &str = "stickyvol.csi.io/move";
/// On the temporary claim that has the new volume provisioned on the target node: the old PV.
pub const MOVE_OF: &str = "stickyvol.csi.io/move-of";

/// Annotations the claim does not keep when it is made again: the binding's, which Kubernetes
/// sets anew, the scheduler's choice of node, and the request for this move.
const NOT_KEPT: [&str; 5] = [
    "pv.kubernetes.io/bind-completed",
    "pv.kubernetes.io/bound-by-controller",
    SELECTED_NODE,
    MOVE_TO,
    MOVE_FROM_DISK,
];

/// A move in progress, as kept on the old PV.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MoveState {
    /// The node the volume goes to, and the one it comes from.
    pub to: String,
    pub from: String,
    pub claim: SavedClaim,
    /// The old PV's reclaim policy before the move set Retain: the new PV gets it at the end.
    pub reclaim_policy: String,
    pub started_unix_ms: u64,
    /// The PV on `to`, once provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_pv: Option<String>,
    /// Copies that failed, and when the last failure was seen (the next try waits).
    #[serde(default)]
    pub copy_failures: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_seen_unix_ms: Option<u64>,
    /// What the move does or waits for now, in a sentence (`stickyvol cluster move` shows it).
    #[serde(default)]
    pub status: String,
    /// The source node's disk, attached to the target and mounted there under this name, to
    /// read the data from (the source node is dead); None: from the source node's plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_disk: Option<String>,
}

/// The claim as it was when the move began.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SavedClaim {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub owner_references: Vec<OwnerReference>,
    pub spec: PersistentVolumeClaimSpec,
}

impl MoveState {
    /// The state kept on `pv`, if it carries one that can be read.
    pub fn on(annotations: Option<&BTreeMap<String, String>>) -> Option<Result<Self, String>> {
        let text = annotations?.get(MOVE_STATE)?;
        Some(
            serde_json::from_str(text).map_err(|err| format!("its {MOVE_STATE} annotation: {err}")),
        )
    }

    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// `namespace/name` of the claim moved.
    pub fn claim_name(&self) -> String {
        format!("{}/{}", self.claim.namespace, self.claim.name)
    }

    /// The name of the temporary claim that has the new volume provisioned on `to`.
    pub fn temporary_claim(old_pv: &str) -> String {
        let mut name = format!("sv-move-{old_pv}");
        name.truncate(253);
        name
    }
}

impl SavedClaim {
    /// `claim` as a move saves it: what makes it again, without the binding's traces.
    pub fn of(claim: &PersistentVolumeClaim) -> SavedClaim {
        let meta = &claim.metadata;
        let mut labels = meta.labels.clone().unwrap_or_default();
        labels.remove(MOVE_REQUESTED);
        let mut annotations = meta.annotations.clone().unwrap_or_default();
        for key in NOT_KEPT {
            annotations.remove(key);
        }
        let mut spec = claim.spec.clone().unwrap_or_default();
        // Made again bound to a volume that exists: nothing to select, provision or fill.
        spec.volume_name = None;
        spec.selector = None;
        spec.data_source = None;
        spec.data_source_ref = None;
        SavedClaim {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            labels,
            annotations,
            owner_references: meta.owner_references.clone().unwrap_or_default(),
            spec,
        }
    }

    /// The claim to create, bound to PV `pv`, with the owners that still exist.
    pub fn again(&self, pv: &str, owners: Vec<OwnerReference>) -> PersistentVolumeClaim {
        let mut spec = self.spec.clone();
        spec.volume_name = Some(pv.to_string());
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(self.labels.clone()),
                annotations: Some(self.annotations.clone()),
                owner_references: (!owners.is_empty()).then_some(owners),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
            status: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim() -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {
                "name": "data-db-0", "namespace": "shop", "uid": "u-1",
                "labels": {"app": "db", MOVE_REQUESTED: "true"},
                "annotations": {
                    "pv.kubernetes.io/bind-completed": "yes",
                    "pv.kubernetes.io/bound-by-controller": "yes",
                    "volume.kubernetes.io/selected-node": "a",
                    "volume.kubernetes.io/storage-provisioner": "stickyvol.csi.io",
                    MOVE_TO: "b",
                    "team": "payments"
                },
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "s-1"}],
                "finalizers": ["kubernetes.io/pvc-protection"],
                "resourceVersion": "7"
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": "stickyvol",
                "volumeMode": "Block", "volumeName": "pvc-old",
                "resources": {"requests": {"storage": "1Gi"}},
                "dataSource": {"kind": "PersistentVolumeClaim", "name": "seed"}
            },
            "status": {"phase": "Bound"}
        }))
        .unwrap()
    }

    #[test]
    fn a_claim_is_saved_without_its_binding_and_made_again_bound_to_the_new_pv() {
        let saved = SavedClaim::of(&claim());
        assert_eq!(saved.labels, BTreeMap::from([("app".into(), "db".into())]));
        let kept: Vec<&str> = saved.annotations.keys().map(String::as_str).collect();
        // The provisioner's annotation stays: the claim remains one this driver provisions.
        assert_eq!(kept, ["team", "volume.kubernetes.io/storage-provisioner"]);
        let again = saved.again("pvc-new", saved.owner_references.clone());
        let json = serde_json::to_value(&again).unwrap();
        assert_eq!(json["spec"]["volumeName"], "pvc-new");
        assert_eq!(json["spec"]["volumeMode"], "Block");
        assert_eq!(json["spec"]["resources"]["requests"]["storage"], "1Gi");
        assert!(json["spec"].get("dataSource").is_none());
        assert_eq!(json["metadata"]["ownerReferences"][0]["name"], "db");
        for absent in ["uid", "resourceVersion", "finalizers"] {
            assert!(json["metadata"].get(absent).is_none(), "{absent}");
        }
        assert!(json.get("status").is_none());
        let orphaned = saved.again("pvc-new", vec![]);
        assert!(orphaned.metadata.owner_references.is_none());
    }

    #[test]
    fn the_state_reads_back_as_written_and_a_damaged_one_says_so() {
        let state = MoveState {
            to: "b".into(),
            from: "a".into(),
            claim: SavedClaim::of(&claim()),
            reclaim_policy: "Delete".into(),
            started_unix_ms: 1,
            new_pv: Some("pvc-new".into()),
            copy_failures: 0,
            failure_seen_unix_ms: None,
            status: "copying".into(),
            from_disk: Some("disk-a".into()),
        };
        let annotations = BTreeMap::from([(MOVE_STATE.to_string(), state.to_annotation())]);
        assert_eq!(MoveState::on(Some(&annotations)), Some(Ok(state)));
        let damaged = BTreeMap::from([(MOVE_STATE.to_string(), "{".to_string())]);
        assert!(MoveState::on(Some(&damaged)).unwrap().is_err());
        assert_eq!(MoveState::on(None), None);
        assert_eq!(MoveState::temporary_claim("pvc-1"), "sv-move-pvc-1");
    }
}
