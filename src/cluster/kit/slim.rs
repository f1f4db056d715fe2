//! Pods, StatefulSets, Nodes and PVs as the controllers read them: only the fields the node-loss
//! reconciler, restore placement and the orphan check use. k8s-openapi's full types carry every
//! field of a pod template, and their deserializers alone grew the binary by megabytes; unknown
//! fields are skipped here. Nodes and PVs are watched cluster-wide: their metadata keeps only
//! what identifies them (`Meta`), never labels, annotations or managed fields, so a Node of a
//! real cluster (10–15 KB of JSON, mostly its images) costs a few hundred bytes while read.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeAffinity, Toleration, VolumeNodeAffinity};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use serde::{Deserialize, Deserializer};

/// Implements what `kube::Api` needs (through kube's blanket impl over k8s-openapi's traits).
macro_rules! resource {
    ($type:ty, $group:literal, $version:literal, $api_version:literal, $kind:literal, $plural:literal) => {
        resource!(
            $type,
            $group,
            $version,
            $api_version,
            $kind,
            $plural,
            NamespaceResourceScope
        );
    };
    ($type:ty, $group:literal, $version:literal, $api_version:literal, $kind:literal, $plural:literal, $scope:ty) => {
        impl k8s_openapi::Resource for $type {
            const API_VERSION: &'static str = $api_version;
            const GROUP: &'static str = $group;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $scope;
        }

        impl k8s_openapi::Metadata for $type {
            type Ty = ObjectMeta;

            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Pod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<PodSpec>,
    pub status: Option<PodStatus>,
}
resource!(Pod, "", "v1", "v1", "Pod", "pods");

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    pub node_name: Option<String>,
    #[serde(default)]
    pub volumes: Vec<PodVolume>,
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    pub affinity: Option<Affinity>,
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
}

/// Only node affinity: what a pod says about nodes, not about other pods.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Affinity {
    pub node_affinity: Option<NodeAffinity>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodVolume {
    #[serde(default)]
    pub name: String,
    pub persistent_volume_claim: Option<ClaimSource>,
    /// A generic ephemeral volume: its claim is named `<pod>-<volume>`.
    pub ephemeral: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSource {
    #[serde(default)]
    pub claim_name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodStatus {
    pub phase: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StatefulSet {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<StatefulSetSpec>,
}
resource!(
    StatefulSet,
    "apps",
    "v1",
    "apps/v1",
    "StatefulSet",
    "statefulsets"
);

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatefulSetSpec {
    pub selector: Option<Selector>,
    #[serde(default)]
    pub volume_claim_templates: Vec<ClaimTemplate>,
}

/// Only `matchLabels`: the StatefulSet controller copies those, not `matchExpressions`, onto
/// the claims it makes.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Selector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClaimTemplate {
    #[serde(default)]
    pub metadata: TemplateMeta,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct TemplateMeta {
    pub name: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// The metadata of a watched Node or PV: what identifies it, and whether it is going.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
}

fn meta<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    let meta = Meta::deserialize(deserializer)?;
    Ok(ObjectMeta {
        name: meta.name,
        uid: meta.uid,
        resource_version: meta.resource_version,
        deletion_timestamp: meta.deletion_timestamp,
        finalizers: meta.finalizers,
        ..ObjectMeta::default()
    })
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Node {
    #[serde(default, deserialize_with = "meta")]
    pub metadata: ObjectMeta,
    pub spec: Option<NodeSpec>,
    pub status: Option<NodeStatus>,
}
resource!(Node, "", "v1", "v1", "Node", "nodes", ClusterResourceScope);

#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeSpec {
    #[serde(default)]
    pub taints: Vec<Taint>,
}

/// Only the key: Kubernetes itself looks at nothing else of the out-of-service taint.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Taint {
    #[serde(default)]
    pub key: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeStatus {
    #[serde(default)]
    pub conditions: Vec<NodeCondition>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeCondition {
    #[serde(default, rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub status: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct PersistentVolume {
    #[serde(default, deserialize_with = "meta")]
    pub metadata: ObjectMeta,
    pub spec: Option<PersistentVolumeSpec>,
}
resource!(
    PersistentVolume,
    "",
    "v1",
    "v1",
    "PersistentVolume",
    "persistentvolumes",
    ClusterResourceScope
);

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeSpec {
    pub csi: Option<CsiSource>,
    pub storage_class_name: Option<String>,
    pub claim_ref: Option<ClaimRef>,
    pub persistent_volume_reclaim_policy: Option<String>,
    pub node_affinity: Option<VolumeNodeAffinity>,
    /// The VolumeAttributesClass in effect (csi-resizer sets it once a change is carried out).
    pub volume_attributes_class_name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CsiSource {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub volume_handle: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClaimRef {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub uid: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_watched_node_keeps_no_labels_annotations_or_images() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "a", "uid": "u", "resourceVersion": "7",
                         "labels": {"x": "y"}, "annotations": {"a": "b"},
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"taints": [{"key": "k", "effect": "NoExecute"}], "podCIDR": "10.0.0.0/24"},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                       "images": [{"names": ["i"], "sizeBytes": 1}]}
        }))
        .unwrap();
        assert_eq!(node.metadata.name.as_deref(), Some("a"));
        assert_eq!(node.metadata.resource_version.as_deref(), Some("7"));
        assert!(node.metadata.labels.is_none() && node.metadata.annotations.is_none());
        assert!(node.metadata.managed_fields.is_none());
        assert_eq!(node.spec.unwrap().taints[0].key, "k");
        assert_eq!(node.status.unwrap().conditions[0].type_, "Ready");
    }
}
