//! The members of group snapshots, sent to their node as their group is (`groups`).
//! snapshot-controller (v8.6.0) makes a VolumeSnapshotContent for each member once the group is
//! cut, but without the `managed-by` label it gives a single snapshot's content, so no node's
//! csi-snapshotter (`--node-deployment`) ever sees it: when the member is deleted with its group,
//! nobody removes the content's finalizer, and it stays, being deleted, forever. The group loop
//! (`groups::run`) watches the contents that have no such label and, with `follow`, labels each
//! member content of our driver with the node its ids name (its volume's, its snapshot's or its
//! group's).

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;
use tracing::{info, warn};

use super::routing::{MANAGED_BY, Route, first_node, label_with, labelled, node_of};
use super::source::Locator;
use crate::volume::state::id::{GroupSnapshotId, SnapshotId, VolumeId};

/// The annotation snapshot-controller puts on a group member's content: its group's handle.
const GROUP_HANDLE: &str = "groupsnapshot.storage.k8s.io/volumeGroupSnapshotHandle";

fn contents() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshotContent"),
        "volumesnapshotcontents",
    )
}

/// Where a VolumeSnapshotContent (its JSON) should be handled, for `driver`: only unlabelled
/// group members of ours go anywhere (a single snapshot's content snapshot-controller labels
/// itself, and one made by hand is its maker's to label).
pub fn member_route(content: &Value, driver: &str) -> Route {
    let group = content
        .pointer(&format!(
            "/metadata/annotations/{}",
            GROUP_HANDLE.replace('/', "~1")
        ))
        .or_else(|| content.pointer("/status/volumeGroupSnapshotHandle"))
        .and_then(Value::as_str);
    if content.pointer("/spec/driver").and_then(Value::as_str) != Some(driver) || labelled(content)
    {
        return Route::Leave;
    }
    let Some(group) = group else {
        return Route::Leave;
    };
    let text = |pointer: &str| content.pointer(pointer).and_then(Value::as_str);
    let issuers = [
        text("/spec/source/volumeHandle")
            .and_then(VolumeId::parse)
            .map(|id| id.issuer()),
        text("/spec/source/snapshotHandle")
            .and_then(SnapshotId::parse)
            .map(|id| id.issuer()),
        text("/status/snapshotHandle")
            .and_then(SnapshotId::parse)
            .map(|id| id.issuer()),
        GroupSnapshotId::parse(group).map(|id| id.issuer()),
    ];
    first_node(issuers.into_iter().flatten())
}

/// The VolumeSnapshotContents without the label, as they change: a cluster's many single
/// snapshots, labelled by snapshot-controller, are never listed here.
pub fn unlabelled(client: Client) -> (Api<DynamicObject>, BoxStream<'static, Changed>) {
    let api = Api::<DynamicObject>::all_with(client, &contents());
    let config = watcher::Config::default()
        .labels(&format!("!{MANAGED_BY}"))
        .any_semantic();
    let changes = watcher(api.clone(), config)
        .default_backoff()
        .applied_objects()
        .boxed();
    (api, changes)
}

/// One change of the watch.
pub type Changed = Result<DynamicObject, watcher::Error>;

/// Labels `content` (a member's, changed) with its node, said in the log when it cannot.
pub async fn follow(
    api: &Api<DynamicObject>,
    locator: &mut Locator,
    content: &DynamicObject,
    driver: &str,
) {
    let name = content.metadata.name.clone().unwrap_or_default();
    let json = serde_json::to_value(content).unwrap_or_default();
    if let Err(err) = label(api, locator, &name, &json, driver).await {
        // The next change of the content, or the watch's next relist, brings it back.
        warn!(content = %name, error = %err, "group snapshots: could not label a member's VolumeSnapshotContent with its node");
    }
}

/// Labels one member content with its node, where it has one to be given.
async fn label(
    api: &Api<DynamicObject>,
    locator: &mut Locator,
    name: &str,
    content: &Value,
    driver: &str,
) -> Result<(), kube::Error> {
    let route = member_route(content, driver);
    let Some(node) = node_of(route, locator, name, "group member's content").await? else {
        return Ok(());
    };
    label_with(api, name, &node).await?;
    info!(content = %name, node = %node, "group snapshots: sent a group member's content to its node");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::{Arc, Mutex};

    use crate::cluster::kit::fake_api::{self, respond, status};
    use crate::volume::state::id::NodeTag;

    const DRIVER: &str = "stickyvol.csi.io";

    fn member(node: &str, labels: Value) -> Value {
        let tag = NodeTag::of(node);
        json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
               "metadata": {"name": "snapcontent-1", "labels": labels,
                            "annotations": {GROUP_HANDLE: GroupSnapshotId::generate(&tag).to_string()}},
               "spec": {"driver": DRIVER, "source": {"volumeHandle": VolumeId::generate(&tag).to_string()}}})
    }

    #[test]
    fn only_unlabelled_members_of_ours_go_to_the_node_their_ids_name() {
        assert_eq!(
            member_route(&member("a", json!({})), DRIVER),
            Route::Tag(NodeTag::of("a"))
        );
        // Pre-provisioned: a snapshot handle, the group in the status only.
        let tag = NodeTag::of("b");
        let handles = json!({"metadata": {"name": "m"},
            "spec": {"driver": DRIVER, "source": {"snapshotHandle": SnapshotId::generate(&tag).to_string()}},
            "status": {"volumeGroupSnapshotHandle": GroupSnapshotId::generate(&tag).to_string()}});
        assert_eq!(member_route(&handles, DRIVER), Route::Tag(tag));
        assert_eq!(
            member_route(&member("a", json!({MANAGED_BY: "a"})), DRIVER),
            Route::Leave
        );
        let mut single = member("a", json!({}));
        single["metadata"]["annotations"] = json!({});
        assert_eq!(member_route(&single, DRIVER), Route::Leave, "not a member");
        let mut foreign = member("a", json!({}));
        foreign["spec"]["driver"] = json!("other.csi.io");
        assert_eq!(member_route(&foreign, DRIVER), Route::Leave);
        let mut old = member("a", json!({}));
        old["spec"]["source"]["volumeHandle"] = json!("sv-0123456789abcdef0123456789abcdef");
        old["metadata"]["annotations"][GROUP_HANDLE] = json!("../x");
        assert!(matches!(member_route(&old, DRIVER), Route::Unknown(_)));
    }

    #[tokio::test]
    async fn a_member_is_labelled_with_the_name_of_its_node_and_a_gone_nodes_left() {
        let patches = Arc::new(Mutex::new(Vec::new()));
        let seen = patches.clone();
        let client = fake_api::client(move |method, path, body| match (method, path) {
            ("GET", "/api/v1/nodes") => respond(200, &fake_api::node_names(&["node-a"])),
            ("PATCH", p)
                if p.starts_with("/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents/") =>
            {
                let labels =
                    serde_json::from_slice::<Value>(body).unwrap()["metadata"]["labels"].clone();
                seen.lock()
                    .unwrap()
                    .push(json!({p.rsplit('/').next().unwrap(): labels}));
                respond(200, &member("node-a", json!({})))
            }
            _ => respond(404, &status(404, "NotFound")),
        });
        let api = Api::<DynamicObject>::all_with(client.clone(), &contents());
        let mut locator = Locator::new(
            client,
            DRIVER.into(),
            "topology.stickyvol.csi.io/node".into(),
        );
        for node in ["node-a", "node-gone"] {
            label(
                &api,
                &mut locator,
                "snapcontent-1",
                &member(node, json!({})),
                DRIVER,
            )
            .await
            .unwrap();
        }
        assert_eq!(
            *patches.lock().unwrap(),
            vec![json!({"snapcontent-1": {MANAGED_BY: "node-a"}})]
        );
    }
}
