//! The API objects the reconciler reads, turned into `decide`'s views: only the fields the rules
//! use, so the rules never depend on the client's types.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttributesClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::decide::provenance::{OwnerView, TemplateView};
use super::decide::{
    AttributesClassView, ClaimView, ClassView, NodeView, ObjectRef, PodView, PvView,
    StatefulSetView,
};
use crate::class::{OnNodeLoss, PARAM_ON_NODE_LOSS};
pub use crate::cluster::kit::affinity::pinned_by;
use crate::cluster::kit::names::PROVISIONER_FINALIZER;
use crate::cluster::kit::slim::{self, Pod, StatefulSet};

fn created(meta: &ObjectMeta) -> Option<i64> {
    meta.creation_timestamp.as_ref().map(|t| t.0.as_second())
}

fn object(meta: &ObjectMeta) -> ObjectRef {
    ObjectRef {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
    }
}

pub fn node(node: &slim::Node) -> NodeView {
    NodeView {
        name: node.metadata.name.clone().unwrap_or_default(),
        taints: node
            .spec
            .as_ref()
            .map(|s| s.taints.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|t| t.key.clone())
            .collect(),
        ready: node
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
    }
}

/// The one node a PV's required affinity names on `topology_key` (`In` with a single value, as
/// our provisioner writes it); None for any other shape, which `decide` then leaves alone.
pub fn pinned_node(pv: &PersistentVolume, topology_key: &str) -> Option<String> {
    pinned_by(pv.spec.as_ref()?.node_affinity.as_ref(), topology_key)
}

pub fn pv(pv: &slim::PersistentVolume, topology_key: &str) -> PvView {
    let spec = pv.spec.as_ref();
    let csi = spec.and_then(|s| s.csi.as_ref());
    PvView {
        name: pv.metadata.name.clone().unwrap_or_default(),
        uid: pv.metadata.uid.clone().unwrap_or_default(),
        driver: csi.map(|c| c.driver.clone()).unwrap_or_default(),
        volume_handle: csi.map(|c| c.volume_handle.clone()).unwrap_or_default(),
        storage_class: spec
            .and_then(|s| s.storage_class_name.clone())
            .unwrap_or_default(),
        node: pinned_by(spec.and_then(|s| s.node_affinity.as_ref()), topology_key),
        claim: spec.and_then(|s| s.claim_ref.as_ref()).map(|r| ObjectRef {
            namespace: r.namespace.clone().unwrap_or_default(),
            name: r.name.clone().unwrap_or_default(),
            uid: r.uid.clone().unwrap_or_default(),
        }),
        reclaim_retain: spec.and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            == Some("Retain"),
        deleting: pv.metadata.deletion_timestamp.is_some(),
        provisioner_finalizer: pv
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == PROVISIONER_FINALIZER)),
        attributes_class: spec
            .and_then(|s| s.volume_attributes_class_name.clone())
            .filter(|name| !name.is_empty()),
    }
}

pub fn attributes_class(class: &VolumeAttributesClass) -> AttributesClassView {
    AttributesClassView {
        name: class.metadata.name.clone().unwrap_or_default(),
        driver: class.driver_name.clone(),
        on_node_loss: class
            .parameters
            .as_ref()
            .and_then(|p| p.get(PARAM_ON_NODE_LOSS))
            .map(|value| OnNodeLoss::parse(Some(value))),
    }
}

pub fn claim(claim: &PersistentVolumeClaim) -> ClaimView {
    ClaimView {
        object: object(&claim.metadata),
        volume_name: claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default(),
        deleting: claim.metadata.deletion_timestamp.is_some(),
        created: created(&claim.metadata),
        labels: claim.metadata.labels.clone().unwrap_or_default(),
        owners: claim
            .metadata
            .owner_references
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|o| OwnerView {
                api_version: o.api_version.clone(),
                kind: o.kind.clone(),
                name: o.name.clone(),
                uid: o.uid.clone(),
                controller: o.controller == Some(true),
            })
            .collect(),
    }
}

pub fn pod(pod: &Pod) -> PodView {
    let spec = pod.spec.as_ref();
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    PodView {
        object: object(&pod.metadata),
        node: spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
        claims: spec
            .map(|s| s.volumes.as_slice())
            .unwrap_or_default()
            .iter()
            .filter_map(|v| v.persistent_volume_claim.as_ref())
            .map(|c| c.claim_name.clone())
            .collect(),
        statefulset_uid: pod
            .metadata
            .owner_references
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|o| {
                o.controller == Some(true) && o.kind == "StatefulSet" && o.api_version == "apps/v1"
            })
            .map(|o| o.uid.clone()),
        deleting: pod.metadata.deletion_timestamp.is_some(),
        finished: matches!(phase, Some("Succeeded" | "Failed")),
    }
}

pub fn statefulset(set: &StatefulSet) -> StatefulSetView {
    let spec = set.spec.as_ref();
    StatefulSetView {
        object: object(&set.metadata),
        created: created(&set.metadata),
        selector: spec
            .and_then(|s| s.selector.as_ref())
            .map(|s| s.match_labels.clone())
            .unwrap_or_default(),
        templates: spec
            .map(|s| s.volume_claim_templates.as_slice())
            .unwrap_or_default()
            .iter()
            .filter_map(|t| {
                Some(TemplateView {
                    name: t.metadata.name.clone()?,
                    labels: t.metadata.labels.clone(),
                })
            })
            .collect(),
    }
}

pub fn class(class: &StorageClass) -> ClassView {
    ClassView {
        name: class.metadata.name.clone().unwrap_or_default(),
        provisioner: class.provisioner.clone(),
        on_node_loss: OnNodeLoss::of_class(class.parameters.as_ref().unwrap_or(&BTreeMap::new())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const KEY: &str = "topology.stickyvol.csi.io/node";

    fn pv_with(terms: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "pv"},
            "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": terms}}}
        }))
        .unwrap()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> serde_json::Value {
        json!({"key": key, "operator": op, "values": values})
    }

    #[test]
    fn a_pv_is_pinned_only_by_one_in_value_on_our_key() {
        let pinned = |terms| pinned_node(&pv_with(terms), KEY);
        assert_eq!(
            pinned(json!([{"matchExpressions": [expr(KEY, "In", &["b"])]}])),
            Some("b".into())
        );
        // Other keys beside ours do not matter; the same node twice is still one node.
        assert_eq!(
            pinned(json!([
                {"matchExpressions": [expr("zone", "In", &["z1", "z2"]), expr(KEY, "In", &["b"])]},
                {"matchExpressions": [expr(KEY, "In", &["b"])]}
            ])),
            Some("b".into())
        );
        // Anything else on our key is not a shape our provisioner writes: no node, no decision.
        for terms in [
            json!([{"matchExpressions": [expr(KEY, "In", &["a", "b"])]}]),
            json!([{"matchExpressions": [expr(KEY, "NotIn", &["b"])]}]),
            json!([{"matchExpressions": [expr(KEY, "In", &[])]}]),
            json!([
                {"matchExpressions": [expr(KEY, "In", &["a"])]},
                {"matchExpressions": [expr(KEY, "In", &["b"])]}
            ]),
            json!([{"matchExpressions": [expr("other", "In", &["b"])]}]),
            json!([]),
        ] {
            assert_eq!(pinned(terms.clone()), None, "{terms}");
        }
        let bare: PersistentVolume = serde_json::from_value(json!({"metadata": {}})).unwrap();
        assert_eq!(pinned_node(&bare, KEY), None);
        let bare: slim::PersistentVolume = serde_json::from_value(json!({"metadata": {}})).unwrap();
        assert_eq!(pv(&bare, KEY).driver, "");
        assert_eq!(pv(&bare, KEY).node, None);
        assert!(!pv(&bare, KEY).deleting);
        let held: slim::PersistentVolume = serde_json::from_value(json!({"metadata": {
            "deletionTimestamp": "2026-11-26T08:00:00Z", "finalizers": ["kubernetes.io/pv-protection"]
        }}))
        .unwrap();
        assert!(pv(&held, KEY).deleting);
        assert!(!pv(&held, KEY).provisioner_finalizer);
        let ours: slim::PersistentVolume = serde_json::from_value(json!({"metadata": {
            "finalizers": ["kubernetes.io/pv-protection", PROVISIONER_FINALIZER]
        }}))
        .unwrap();
        assert!(pv(&ours, KEY).provisioner_finalizer);
    }

    #[test]
    fn a_pod_belongs_to_the_statefulset_that_controls_it() {
        let pod_with = |owners: serde_json::Value, phase: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "ns", "uid": "u", "ownerReferences": owners},
                "spec": {"containers": [], "nodeName": "",
                         "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}},
                                     {"name": "e", "emptyDir": {}}]},
                "status": {"phase": phase}
            }))
            .unwrap()
        };
        let owner = |kind: &str, api: &str, controller: bool| json!([{"apiVersion": api, "kind": kind, "name": "db", "uid": "uid-db", "controller": controller}]);
        let view = pod(&pod_with(owner("StatefulSet", "apps/v1", true), "Pending"));
        assert_eq!(view.statefulset_uid.as_deref(), Some("uid-db"));
        assert_eq!(view.claims, ["c"]);
        assert_eq!(view.node, None, "an empty nodeName is unscheduled");
        assert!(!view.finished);
        for owners in [
            owner("StatefulSet", "apps/v1", false),
            owner("ReplicaSet", "apps/v1", true),
            owner("StatefulSet", "example.com/v1", true),
        ] {
            assert_eq!(
                pod(&pod_with(owners.clone(), "Pending")).statefulset_uid,
                None,
                "{owners}"
            );
        }
        for phase in ["Succeeded", "Failed"] {
            assert!(pod(&pod_with(json!([]), phase)).finished);
        }
    }

    #[test]
    fn claims_and_statefulsets_carry_what_provenance_compares() {
        let set: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "ns", "uid": "u",
                         "creationTimestamp": "2026-11-27T07:00:00Z"},
            "spec": {"selector": {"matchLabels": {"app": "db"},
                                  "matchExpressions": [{"key": "x", "operator": "Exists"}]},
                     "volumeClaimTemplates": [
                        {"metadata": {"name": "data", "labels": {"tier": "storage"}}},
                        {"metadata": {}}]}
        }))
        .unwrap();
        let view = statefulset(&set);
        assert_eq!(view.created, Some(1_795_762_800));
        assert_eq!(view.selector.get("app").map(String::as_str), Some("db"));
        assert_eq!(view.selector.len(), 1, "only matchLabels go onto claims");
        assert_eq!(
            view.templates.len(),
            1,
            "a template without a name is no template"
        );
        assert_eq!(view.templates[0].name, "data");
        assert_eq!(view.templates[0].labels.len(), 1);
        let bare: StatefulSet = serde_json::from_value(json!({"metadata": {}})).unwrap();
        let bare = statefulset(&bare);
        assert_eq!((bare.created, bare.selector.len()), (None, 0));
        let c: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data-db-0", "namespace": "ns", "uid": "c",
                         "creationTimestamp": "2026-11-27T07:00:05Z", "labels": {"app": "db"},
                         "ownerReferences": [
                            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                             "uid": "u", "controller": true},
                            {"apiVersion": "v1", "kind": "Pod", "name": "db-0", "uid": "p"}]}
        }))
        .unwrap();
        let view = claim(&c);
        assert_eq!(view.created, Some(1_795_762_805));
        assert_eq!(view.labels.get("app").map(String::as_str), Some("db"));
        assert_eq!(
            view.owners
                .iter()
                .map(|o| (o.kind.as_str(), o.controller))
                .collect::<Vec<_>>(),
            [("StatefulSet", true), ("Pod", false)]
        );
    }

    #[test]
    fn nodes_report_taint_keys_and_readiness() {
        let n: slim::Node = serde_json::from_value(json!({
            "metadata": {"name": "b"},
            "spec": {"taints": [{"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}]},
            "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}
        }))
        .unwrap();
        let view = node(&n);
        assert_eq!(view.taints, ["node.kubernetes.io/out-of-service"]);
        assert!(!view.ready);
    }
}
