//! Pods and StatefulSets as the controllers read them: only the fields the node-loss reconciler
//! and restore placement use. k8s-openapi's full types carry every field of a pod template, and
//! their deserializers alone grew the binary by megabytes; unknown fields are skipped here.

use std::collections::BTreeMap;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{NodeAffinity, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

/// Implements what `kube::Api` needs (through kube's blanket impl over k8s-openapi's traits).
macro_rules! resource {
    ($type:ty, $group:literal, $version:literal, $api_version:literal, $kind:literal, $plural:literal) => {
        impl k8s_openapi::Resource for $type {
            const API_VERSION: &'static str = $api_version;
            const GROUP: &'static str = $group;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = NamespaceResourceScope;
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
