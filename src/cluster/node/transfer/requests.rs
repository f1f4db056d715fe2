//! Pulls asked for on a PV (what the controller's move will ask, and an admin can ask by hand):
//! a PV of this node labelled `stickyvol.csi.io/pull-to=<this node>` and annotated
//! `stickyvol.csi.io/pull-from=<source PV>` has its volume filled from that PV's volume
//! (`target::Puller`; or, annotated `stickyvol.csi.io/pull-from-disk=<disk>`, from the source
//! node's disk mounted here: `disk`), and the outcome written back on it as
//! `stickyvol.csi.io/pull-result`
//! (the source and the checksum, or why not), the label taken off. The node writes only its own
//! PVs (the policy `stickyvol-node-volumes`); the source decides whether to give
//! (`stickyvol.csi.io/move-to` on its PV). A pull cut by a restart is done again: the label is
//! still there and no result names that source.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tracing::{info, warn};

use super::target::{PullError, Puller};
use crate::cluster::kit::affinity::pinned_by;
use crate::cluster::kit::pull_request::{
    PULL_CLAIM, PULL_FROM, PULL_FROM_DISK, PULL_RESULT, PULL_TO, PullResult,
};
use crate::config::is_object_name;
use crate::volume::state::id::VolumeId;

/// What to do with a PV the watch gives: pull into `volume` from `from`, or nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum Wanted {
    Pull {
        volume: String,
        from: String,
        /// The claim (namespace, name) to record for the volume once filled.
        claim: Option<(String, String)>,
        /// The source node's disk mounted here, to read from instead of that node's plugin.
        disk: Option<String>,
    },
    Nothing,
}

/// Whether `pv` asks this node for a pull it has not done yet.
pub fn wanted(pv: &PersistentVolume, (driver, topology_key, node): (&str, &str, &str)) -> Wanted {
    let labelled = (pv.metadata.labels.as_ref()).and_then(|l| l.get(PULL_TO));
    let annotations = pv.metadata.annotations.clone().unwrap_or_default();
    let (Some(to), Some(from)) = (labelled, annotations.get(PULL_FROM)) else {
        return Wanted::Nothing;
    };
    let spec = pv.spec.as_ref();
    let csi = spec
        .and_then(|s| s.csi.as_ref())
        .filter(|c| c.driver == driver);
    let pinned = pinned_by(spec.and_then(|s| s.node_affinity.as_ref()), topology_key);
    let (Some(csi), true) = (csi, to == node && pinned.as_deref() == Some(node)) else {
        return Wanted::Nothing;
    };
    let done = PullResult::on(Some(&annotations)).is_some_and(|result| &result.from == from);
    if done {
        return Wanted::Nothing;
    }
    let claim = (annotations.get(PULL_CLAIM))
        .and_then(|claim| claim.split_once('/'))
        .filter(|(namespace, name)| is_object_name(namespace) && is_object_name(name))
        .map(|(namespace, name)| (namespace.to_string(), name.to_string()));
    Wanted::Pull {
        volume: csi.volume_handle.clone(),
        from: from.clone(),
        claim,
        disk: annotations.get(PULL_FROM_DISK).cloned(),
    }
}

/// Watches this node's PVs labelled for a pull and does each, until the task is dropped.
pub async fn run(puller: Arc<Puller>) {
    let settings = &puller.settings;
    let selector = format!("{PULL_TO}={}", settings.node);
    let pvs = Api::<PersistentVolume>::all(puller.client.clone());
    let config = watcher::Config::default().labels(&selector);
    let mut changes = watcher(pvs, config)
        .default_backoff()
        .applied_objects()
        .boxed();
    let running: Arc<Mutex<HashSet<String>>> = Arc::default();
    while let Some(change) = changes.next().await {
        let pv = match change {
            Ok(pv) => pv,
            Err(err) => {
                warn!(error = %err, "transfer: watching this node's pull requests failed; retrying");
                continue;
            }
        };
        let ours = (
            settings.driver.as_str(),
            settings.topology_key.as_str(),
            settings.node.as_str(),
        );
        let Wanted::Pull {
            volume,
            from,
            claim,
            disk,
        } = wanted(&pv, ours)
        else {
            continue;
        };
        let name = pv.metadata.name.clone().unwrap_or_default();
        if !running.lock().unwrap().insert(name.clone()) {
            continue;
        }
        let (puller, running) = (puller.clone(), running.clone());
        tokio::spawn(async move {
            pull_and_answer(&puller, &name, (&volume, claim), (&from, disk)).await;
            running.lock().unwrap().remove(&name);
        });
    }
}

/// Does one pull (then records the volume's claim, if the PV names one) and writes its result
/// on PV `name`.
async fn pull_and_answer(
    puller: &Puller,
    name: &str,
    (volume, claim): (&str, Option<(String, String)>),
    (from, disk): (&str, Option<String>),
) {
    let result = match VolumeId::parse(volume) {
        None => Err(format!(
            "PV {name} names no volume of this driver: {volume:?}"
        )),
        Some(id) => pull_for_claim(puller, &id, (from, disk), claim).await,
    };
    let answer = match &result {
        Ok(pulled) => {
            info!(pv = name, from, bytes = pulled.stream_bytes, sha256 = %pulled.sha256, "transfer: pull asked on a PV done");
            PullResult {
                from: from.to_string(),
                sha256: Some(pulled.sha256.clone()),
                bytes: Some(pulled.stream_bytes),
                error: None,
            }
        }
        Err(why) => {
            warn!(pv = name, from, why, "transfer: pull asked on a PV failed");
            PullResult {
                from: from.to_string(),
                sha256: None,
                bytes: None,
                error: Some(why.clone()),
            }
        }
    };
    let patch = json!({"metadata": {
        "labels": {PULL_TO: null},
        "annotations": {PULL_RESULT: serde_json::to_string(&answer).unwrap_or_default()},
    }});
    let pvs = Api::<PersistentVolume>::all(puller.client.clone());
    if let Err(err) = pvs
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        warn!(pv = name, error = %err, "transfer: could not write a pull's result on its PV");
    }
}

/// Pulls into `id` from PV `from` (from its node's `disk` mounted here, if given); then names
/// `claim` in the volume's record.
async fn pull_for_claim(
    puller: &Puller,
    id: &VolumeId,
    (from, disk): (&str, Option<String>),
    claim: Option<(String, String)>,
) -> Result<super::target::Pulled, String> {
    let pulled = match disk {
        Some(disk) => puller.adopt(id, from, &disk).await,
        None => puller.pull(id, from).await,
    };
    let pulled = pulled.map_err(|err| match err {
        PullError::Refused(why) | PullError::Unreachable(why) => why,
        PullError::Import(err) => err.to_string(),
    })?;
    if let Some((namespace, name)) = claim {
        let volumes = puller.volumes.clone();
        let id = id.clone();
        let named = tokio::task::spawn_blocking(move || volumes.name_claim(&id, &namespace, &name));
        match named.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => return Err(format!("recording the volume's claim: {err}")),
            Err(err) => return Err(format!("recording the volume's claim: {err}")),
        }
    }
    Ok(pulled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const KEY: &str = "topology.stickyvol.csi.io/node";
    const OURS: (&str, &str, &str) = ("stickyvol.csi.io", KEY, "b");

    fn pv(
        label: Option<&str>,
        from: Option<&str>,
        result: Option<Value>,
        node: &str,
    ) -> PersistentVolume {
        let mut labels = json!({});
        if let Some(to) = label {
            labels[PULL_TO] = json!(to);
        }
        let mut annotations = json!({});
        if let Some(from) = from {
            annotations[PULL_FROM] = json!(from);
        }
        if let Some(result) = result {
            annotations[PULL_RESULT] = json!(result.to_string());
        }
        serde_json::from_value(json!({
            "metadata": {"name": "pvc-new", "labels": labels, "annotations": annotations},
            "spec": {"csi": {"driver": "stickyvol.csi.io", "volumeHandle": "sv-new"},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": KEY, "operator": "In", "values": [node]}]}]}}}
        }))
        .unwrap()
    }

    #[test]
    fn a_pv_of_this_node_asking_for_a_pull_not_done_yet_is_pulled_once() {
        let asked = pv(Some("b"), Some("pvc-old"), None, "b");
        let pull = Wanted::Pull {
            volume: "sv-new".into(),
            from: "pvc-old".into(),
            claim: None,
            disk: None,
        };
        assert_eq!(wanted(&asked, OURS), pull);
        let mut from_disk = asked.clone();
        (from_disk.metadata.annotations.as_mut().unwrap())
            .insert(PULL_FROM_DISK.into(), "disk-a".into());
        assert_eq!(
            wanted(&from_disk, OURS),
            Wanted::Pull {
                volume: "sv-new".into(),
                from: "pvc-old".into(),
                claim: None,
                disk: Some("disk-a".into()),
            },
            "from the source node's disk mounted here"
        );
        let done = json!({"from": "pvc-old", "sha256": "ab"});
        assert_eq!(
            wanted(&pv(Some("b"), Some("pvc-old"), Some(done), "b"), OURS),
            Wanted::Nothing
        );
        let earlier = json!({"from": "pvc-older", "error": "x"});
        assert_eq!(
            wanted(&pv(Some("b"), Some("pvc-old"), Some(earlier), "b"), OURS),
            pull
        );
        assert_eq!(
            wanted(&pv(Some("b"), None, None, "b"), OURS),
            Wanted::Nothing
        );
        assert_eq!(
            wanted(&pv(None, Some("pvc-old"), None, "b"), OURS),
            Wanted::Nothing
        );
        // The claim the volume is for, when the PV names one (and only a well-formed one).
        let mut named = pv(Some("b"), Some("pvc-old"), None, "b");
        let annotations = named.metadata.annotations.as_mut().unwrap();
        annotations.insert(PULL_CLAIM.into(), "shop/data-0".into());
        let Wanted::Pull { claim, .. } = wanted(&named, OURS) else {
            panic!("a pull is wanted")
        };
        assert_eq!(claim, Some(("shop".into(), "data-0".into())));
        let annotations = named.metadata.annotations.as_mut().unwrap();
        annotations.insert(PULL_CLAIM.into(), "shop/../etc".into());
        assert!(matches!(
            wanted(&named, OURS),
            Wanted::Pull { claim: None, .. }
        ));
        // Labelled for this node but pinned to another: not this node's volume.
        assert_eq!(
            wanted(&pv(Some("b"), Some("pvc-old"), None, "c"), OURS),
            Wanted::Nothing
        );
    }
}
