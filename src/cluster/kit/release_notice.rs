//! A node's release notice, the one thing the controller tells a node plugin about node loss:
//! "while you were away I deleted PVs pinned to you". The node's orphan check then reads every
//! volume's PV again (`node::nodeloss::returned`) and takes the notice back.
//!
//! Why a notice and not a watch of the Node: a node plugin's credentials should reach only its
//! node, and RBAC cannot give one ServiceAccount, shared by every node plugin, the read of each
//! pod's own Node only (resourceNames cannot say "the caller's node"). A node plugin that ran
//! through its node's loss (a partition, not a power-off: a restarted plugin reads every PV at
//! start anyway) learns of it here, from the ConfigMap `<driver>-released-<node>` in the
//! driver's namespace, written by the controller before each PV delete and watched by that one
//! name. The controller's admission fence lets it write no other ConfigMap; a node may only
//! delete its own notice.
//!
//! The notice is taken back with its resourceVersion as a precondition: a notice the controller
//! wrote again while the node was reading (another PV deleted) fails the delete and is seen as
//! a change, so no release goes unread.

use std::collections::BTreeMap;

use futures::Stream;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use crate::config::is_object_name;

/// Label on every notice: its value is the CSI driver name.
pub const LABEL: &str = "stickyvol.csi.io/release-notice";
const KEY_NODE: &str = "node";
const KEY_AT: &str = "releasedAtUnixMs";
const FIELD_MANAGER: &str = "stickyvol-node-loss";

/// The notice's name, if the node's name leaves room for one.
pub fn name(driver: &str, node: &str) -> Option<String> {
    let name = format!("{driver}-released-{node}");
    is_object_name(&name).then_some(name)
}

/// The notice as the controller applies it: the node, and when it last released a PV there.
pub fn config_map(driver: &str, node: &str, at_unix_ms: u64) -> Option<ConfigMap> {
    Some(ConfigMap {
        metadata: ObjectMeta {
            name: Some(name(driver, node)?),
            labels: Some(BTreeMap::from([(LABEL.to_string(), driver.to_string())])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            (KEY_NODE.to_string(), node.to_string()),
            (KEY_AT.to_string(), at_unix_ms.to_string()),
        ])),
        ..ConfigMap::default()
    })
}

/// The controller's side: says that it is about to release a PV of `node`. A node name too
/// long for a notice's name gets none (such a node cannot run the driver either).
pub async fn post(
    client: &Client,
    namespace: &str,
    driver: &str,
    node: &str,
    at_unix_ms: u64,
) -> Result<(), kube::Error> {
    let Some(notice) = config_map(driver, node, at_unix_ms) else {
        return Ok(());
    };
    let name = notice.metadata.name.clone().unwrap_or_default();
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&notice),
        )
        .await?;
    Ok(())
}

/// The node's side: the watch of its own notice (by name), retried with backoff after errors.
pub fn watch(
    client: &Client,
    namespace: &str,
    name: &str,
) -> impl Stream<Item = Result<Event<ConfigMap>, watcher::Error>> + Send + use<> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    watcher::watcher(
        Api::<ConfigMap>::namespaced(client.clone(), namespace),
        config,
    )
    .default_backoff()
}

/// Which version of the notice a watch event shows, if it shows one (None: no notice, or only
/// the start or end of a listing).
pub fn version_in(event: &Event<ConfigMap>) -> Option<String> {
    match event {
        Event::Apply(notice) | Event::InitApply(notice) => {
            Some(notice.metadata.resource_version.clone().unwrap_or_default())
        }
        Event::Init | Event::InitDone | Event::Delete(_) => None,
    }
}

/// What taking a notice back came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakenBack {
    /// Deleted, or already gone.
    Done,
    /// Written again since that version: read again, then taken back again.
    Changed,
}

/// The node's side, after it read every PV again: deletes version `version` of notice `name`.
pub async fn take_back(
    client: &Client,
    namespace: &str,
    name: &str,
    version: &str,
) -> Result<TakenBack, kube::Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: None,
            resource_version: Some(version.to_string()),
        }),
        ..DeleteParams::default()
    };
    match Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .delete(name, &params)
        .await
    {
        Ok(_) => Ok(TakenBack::Done),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(TakenBack::Done),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(TakenBack::Changed),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::kit::fake_api::{self, respond, status};
    use serde_json::json;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_notice_names_its_node_and_when() {
        let notice = config_map("stickyvol.csi.io", "node-b", 1_700_000_000_000).unwrap();
        assert_eq!(
            notice.metadata.name.as_deref(),
            Some("stickyvol.csi.io-released-node-b")
        );
        assert_eq!(notice.metadata.labels.unwrap()[LABEL], "stickyvol.csi.io");
        let data = notice.data.unwrap();
        assert_eq!(data[KEY_NODE], "node-b");
        assert_eq!(data[KEY_AT], "1700000000000");
        assert!(notice.metadata.owner_references.is_none());
        assert!(config_map("stickyvol.csi.io", &"n".repeat(250), 1).is_none());
    }

    #[test]
    fn only_a_notice_shown_is_a_version() {
        let notice: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "x", "resourceVersion": "7"}}))
                .unwrap();
        assert_eq!(
            version_in(&Event::Apply(notice.clone())).as_deref(),
            Some("7")
        );
        assert_eq!(
            version_in(&Event::InitApply(notice.clone())).as_deref(),
            Some("7")
        );
        for event in [Event::Init, Event::InitDone, Event::Delete(notice)] {
            assert_eq!(version_in(&event), None);
        }
    }

    #[tokio::test]
    async fn taking_back_deletes_only_the_version_read() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let client = fake_api::client(move |method, path, body| {
            let body: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            log.lock()
                .unwrap()
                .push((method.to_string(), path.to_string(), body.clone()));
            match body["preconditions"]["resourceVersion"].as_str() {
                Some("7") => respond(200, &json!({"kind": "Status", "status": "Success"})),
                Some("8") => respond(409, &status(409, "Conflict")),
                _ => respond(404, &status(404, "NotFound")),
            }
        });
        let name = "stickyvol.csi.io-released-node-b";
        let taken = |version: &'static str| {
            let client = client.clone();
            async move {
                take_back(&client, "stickyvol", name, version)
                    .await
                    .unwrap()
            }
        };
        assert_eq!(taken("7").await, TakenBack::Done);
        assert_eq!(
            taken("8").await,
            TakenBack::Changed,
            "written again meanwhile"
        );
        assert_eq!(taken("9").await, TakenBack::Done, "already gone");
        let seen = seen.lock().unwrap();
        assert_eq!(seen[0].0, "DELETE");
        assert_eq!(
            seen[0].1,
            "/api/v1/namespaces/stickyvol/configmaps/stickyvol.csi.io-released-node-b"
        );
    }
}
