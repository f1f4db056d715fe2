//! Reading what the rules need from the API: which claims are restores or clones of ours, where
//! their source is, the source node's state, and the claim's pods.
//!
//! A snapshot's node is the node tag in the handle our driver issued (`ss-<uuid>-<tag>`, see
//! `volume::state::id`), never the `managed-by` label of its content: that label steers which
//! node's csi-snapshotter takes the content, and a node plugin could rewrite it (deploy/'s
//! stickyvol-node-volumes policy now forbids that, but clusters without it remain) to pull
//! restores, and their pods, onto itself. A claim's node is its PV's node affinity. Node ids are
//! Node names (deploy/ passes `--node-id` the pod's node name).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};

use super::fits::{self, NodeFacts};
use super::rules::Location;
use crate::cluster::controller::nodeloss::observe::pinned_node;
use crate::cluster::kit::names::SELECTED_NODE;
use crate::cluster::kit::slim::Pod;
use crate::volume::state::id::{Issuer, NodeTag, SnapshotId};

const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";
/// How long a StorageClass's provisioner, or the node tags, are taken as read.
const REMEMBERED: Duration = Duration::from_secs(60);

/// What a claim's data comes from, by name in the claim's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Snapshot(String),
    Claim(String),
}

impl Source {
    pub fn describe(&self) -> String {
        match self {
            Source::Snapshot(name) => format!("VolumeSnapshot {name}"),
            Source::Claim(name) => format!("PersistentVolumeClaim {name}"),
        }
    }
}

/// A claim that may need placing: unbound, not being deleted, with a source in its namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub class: String,
    pub selected_node: Option<String>,
    pub source: Source,
}

impl Candidate {
    pub fn of(claim: &PersistentVolumeClaim) -> Option<Candidate> {
        let meta = &claim.metadata;
        let spec = claim.spec.as_ref()?;
        if meta.deletion_timestamp.is_some()
            || spec.volume_name.as_deref().is_some_and(|v| !v.is_empty())
        {
            return None;
        }
        let source = match (&spec.data_source_ref, &spec.data_source) {
            (Some(r), _) => {
                if r.namespace
                    .as_deref()
                    .is_some_and(|n| Some(n) != meta.namespace.as_deref())
                {
                    return None;
                }
                (r.api_group.as_deref(), r.kind.as_str(), &r.name)
            }
            (None, Some(s)) => (s.api_group.as_deref(), s.kind.as_str(), &s.name),
            (None, None) => return None,
        };
        let source = match source {
            (Some(SNAPSHOT_GROUP), "VolumeSnapshot", name) => Source::Snapshot(name.clone()),
            (None | Some(""), "PersistentVolumeClaim", name) => Source::Claim(name.clone()),
            _ => return None,
        };
        Some(Candidate {
            namespace: meta.namespace.clone()?,
            name: meta.name.clone()?,
            uid: meta.uid.clone()?,
            resource_version: meta.resource_version.clone()?,
            class: spec.storage_class_name.clone().filter(|c| !c.is_empty())?,
            selected_node: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(SELECTED_NODE))
                .filter(|n| !n.is_empty())
                .cloned(),
            source,
        })
    }
}

pub struct Locator {
    client: Client,
    driver: String,
    topology_key: String,
    /// StorageClass name -> whether its provisioner is ours, and when read.
    classes: HashMap<String, (bool, Instant)>,
    /// Node tag -> node name, and when the Nodes were last listed for it.
    tags: HashMap<NodeTag, String>,
    tags_listed: Option<Instant>,
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(SNAPSHOT_GROUP, "v1", kind), plural)
}

fn text<'a>(object: &'a DynamicObject, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(&object.data, |value, key| value.get(key))?
        .as_str()
        .filter(|s| !s.is_empty())
}

impl Locator {
    pub fn new(client: Client, driver: String, topology_key: String) -> Locator {
        Locator {
            client,
            driver,
            topology_key,
            classes: HashMap::new(),
            tags: HashMap::new(),
            tags_listed: None,
        }
    }

    /// Whether StorageClass `name` is ours (a class that does not exist is not).
    pub async fn class_is_ours(&mut self, name: &str) -> Result<bool, kube::Error> {
        if let Some((ours, read)) = self.classes.get(name)
            && read.elapsed() < REMEMBERED
        {
            return Ok(*ours);
        }
        let class = Api::<StorageClass>::all(self.client.clone())
            .get_opt(name)
            .await?;
        let ours = class.is_some_and(|c| c.provisioner == self.driver);
        self.classes
            .insert(name.to_string(), (ours, Instant::now()));
        Ok(ours)
    }

    pub async fn locate(&mut self, claim: &Candidate) -> Result<Location, kube::Error> {
        match &claim.source {
            Source::Snapshot(name) => self.snapshot(&claim.namespace, name).await,
            Source::Claim(name) => self.claim(&claim.namespace, name).await,
        }
    }

    async fn snapshot(&mut self, namespace: &str, name: &str) -> Result<Location, kube::Error> {
        let snapshots = resource("VolumeSnapshot", "volumesnapshots");
        let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, &snapshots);
        let Some(snapshot) = api.get_opt(name).await? else {
            return Ok(Location::NotOurs);
        };
        let Some(content) = text(&snapshot, &["status", "boundVolumeSnapshotContentName"]) else {
            return Ok(Location::NotYet(
                "the snapshot is not bound to its content yet".into(),
            ));
        };
        let contents = resource("VolumeSnapshotContent", "volumesnapshotcontents");
        let api = Api::<DynamicObject>::all_with(self.client.clone(), &contents);
        let Some(content) = api.get_opt(content).await? else {
            return Ok(Location::NotYet(
                "the snapshot's content is not there yet".into(),
            ));
        };
        if text(&content, &["spec", "driver"]) != Some(self.driver.as_str()) {
            return Ok(Location::NotOurs);
        }
        // Not the content's managed-by label: any node plugin could once rewrite it.
        let handle = text(&content, &["status", "snapshotHandle"])
            .or_else(|| text(&content, &["spec", "source", "snapshotHandle"]));
        let Some(handle) = handle else {
            return Ok(Location::NotYet("the snapshot has no handle yet".into()));
        };
        match SnapshotId::parse(handle).map(|id| id.issuer()) {
            Some(Issuer::Node(tag)) => self.node_of_tag(&tag).await.map(Location::Node),
            _ => Ok(Location::NotOurs),
        }
    }

    async fn claim(&self, namespace: &str, name: &str) -> Result<Location, kube::Error> {
        let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace);
        let Some(source) = api.get_opt(name).await? else {
            return Ok(Location::NotOurs);
        };
        let Some(pv) = source
            .spec
            .and_then(|s| s.volume_name)
            .filter(|v| !v.is_empty())
        else {
            return Ok(Location::NotYet("the source claim is not bound yet".into()));
        };
        let Some(pv) = Api::<PersistentVolume>::all(self.client.clone())
            .get_opt(&pv)
            .await?
        else {
            return Ok(Location::NotOurs);
        };
        let ours = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.driver.as_str())
            == Some(self.driver.as_str());
        Ok(match pinned_node(&pv, &self.topology_key) {
            Some(node) if ours => Location::Node(node),
            _ => Location::NotOurs,
        })
    }

    /// The name of the node whose tag this is; when no Node has it (the node is gone), a
    /// description naming the tag, which `node` then finds no Node for.
    pub(super) async fn node_of_tag(&mut self, tag: &NodeTag) -> Result<String, kube::Error> {
        let stale = self.tags_listed.is_none_or(|t| t.elapsed() >= REMEMBERED);
        if !self.tags.contains_key(tag) && stale {
            // Names only: a metadata list, from the watch cache.
            let nodes = Api::<Node>::all(self.client.clone())
                .list_metadata(&ListParams::default().match_any())
                .await?;
            self.tags = nodes
                .items
                .into_iter()
                .filter_map(|n| n.metadata.name)
                .map(|name| (NodeTag::of(&name), name))
                .collect();
            self.tags_listed = Some(Instant::now());
        }
        Ok(match self.tags.get(tag) {
            Some(name) => name.clone(),
            None => format!("with id tag {}", tag.as_str()),
        })
    }

    pub async fn node(&self, name: &str) -> Result<Option<NodeFacts>, kube::Error> {
        // "with id tag …" (`node_of_tag` for a node no longer listed) is no name: never a URL.
        if !crate::config::is_object_name(name) {
            return Ok(None);
        }
        Ok(Api::<Node>::all(self.client.clone())
            .get_opt(name)
            .await?
            .map(|n| NodeFacts::of(&n)))
    }

    /// The claim's live pods that cannot run on `node`: (pod name, why).
    pub async fn excluding_pods(
        &self,
        claim: &Candidate,
        node: &NodeFacts,
    ) -> Result<Vec<(String, String)>, kube::Error> {
        let pods = Api::<Pod>::namespaced(self.client.clone(), &claim.namespace)
            .list(&ListParams::default())
            .await?;
        Ok(pods
            .items
            .iter()
            .filter(|p| uses_claim(p, &claim.name))
            .filter_map(|p| {
                let why = fits::excluded_by(p, node)?;
                Some((p.metadata.name.clone().unwrap_or_default(), why))
            })
            .collect())
    }
}

/// Whether a pod that may still start uses claim `name`, directly or as a generic ephemeral
/// volume (whose claim is `<pod>-<volume>`).
fn uses_claim(pod: &Pod, name: &str) -> bool {
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    if finished || pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    pod.spec.iter().flat_map(|s| &s.volumes).any(|v| {
        v.persistent_volume_claim
            .as_ref()
            .is_some_and(|c| c.claim_name == name)
            || (v.ephemeral.is_some() && format!("{pod_name}-{}", v.name) == name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(spec: serde_json::Value, annotations: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "restore", "uid": "u1",
                         "resourceVersion": "7", "annotations": annotations},
            "spec": spec,
        }))
        .unwrap()
    }

    fn from_snapshot() -> serde_json::Value {
        json!({"storageClassName": "sv",
               "dataSource": {"apiGroup": SNAPSHOT_GROUP, "kind": "VolumeSnapshot", "name": "snap"}})
    }

    #[test]
    fn restores_and_clones_are_candidates_with_their_source_and_selected_node() {
        let c = Candidate::of(&claim(from_snapshot(), json!({SELECTED_NODE: "n2"}))).unwrap();
        assert_eq!(c.source, Source::Snapshot("snap".into()));
        assert_eq!(c.selected_node.as_deref(), Some("n2"));
        assert_eq!((c.class.as_str(), c.resource_version.as_str()), ("sv", "7"));
        let clone = json!({"storageClassName": "sv",
                           "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "db"}});
        let c = Candidate::of(&claim(clone, json!({}))).unwrap();
        assert_eq!(c.source, Source::Claim("db".into()));
        assert_eq!(c.selected_node, None);
    }

    #[test]
    fn bound_sourceless_foreign_and_cross_namespace_claims_are_not() {
        let mut bound = from_snapshot();
        bound["volumeName"] = json!("pv-1");
        assert_eq!(Candidate::of(&claim(bound, json!({}))), None);
        assert_eq!(
            Candidate::of(&claim(json!({"storageClassName": "sv"}), json!({}))),
            None
        );
        let populator = json!({"storageClassName": "sv",
            "dataSourceRef": {"apiGroup": "example.com", "kind": "Seed", "name": "x"}});
        assert_eq!(Candidate::of(&claim(populator, json!({}))), None);
        let elsewhere = json!({"storageClassName": "sv", "dataSourceRef": {
            "apiGroup": SNAPSHOT_GROUP, "kind": "VolumeSnapshot", "name": "s", "namespace": "other"}});
        assert_eq!(Candidate::of(&claim(elsewhere, json!({}))), None);
    }

    fn pod(name: &str, volumes: serde_json::Value, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"volumes": volumes},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn a_claim_is_used_by_live_pods_that_name_it_or_own_it_as_an_ephemeral_volume() {
        let direct = json!([{"name": "data", "persistentVolumeClaim": {"claimName": "restore"}}]);
        assert!(uses_claim(&pod("p", direct.clone(), "Pending"), "restore"));
        assert!(!uses_claim(&pod("p", direct, "Succeeded"), "restore"));
        let ephemeral = json!([{"name": "data", "ephemeral": {"volumeClaimTemplate": {}}}]);
        assert!(uses_claim(
            &pod("web", ephemeral.clone(), "Pending"),
            "web-data"
        ));
        assert!(!uses_claim(&pod("web", ephemeral, "Pending"), "restore"));
    }
}
