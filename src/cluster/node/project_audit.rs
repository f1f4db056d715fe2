//! The periodic project-id audit (`volume::audit`) on a thread of its own (its walks block), and
//! Events on the claims of the volumes it finds tampered with, so the claim's owner sees it in
//! `kubectl describe pvc`. The claim is known
//! from the creation parameters csi-provisioner passes with `--extra-create-metadata`; a volume
//! without them gets no Event (the log line and the metrics still report it).
//!
//! The Kubernetes client is made at the first tampered volume, not at start: a node where no
//! pod tampers never talks to the API server for this. The node's ServiceAccount already has
//! what this needs: `get` on persistentvolumeclaims and `create` on events.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::mpsc::Receiver;
use tracing::{error, info, warn};

use crate::cluster::kit::client::{self, Retries};
use crate::cluster::kit::task::{Inputs, Loop, Shutdown};
use crate::config::is_object_name;
use crate::volume::audit::{self, Tampered};

/// Who reports: the driver's name and this node's.
#[derive(Debug, Clone)]
pub struct Reporter {
    pub driver: String,
    pub node: String,
}

/// Writes an Event for every volume received until the sender goes.
pub async fn run(mut found: Receiver<Tampered>, reporter: Reporter) {
    let mut client: Option<Client> = None;
    while let Some(tampered) = found.recv().await {
        if !is_object_name(&tampered.pvc_namespace) || tampered.pvc_name.is_empty() {
            continue;
        }
        if client.is_none() {
            match client::make(Retries::On).await {
                Ok(made) => client = Some(made),
                Err(err) => {
                    info!(error = %err, "project-id audit: no Kubernetes client configuration, so no Events on claims");
                    // Nothing to write with: the log and the metrics carry the reports.
                    while found.recv().await.is_some() {}
                    return;
                }
            }
        }
        if let Some(client) = &client {
            write(client, &reporter, &tampered).await;
        }
    }
}

async fn write(client: &Client, reporter: &Reporter, tampered: &Tampered) {
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &tampered.pvc_namespace);
    // With its uid the Event shows in `kubectl describe pvc`; without, it is still listed.
    let uid = match claims.get(&tampered.pvc_name).await {
        Ok(claim) => claim.metadata.uid,
        Err(err) => {
            warn!(volume = %tampered.volume, error = %err, "project-id audit: cannot read the volume's claim");
            None
        }
    };
    let event = event(reporter, tampered, uid);
    if let Err(err) = Api::<Event>::namespaced(client.clone(), &tampered.pvc_namespace)
        .create(&PostParams::default(), &event)
        .await
    {
        warn!(volume = %tampered.volume, error = %err, "project-id audit: could not record the event");
    }
}

/// The Warning Event on the claim of a tampered volume.
fn event(reporter: &Reporter, tampered: &Tampered, uid: Option<String>) -> Event {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    Event {
        metadata: ObjectMeta {
            generate_name: Some("stickyvol-project-audit-".into()),
            namespace: Some(tampered.pvc_namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some(tampered.pvc_namespace.clone()),
            name: Some(tampered.pvc_name.clone()),
            uid,
            ..ObjectReference::default()
        },
        reason: Some("ProjectIdsRepaired".into()),
        message: Some(tampered.message.clone()),
        type_: Some("Warning".into()),
        source: Some(EventSource {
            component: Some(reporter.driver.clone()),
            host: Some(reporter.node.clone()),
        }),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Event::default()
    }
}

/// The audit, where the configuration asks for it and this instance has volumes. Its walk ends
/// at the next entry once told; the stop waits for that, so that it lets go of the volumes.
pub async fn start(inputs: &Inputs<'_>, shutdown: Shutdown) -> Result<Option<Loop>, kube::Error> {
    let (Some(interval), Some(volumes)) = (inputs.config.project_audit_interval, inputs.volumes)
    else {
        return Ok(None);
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    // Events are written by a task of their own, fed without waiting (the queue is bounded; the
    // log and the metrics report what does not fit).
    let (found, pending) = tokio::sync::mpsc::channel(64);
    let reporter = Reporter {
        driver: inputs.config.driver_name.clone(),
        node: inputs.config.node_id.clone(),
    };
    tokio::spawn(run(pending, reporter));
    let report = move |tampered: Vec<Tampered>| {
        for volume in tampered {
            if found.try_send(volume).is_err() {
                warn!("project-id audit: Event queue full, an Event on a claim was dropped");
            }
        }
    };
    let volumes = volumes.clone();
    let started = std::thread::Builder::new()
        .name("project-audit".into())
        .spawn(move || audit::run_every(volumes, interval, stopped, report));
    if let Err(err) = started {
        error!(error = %err, "project-id audit off: cannot start its thread");
        return Ok(None);
    }
    let run = async move {
        shutdown.wait().await;
        stop.store(true, Ordering::Relaxed);
    };
    Ok(Some(Loop::new(
        "project-id audit",
        Duration::from_secs(5),
        run,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_names_the_claim_and_says_what_was_found() {
        let reporter = Reporter {
            driver: "stickyvol.csi.io".into(),
            node: "worker-3".into(),
        };
        let tampered = Tampered {
            volume: "sv-1".into(),
            pvc_namespace: "shop".into(),
            pvc_name: "data-0".into(),
            message: "volume sv-1: 3 of 10 inodes had left its project".into(),
        };
        let event = event(&reporter, &tampered, Some("u-1".into()));
        assert_eq!(event.metadata.namespace.as_deref(), Some("shop"));
        let claim = &event.involved_object;
        assert_eq!(claim.kind.as_deref(), Some("PersistentVolumeClaim"));
        assert_eq!(
            (claim.namespace.as_deref(), claim.name.as_deref()),
            (Some("shop"), Some("data-0"))
        );
        assert_eq!(claim.uid.as_deref(), Some("u-1"));
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(event.message.as_deref(), Some(tampered.message.as_str()));
        assert_eq!(event.source.unwrap().host.as_deref(), Some("worker-3"));
    }
}
