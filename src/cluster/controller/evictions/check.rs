//! What the controller checks before it evicts a pod a node asked for: the request's PV is one
//! of ours pinned to a node and bound to a claim, and the pod runs on that node and uses that
//! claim. Both are immutable in a pod once set (its node, its volumes), and the eviction names
//! the pod's uid: what was checked is what gets evicted.

use k8s_openapi::api::core::v1::PersistentVolume;

use crate::cluster::kit::affinity::pinned_by;
use crate::cluster::kit::slim::Pod;

/// What a request's PV says about where it may evict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asker {
    /// The node the PV is pinned to: the only node whose pods it may name.
    pub node: String,
    pub claim_namespace: String,
    pub claim_name: String,
    pub claim_uid: Option<String>,
    /// The volume's id, for the Events.
    pub volume: String,
}

/// The PV's asker, or why its request is not one to act on (not ours, not pinned, not bound).
pub fn asker(pv: &PersistentVolume, driver: &str, topology_key: &str) -> Result<Asker, String> {
    let spec = pv.spec.as_ref().ok_or("has no spec")?;
    let csi = spec.csi.as_ref().filter(|csi| csi.driver == driver);
    let csi = csi.ok_or_else(|| format!("is not a volume of {driver}"))?;
    let node =
        pinned_by(spec.node_affinity.as_ref(), topology_key).ok_or("is not pinned to one node")?;
    let claim = spec.claim_ref.as_ref().ok_or("is bound to no claim")?;
    match (&claim.namespace, &claim.name) {
        (Some(namespace), Some(name)) => Ok(Asker {
            node,
            claim_namespace: namespace.clone(),
            claim_name: name.clone(),
            claim_uid: claim.uid.clone(),
            volume: csi.volume_handle.clone(),
        }),
        _ => Err("is bound to no claim".into()),
    }
}

/// Ok when `pod` runs on the asker's node and uses its claim; else why not, in a sentence.
pub fn may_evict(asker: &Asker, pod: &Pod) -> Result<(), String> {
    let spec = pod.spec.as_ref();
    let node = spec.and_then(|s| s.node_name.as_deref()).unwrap_or("");
    if node != asker.node {
        let on = if node.is_empty() { "no node" } else { node };
        return Err(format!(
            "it runs on {on}, not on {}, the node that asks",
            asker.node
        ));
    }
    let pod_name = pod.metadata.name.as_deref().unwrap_or("");
    let same_namespace = pod.metadata.namespace.as_deref() == Some(&asker.claim_namespace);
    let uses_claim = spec.is_some_and(|s| {
        s.volumes.iter().any(|volume| {
            let claim = match (&volume.persistent_volume_claim, &volume.ephemeral) {
                (Some(source), _) => source.claim_name.clone(),
                // A generic ephemeral volume's claim is named after its pod and volume.
                (None, Some(_)) => format!("{pod_name}-{}", volume.name),
                (None, None) => return false,
            };
            claim == asker.claim_name
        })
    });
    if same_namespace && uses_claim {
        return Ok(());
    }
    Err(format!(
        "it does not use claim {}/{}, the volume's",
        asker.claim_namespace, asker.claim_name
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const DRIVER: &str = "stickyvol.csi.io";
    const KEY: &str = "topology.stickyvol.csi.io/node";

    fn pv(driver: &str, nodes: Value, claim: Value) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "pvc-1"},
            "spec": {
                "csi": {"driver": driver, "volumeHandle": "vol-1"},
                "claimRef": claim,
                "nodeAffinity": {"required": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": KEY, "operator": "In", "values": nodes}]}]}},
            }
        }))
        .unwrap()
    }

    fn ours() -> PersistentVolume {
        pv(
            DRIVER,
            json!(["n1"]),
            json!({"namespace": "shop", "name": "data", "uid": "c1"}),
        )
    }

    fn pod(namespace: &str, node: &str, volumes: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": namespace, "uid": "p1"},
            "spec": {"nodeName": node, "volumes": volumes},
        }))
        .unwrap()
    }

    fn claim_volume(claim: &str) -> Value {
        json!([{"name": "v", "persistentVolumeClaim": {"claimName": claim}}])
    }

    #[test]
    fn only_a_bound_pv_of_ours_pinned_to_one_node_can_ask() {
        let asker = asker(&ours(), DRIVER, KEY).unwrap();
        assert_eq!(asker.node, "n1");
        assert_eq!(
            (asker.claim_namespace.as_str(), asker.claim_name.as_str()),
            ("shop", "data")
        );
        assert_eq!(asker.volume, "vol-1");
        let claim = json!({"namespace": "shop", "name": "data"});
        let theirs = pv("other.csi.io", json!(["n1"]), claim.clone());
        assert!(
            super::asker(&theirs, DRIVER, KEY)
                .unwrap_err()
                .contains("not a volume of")
        );
        let two = pv(DRIVER, json!(["n1", "n2"]), claim);
        assert!(
            super::asker(&two, DRIVER, KEY)
                .unwrap_err()
                .contains("pinned")
        );
        let unbound = pv(DRIVER, json!(["n1"]), Value::Null);
        assert!(
            super::asker(&unbound, DRIVER, KEY)
                .unwrap_err()
                .contains("no claim")
        );
    }

    #[test]
    fn a_pod_is_evicted_only_on_the_asking_node_and_through_its_claim() {
        let asker = asker(&ours(), DRIVER, KEY).unwrap();
        assert_eq!(
            may_evict(&asker, &pod("shop", "n1", claim_volume("data"))),
            Ok(())
        );
        let elsewhere = may_evict(&asker, &pod("shop", "n2", claim_volume("data")));
        assert!(elsewhere.unwrap_err().contains("runs on n2, not on n1"));
        let unscheduled = may_evict(&asker, &pod("shop", "", claim_volume("data")));
        assert!(unscheduled.unwrap_err().contains("runs on no node"));
        let other_claim = may_evict(&asker, &pod("shop", "n1", claim_volume("logs")));
        assert!(
            other_claim
                .unwrap_err()
                .contains("does not use claim shop/data")
        );
        // Same claim name, another namespace: another claim.
        let other_namespace = may_evict(&asker, &pod("bank", "n1", claim_volume("data")));
        assert!(other_namespace.is_err());
        let none = may_evict(
            &asker,
            &pod("shop", "n1", json!([{"name": "v", "emptyDir": {}}])),
        );
        assert!(none.is_err());
    }

    #[test]
    fn a_generic_ephemeral_volume_is_used_through_the_claim_named_after_its_pod() {
        let mut asker = asker(&ours(), DRIVER, KEY).unwrap();
        asker.claim_name = "web-0-scratch".into();
        let ephemeral = json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}}]);
        assert_eq!(may_evict(&asker, &pod("shop", "n1", ephemeral)), Ok(()));
        let other = json!([{"name": "cache", "ephemeral": {"volumeClaimTemplate": {}}}]);
        assert!(may_evict(&asker, &pod("shop", "n1", other)).is_err());
    }
}
