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

use tokio::sync::mpsc::Receiver;
use tracing::{error, info, warn};

use crate::cluster::kit::client::{self, Retries};
use crate::cluster::kit::events::{Kind, Recorder, Said};
use crate::cluster::kit::task::{Inputs, Loop, Shutdown};
use crate::config::is_object_name;
use crate::volume::audit::{self, Tampered};

/// Who writes the audit's Events.
pub const REPORTING_CONTROLLER: &str = "stickyvol.csi.io/project-audit";

/// Writes an Event for every volume received until the sender goes, from `node`.
pub async fn run(mut found: Receiver<Tampered>, node: String) {
    let mut recorder: Option<Recorder> = None;
    while let Some(tampered) = found.recv().await {
        if !is_object_name(&tampered.pvc_namespace) || tampered.pvc_name.is_empty() {
            continue;
        }
        if recorder.is_none() {
            match client::make(Retries::On).await {
                Ok(made) => recorder = Some(Recorder::new(made, REPORTING_CONTROLLER, &node)),
                Err(err) => {
                    info!(error = %err, "project-id audit: no Kubernetes client configuration, so no Events on claims");
                    // Nothing to write with: the log and the metrics carry the reports.
                    while found.recv().await.is_some() {}
                    return;
                }
            }
        }
        if let Some(recorder) = &recorder {
            write(recorder, &tampered).await;
        }
    }
}

async fn write(recorder: &Recorder, tampered: &Tampered) {
    recorder
        .record_on_claim(&tampered.pvc_namespace, &tampered.pvc_name, event(tampered))
        .await;
}

/// The Warning Event on the claim of a tampered volume.
fn event(tampered: &Tampered) -> Said<'_> {
    Said {
        kind: Kind::Warning,
        reason: tampered.reason,
        action: "Audit",
        note: tampered.message.clone(),
    }
}

/// The audit, where the configuration asks for it and this instance has volumes. Its loop only
/// tells the walk's thread, which ends at its next entry; the server's stop then waits for
/// every holder of the volumes to let go (`Driver::wait_for_background_work`).
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
    tokio::spawn(run(pending, inputs.config.node_id.clone()));
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
    fn the_event_says_what_was_found() {
        let tampered = Tampered {
            volume: "sv-1".into(),
            pvc_namespace: "shop".into(),
            pvc_name: "data-0".into(),
            reason: "ProjectIdsRepaired",
            message: "volume sv-1: 3 of 10 inodes had left its project".into(),
        };
        let said = event(&tampered);
        assert_eq!(said.reason, "ProjectIdsRepaired");
        assert_eq!(said.kind, Kind::Warning);
        assert_eq!(said.note, tampered.message);
    }
}
