//! Whether a claim may be moved to a node, checked the same way by `stickyvol cluster move`
//! (before it asks) and by the controller (before it starts): the claim bound to a PV of ours
//! pinned to another node, the node there with a transfer endpoint, as has the claim's node,
//! and room for the volume where csi-provisioner publishes the node's capacity. Then the start:
//! the old PV set to Retain and the move's state saved on it, in one write, before anything
//! else happens.

use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use super::state::{MOVE_STATE, MOVING, MoveState, SavedClaim};
use crate::cluster::kit::affinity::pinned_by;
use crate::cluster::kit::names::transfer_advert;
use crate::cluster::kit::quantity;
use crate::volume::copies::adopt::disk_name_is_valid;

/// What the checks need to know of the driver.
#[derive(Debug, Clone)]
pub struct Settings {
    pub driver: String,
    pub topology_key: String,
    /// The driver's namespace: the nodes' transfer adverts and capacities are there.
    pub namespace: String,
}

/// What the checks found.
pub enum Checked {
    /// The move may start: the claim's PV, and the node it is on.
    May {
        pv: Box<PersistentVolume>,
        from: String,
    },
    /// A move of this claim has started already (its state).
    Started(Box<MoveState>),
}

/// Why a claim may not move, in a sentence; `lasting` unless the API could not be read (then
/// the controller keeps the request and looks again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub why: String,
    pub lasting: bool,
}

impl From<String> for Refusal {
    fn from(why: String) -> Refusal {
        Refusal { why, lasting: true }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// A read that failed: not the claim's fault, asked again later.
fn unreadable(what: &str, err: kube::Error) -> Refusal {
    Refusal {
        why: format!("reading {what}: {err}"),
        lasting: false,
    }
}

/// Checks that `claim` may move to node `to` (reading the data from the source node's disk
/// mounted there as `from_disk`, if given); why not, in a sentence.
pub async fn check(
    client: &Client,
    settings: &Settings,
    claim: &PersistentVolumeClaim,
    (to, from_disk): (&str, Option<&str>),
) -> Result<Checked, Refusal> {
    let named = claim_name(claim);
    let read = unreadable;
    if !crate::config::is_label_value(to) || to.is_empty() {
        return Err(format!("{to:?} is not a node name").into());
    }
    if let Some(disk) = from_disk.filter(|disk| !disk_name_is_valid(disk)) {
        let shown: String = disk.chars().take(80).collect();
        return Err(format!("{shown:?} is not a disk name (one plain name under adopt/)").into());
    }
    let volume = (claim.spec.as_ref()).and_then(|s| s.volume_name.clone());
    let bound = (claim.status.as_ref()).and_then(|s| s.phase.as_deref()) == Some("Bound");
    let (Some(volume), true) = (volume, bound) else {
        return Err(format!("claim {named} is not bound to a volume").into());
    };
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get_opt(&volume)
        .await
        .map_err(|err| read(&format!("PV {volume}"), err))?
        .ok_or_else(|| format!("claim {named}'s PV {volume} does not exist"))?;
    if let Some(state) = MoveState::on(pv.metadata.annotations.as_ref()) {
        let state = state.map_err(|why| format!("PV {volume} is being moved, but {why}"))?;
        return Ok(Checked::Started(Box::new(state)));
    }
    let from = pinned_to(&pv, settings, &named)?;
    if from == to {
        return Err(format!("claim {named} is on node {to} already").into());
    }
    let nodes = Api::<Node>::all(client.clone());
    let node = nodes
        .get_opt(to)
        .await
        .map_err(|err| read("the node", err))?;
    if node.is_none() {
        return Err(format!("there is no node {to}").into());
    }
    // From a disk, the source node is dead: only the target reads (and serves) anything.
    let serving: &[&str] = match from_disk {
        Some(_) => &[to],
        None => &[&from, to],
    };
    for node in serving {
        transfers_served(client, settings, node).await?;
    }
    room_on(client, settings, &pv, to).await?;
    Ok(Checked::May {
        pv: Box::new(pv),
        from,
    })
}

/// `namespace/name` of a claim.
pub fn claim_name(claim: &PersistentVolumeClaim) -> String {
    let meta = &claim.metadata;
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// The node `pv` is pinned to, if it is one of ours.
fn pinned_to(pv: &PersistentVolume, settings: &Settings, named: &str) -> Result<String, String> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let spec = pv.spec.as_ref();
    let ours = (spec.and_then(|s| s.csi.as_ref())).is_some_and(|c| c.driver == settings.driver);
    if !ours {
        return Err(format!(
            "claim {named}'s PV {name} is not a volume of {}",
            settings.driver
        ));
    }
    let affinity = spec.and_then(|s| s.node_affinity.as_ref());
    pinned_by(affinity, &settings.topology_key)
        .ok_or_else(|| format!("PV {name} is not pinned to one node"))
}

/// Ok when `node`'s plugin publishes a transfer endpoint.
async fn transfers_served(client: &Client, settings: &Settings, node: &str) -> Result<(), Refusal> {
    let name = transfer_advert(&settings.driver, node);
    let adverts = Api::<ConfigMap>::namespaced(client.clone(), &settings.namespace);
    match adverts.get_opt(&name).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(format!(
            "node {node} serves no transfers: no ConfigMap {}/{name} (its stickyvol node plugin is not running, or runs without --transfer-address)",
            settings.namespace
        )
        .into()),
        Err(err) => Err(unreadable(&format!("{}/{name}", settings.namespace), err)),
    }
}

/// Ok when node `to` has room for `pv`'s size in its class, as csi-provisioner publishes it
/// (CSIStorageCapacity); without a published capacity for that node and class, Ok: the
/// target's csi-provisioner then decides, and its Events on the temporary claim say why not.
async fn room_on(
    client: &Client,
    settings: &Settings,
    pv: &PersistentVolume,
    to: &str,
) -> Result<(), Refusal> {
    let spec = pv.spec.as_ref();
    let class = spec
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default();
    let size = (spec.and_then(|s| s.capacity.as_ref()))
        .and_then(|c| c.get("storage"))
        .and_then(|q| quantity::bytes(&q.0));
    let Some(size) = size else {
        return Ok(());
    };
    let capacities = Api::<CSIStorageCapacity>::namespaced(client.clone(), &settings.namespace)
        .list(&ListParams::default())
        .await
        .map_err(|err| unreadable("the nodes' capacities", err))?;
    let on_node = capacities.items.iter().filter(|c| {
        let labels = (c.node_topology.as_ref()).and_then(|t| t.match_labels.as_ref());
        c.storage_class_name == class
            && labels
                .and_then(|l| l.get(&settings.topology_key))
                .map(String::as_str)
                == Some(to)
    });
    let room = on_node
        .filter_map(|c| c.maximum_volume_size.as_ref().or(c.capacity.as_ref()))
        .filter_map(|q| quantity::bytes(&q.0))
        .max();
    match room {
        Some(room) if room < size => Err(format!(
            "node {to} has room for {room} bytes in class {class}; the volume takes {size}"
        )
        .into()),
        _ => Ok(()),
    }
}

/// Starts the move of `claim` (bound to `pv` on node `from`) to `to`: one write on the old PV,
/// Retain and the state, conditional on the PV not having changed since it was read.
pub async fn start(
    client: &Client,
    claim: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    (from, to, from_disk): (&str, &str, Option<&str>),
) -> Result<MoveState, kube::Error> {
    let spec = pv.spec.as_ref();
    let policy = spec.and_then(|s| s.persistent_volume_reclaim_policy.clone());
    let state = MoveState {
        to: to.to_string(),
        from: from.to_string(),
        claim: SavedClaim::of(claim),
        reclaim_policy: policy.unwrap_or_else(|| "Delete".into()),
        started_unix_ms: crate::volume::state::record::now_ms(),
        new_pv: None,
        copy_failures: 0,
        failure_seen_unix_ms: None,
        status: "started: the PV is kept (Retain) until the move ends".into(),
        from_disk: from_disk.map(Into::into),
    };
    let patch = json!({
        "metadata": {
            "resourceVersion": pv.metadata.resource_version,
            "labels": {MOVING: "true"},
            "annotations": {MOVE_STATE: state.to_annotation()},
        },
        "spec": {"persistentVolumeReclaimPolicy": "Retain"},
    });
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    Api::<PersistentVolume>::all(client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(state)
}
