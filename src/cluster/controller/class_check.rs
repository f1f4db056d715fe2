//! The class check (controller mode, `--check-classes=on`): every StorageClass of ours is read
//! with the rules CreateVolume applies, and one with a mistake (a misspelt key, a value not
//! allowed) gets a Warning Event naming it and what is allowed, where `kubectl describe
//! storageclass` shows it. Claims of such a class also fail to provision with the same message
//! (GetCapacity answers for it anyway, see `ClassParameters::lenient`). Watched, so a class is
//! checked when it is made or changed, and once at start.

use std::collections::HashMap;
use std::future::Future;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{info, warn};

use crate::class::ClassParameters;
use crate::cluster::kit::client::{self, Retries};
use crate::cluster::kit::events::{self, Kind, Recorder, Said};
use crate::cluster::kit::task::{Inputs, Loop, Shutdown};

/// Who writes our Events.
pub const REPORTING_CONTROLLER: &str = "stickyvol.csi.io/class-check";

/// The mistake in a class of `driver`, if it is ours and has one.
pub fn mistake(class: &StorageClass, driver: &str) -> Option<String> {
    if class.provisioner != driver {
        return None;
    }
    let parameters: HashMap<String, String> = class
        .parameters
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    match ClassParameters::parse(&parameters) {
        Ok(parsed) => parsed.class_mistake(),
        Err(mistake) => Some(mistake),
    }
}

/// The class, as its Event's `regarding`.
fn regarding(class: &StorageClass) -> ObjectReference {
    let name = class.metadata.name.as_deref().unwrap_or_default();
    events::cluster_scoped(
        "storage.k8s.io/v1",
        "StorageClass",
        name,
        class.metadata.uid.as_deref(),
    )
}

/// What the Event on a class with a mistake says.
fn said(note: String) -> Said<'static> {
    Said {
        kind: Kind::Warning,
        reason: "InvalidParameters",
        action: "Check",
        note: format!(
            "{note}; claims of this class fail to provision with this message until the class is fixed (delete and re-create it: a StorageClass's parameters cannot be changed)"
        ),
    }
}

/// Runs until `shutdown`: each class of ours with a mistake is announced once per uid (a class's
/// parameters are immutable; a class re-created under the same name is another uid).
pub async fn run(
    client: Client,
    driver: String,
    identity: String,
    shutdown: impl Future<Output = ()>,
) {
    let classes = Api::<StorageClass>::all(client.clone());
    let mut changes = watcher(classes, watcher::Config::default().any_semantic())
        .default_backoff()
        .applied_objects()
        .boxed();
    let mut announced: HashMap<String, String> = HashMap::new();
    let recorder = Recorder::new(client, REPORTING_CONTROLLER, identity);
    tokio::pin!(shutdown);
    loop {
        let class = tokio::select! {
            _ = &mut shutdown => break,
            class = changes.next() => match class {
                Some(Ok(class)) => class,
                Some(Err(err)) => {
                    warn!(error = %err, "class check: watching StorageClasses failed; retrying");
                    continue;
                }
                None => break,
            },
        };
        let Some(note) = mistake(&class, &driver) else {
            continue;
        };
        let uid = class.metadata.uid.clone().unwrap_or_default();
        if announced.get(&uid) == Some(&note) {
            continue;
        }
        let name = class.metadata.name.clone().unwrap_or_default();
        warn!(class = %name, mistake = %note, "class check: a StorageClass of ours has a mistake");
        // Not taken: announced again at the class's next change or the next start.
        if recorder.record(regarding(&class), said(note.clone())).await {
            announced.insert(uid, note);
        }
    }
}

/// The class check, where the configuration asks for it (a watch: nothing to wait for at the stop).
pub async fn start(inputs: &Inputs<'_>, shutdown: Shutdown) -> Result<Option<Loop>, kube::Error> {
    let config = inputs.config;
    if !config.check_classes {
        return Ok(None);
    }
    let client = client::make(Retries::On).await?;
    info!("class check starting");
    let run = run(
        client,
        config.driver_name.clone(),
        config.node_id.clone(),
        shutdown.wait(),
    );
    Ok(Some(Loop::new(
        "class check",
        std::time::Duration::ZERO,
        run,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn class(provisioner: &str, parameters: serde_json::Value) -> StorageClass {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "uid": "u"},
            "provisioner": provisioner,
            "parameters": parameters,
        }))
        .unwrap()
    }

    #[test]
    fn a_misspelt_key_or_a_bad_value_is_named_with_what_is_allowed() {
        let driver = "stickyvol.csi.io";
        let misspelt = mistake(&class(driver, json!({"bogusParameter": "x"})), driver).unwrap();
        assert!(
            misspelt.contains("\"bogusParameter\"") && misspelt.contains("onNodeLoss"),
            "{misspelt}"
        );
        let value = mistake(&class(driver, json!({"onNodeLoss": "maybe"})), driver).unwrap();
        assert!(value.contains("onNodeLoss"), "{value}");
        assert_eq!(
            mistake(&class(driver, json!({"pool": "nvme"})), driver),
            None
        );
        let provisioner_keys = json!({"csi.storage.k8s.io/fstype": "ext4"});
        assert_eq!(mistake(&class(driver, provisioner_keys), driver), None);
        // An encrypted class must name the Secret with its key.
        let keyless = json!({"csi.storage.k8s.io/fstype": "ext4", "encryption": "luks2"});
        let said = mistake(&class(driver, keyless), driver).unwrap();
        assert!(said.contains("node-stage-secret-name"), "{said}");
        let keyed = json!({"encryption": "luks2",
                           "csi.storage.k8s.io/node-stage-secret-name": "k",
                           "csi.storage.k8s.io/node-stage-secret-namespace": "ns"});
        assert_eq!(mistake(&class(driver, keyed), driver), None);
        assert_eq!(
            mistake(&class("other.csi.io", json!({"bogus": "x"})), driver),
            None
        );
    }

    #[test]
    fn the_event_names_the_class_and_says_what_to_do() {
        let c = class("stickyvol.csi.io", json!({"bogus": "x"}));
        let regarding = regarding(&c);
        assert_eq!(regarding.kind.as_deref(), Some("StorageClass"));
        assert_eq!(regarding.name.as_deref(), Some("c"));
        assert_eq!(regarding.uid.as_deref(), Some("u"));
        assert!(said("unknown parameter".into()).note.contains("re-create"));
    }
}
