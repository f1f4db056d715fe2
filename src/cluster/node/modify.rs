//! Changes of IO limits asked on this node's PVs (`kit::modify_request`): the controller, which
//! csi-resizer asks when a claim's VolumeAttributesClass changes, labels the PV
//! `stickyvol.csi.io/modify-on=<this node>` and writes the limits wanted; they are set here
//! (`Volumes::modify`: the record, then every pod using the volume) and the outcome
//! written back, the label taken off. A change cut by a restart is made again: the label is
//! still there. The node writes only its own PVs (the policy `stickyvol-node-volumes`).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tracing::{info, warn};

use crate::class::Mutable;
use crate::cluster::kit::affinity::pinned_by;
use crate::cluster::kit::client::{self, Retries};
use crate::cluster::kit::modify_request::{IO_LIMITS_DONE, IO_LIMITS_WANTED, MODIFY_ON, Modified};
use crate::cluster::kit::task::{Inputs, Loop, Shutdown};
use crate::error::Error;
use crate::volume::Volumes;
use crate::volume::state::id::VolumeId;

/// Whose PVs, of which driver.
#[derive(Debug, Clone)]
struct Settings {
    driver: String,
    topology_key: String,
    node: String,
}

/// The loop, where this instance has volumes and a client. Without a client (a driver outside
/// Kubernetes, csi-sanity) there is no controller to hand changes over: said, not an error.
pub async fn start(inputs: &Inputs<'_>, shutdown: Shutdown) -> Result<Option<Loop>, kube::Error> {
    let Some(volumes) = inputs.volumes.cloned() else {
        return Ok(None);
    };
    let client = match client::make(Retries::On).await {
        Ok(client) => client,
        Err(err) => {
            info!(error = %err, "IO limit changes from the controller off: no Kubernetes client (ControllerModifyVolume on this socket still works)");
            return Ok(None);
        }
    };
    let config = inputs.config;
    let settings = Settings {
        driver: config.driver_name.clone(),
        topology_key: config.topology_key(),
        node: config.node_id.clone(),
    };
    let run = async move {
        tokio::select! {
            _ = shutdown.wait() => {}
            _ = watch(client, volumes, settings) => {}
        }
    };
    Ok(Some(Loop::new("IO limit changes", Duration::ZERO, run)))
}

/// Watches this node's PVs labelled for a change and makes each.
async fn watch(client: Client, volumes: Arc<Volumes>, settings: Settings) {
    let pvs = Api::<PersistentVolume>::all(client);
    let selector = format!("{MODIFY_ON}={}", settings.node);
    let config = watcher::Config::default().labels(&selector);
    let mut changes = watcher(pvs.clone(), config)
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(change) = changes.next().await {
        let pv = match change {
            Ok(pv) => pv,
            Err(err) => {
                warn!(error = %err, "watching this node's IO limit changes failed; retrying");
                continue;
            }
        };
        let Some((volume, wanted)) = asked(&pv, &settings) else {
            continue;
        };
        let name = pv.metadata.name.clone().unwrap_or_default();
        let answer = modify(&volumes, &volume, &wanted).await;
        let patch = json!({"metadata": {
            "labels": {MODIFY_ON: null},
            "annotations": {IO_LIMITS_DONE: serde_json::to_string(&answer).unwrap_or_default()},
        }});
        if let Err(err) = pvs
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            warn!(pv = %name, error = %err, "could not write the outcome of an IO limit change on its PV");
        }
    }
}

/// The volume and the limits text `pv` asks this node for, if it is this driver's and pinned
/// here, and not answered yet.
fn asked(pv: &PersistentVolume, settings: &Settings) -> Option<(String, String)> {
    let labelled = pv.metadata.labels.as_ref()?.get(MODIFY_ON)?;
    let spec = pv.spec.as_ref()?;
    let csi = spec.csi.as_ref().filter(|c| c.driver == settings.driver)?;
    let pinned = pinned_by(spec.node_affinity.as_ref(), &settings.topology_key);
    if *labelled != settings.node || pinned.as_deref() != Some(settings.node.as_str()) {
        return None;
    }
    let annotations = pv.metadata.annotations.as_ref();
    let wanted = annotations?.get(IO_LIMITS_WANTED)?.clone();
    let answered = Modified::on(annotations).is_some_and(|done| done.wanted == wanted);
    (!answered).then(|| (csi.volume_handle.clone(), wanted))
}

/// Sets the limits `wanted` (JSON) on `volume`; the outcome to write back.
async fn modify(volumes: &Arc<Volumes>, volume: &str, wanted: &str) -> Modified {
    let outcome = match (VolumeId::parse(volume), limits_from(wanted)) {
        (None, _) => Err(Error::NotFound(format!(
            "{volume:?} is no volume of this driver"
        ))),
        (_, Err(why)) => Err(Error::InvalidArgument(why)),
        (Some(id), Ok(limits)) => {
            let volumes = volumes.clone();
            tokio::task::spawn_blocking(move || volumes.modify(&id, limits))
                .await
                .unwrap_or_else(|err| {
                    Err(Error::host("setting IO limits", std::io::Error::other(err)))
                })
        }
    };
    match &outcome {
        Ok(()) => info!(
            volume,
            limits = wanted,
            "IO limits changed as asked on the PV"
        ),
        Err(err) => {
            warn!(volume, limits = wanted, error = %err, "IO limits asked on the PV not set")
        }
    }
    Modified {
        wanted: wanted.to_string(),
        refused: matches!(outcome, Err(Error::InvalidArgument(_) | Error::NotFound(_))),
        error: outcome.err().map(|err| err.to_string()),
    }
}

/// What an annotation's JSON asks for, held to the rules a class's parameters are.
fn limits_from(wanted: &str) -> Result<Mutable, String> {
    let limits: Mutable = serde_json::from_str(wanted)
        .map_err(|err| format!("{IO_LIMITS_WANTED} is not IO limits: {err}"))?;
    limits.checked()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            driver: "stickyvol.csi.io".into(),
            topology_key: "topology.stickyvol.csi.io/node".into(),
            node: "a".into(),
        }
    }

    fn pv(labelled: &str, pinned: &str, done: Option<&str>) -> PersistentVolume {
        let mut annotations = json!({IO_LIMITS_WANTED: r#"{"write_iops":200}"#});
        if let Some(wanted) = done {
            annotations[IO_LIMITS_DONE] =
                json!(json!({"wanted": wanted, "error": null}).to_string());
        }
        serde_json::from_value(json!({
            "metadata": {"name": "pv-1", "labels": {MODIFY_ON: labelled}, "annotations": annotations},
            "spec": {"csi": {"driver": "stickyvol.csi.io", "volumeHandle": "vol-1"},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions":
                         [{"key": "topology.stickyvol.csi.io/node", "operator": "In", "values": [pinned]}]}]}}}
        }))
        .unwrap()
    }

    #[test]
    fn only_this_node_s_pvs_not_yet_answered_are_taken() {
        let wanted = r#"{"write_iops":200}"#;
        assert_eq!(
            asked(&pv("a", "a", None), &settings()),
            Some(("vol-1".into(), wanted.into()))
        );
        assert_eq!(
            asked(&pv("a", "b", None), &settings()),
            None,
            "pinned elsewhere"
        );
        assert_eq!(
            asked(&pv("b", "a", None), &settings()),
            None,
            "asked of another node"
        );
        assert_eq!(
            asked(&pv("a", "a", Some(wanted)), &settings()),
            None,
            "answered"
        );
        assert!(
            asked(&pv("a", "a", Some("{}")), &settings()).is_some(),
            "a later change"
        );
    }

    #[test]
    fn limits_read_from_a_pv_are_held_to_a_class_s_rules() {
        assert_eq!(
            limits_from(r#"{"write_iops":200}"#).unwrap().io.write_iops,
            Some(200)
        );
        assert!(limits_from(r#"{"write_iops":0}"#).is_err());
        assert!(limits_from(r#"{"write_iops":-1}"#).is_err());
        assert!(limits_from("not json").is_err());
    }
}
