//! Group snapshots cut where their volumes are (`--group-snapshots=on`). csi-snapshotter runs
//! on every node (`--node-deployment`) and takes only the snapshot contents labelled with its
//! node (`snapshot.storage.kubernetes.io/managed-by`); snapshot-controller labels a single
//! snapshot's content with its volume's node, but a group's VolumeGroupSnapshotContent with none,
//! so no node would ever cut it. This loop labels each VolumeGroupSnapshotContent of our driver
//! with the node its volumes' ids name (`sv-<uuid>-<tag>`: see `volume::state::id`), or, for one
//! made from existing handles, the node its group snapshot id names. Volumes on more than one
//! node: the first volume's node, whose plugin refuses the group with a sentence that
//! csi-snapshotter puts on the content and snapshot-controller on the VolumeGroupSnapshot.
//! A label once set is never changed, here or by a node (the node policy forbids it).
//!
//! csi-snapshotter in `--node-deployment` mode (v8.6.0) also reads VolumeGroupSnapshotClasses
//! through the same label selector as the contents, so a node's sidecar sees only the classes
//! labelled with its node: a class for the whole cluster is "not found" on every node. So this
//! loop keeps one class per Node, `stickyvol-<node>` (`node_class_name`), labelled with it, made
//! when the Node appears and deleted when it goes; a VolumeGroupSnapshot names the class of the
//! node its claims are on. A class of ours without a node (one a user or a test made) is given
//! the node of the first group that names it (`adopt_class`).

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PartialObjectMeta, Patch,
    PatchParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::group_members;
pub use super::routing::{MANAGED_BY, Route};
use super::routing::{first_node, label_with, labelled, node_of};
use super::source::Locator;
use crate::cluster::kit::client::{self, Retries};
use crate::cluster::kit::task::{Inputs, Loop, Shutdown};
use crate::volume::state::id::{GroupSnapshotId, VolumeId};

/// Who owns the per-node classes (server-side apply).
const FIELD_MANAGER: &str = "stickyvol-group-snapshots";

fn classes() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "groupsnapshot.storage.k8s.io",
            "v1",
            "VolumeGroupSnapshotClass",
        ),
        "volumegroupsnapshotclasses",
    )
}

/// The VolumeGroupSnapshotClass of `node`'s group snapshots.
pub fn node_class_name(driver_prefix: &str, node: &str) -> String {
    format!("{driver_prefix}-{node}")
}

/// The class of `node` for `driver`, as applied.
pub fn node_class(driver: &str, name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "groupsnapshot.storage.k8s.io/v1",
        "kind": "VolumeGroupSnapshotClass",
        "metadata": {"name": name, "labels": {MANAGED_BY: node, "app.kubernetes.io/part-of": "stickyvol"}},
        "driver": driver,
        "deletionPolicy": "Delete",
    })
}

fn contents() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "groupsnapshot.storage.k8s.io",
            "v1",
            "VolumeGroupSnapshotContent",
        ),
        "volumegroupsnapshotcontents",
    )
}

/// The route of a VolumeGroupSnapshotContent (its JSON) for `driver`.
pub fn route(content: &Value, driver: &str) -> Route {
    if content.pointer("/spec/driver").and_then(Value::as_str) != Some(driver) || labelled(content)
    {
        return Route::Leave;
    }
    let source = content.pointer("/spec/source");
    let volumes = source
        .and_then(|s| s.get("volumeHandles"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter_map(|handle| VolumeId::parse(handle).map(|id| id.issuer()));
    let group = source
        .and_then(|s| s.pointer("/groupSnapshotHandles/volumeGroupSnapshotHandle"))
        .and_then(Value::as_str)
        .and_then(GroupSnapshotId::parse)
        .map(|id| id.issuer());
    first_node(volumes.chain(group))
}

/// Runs until `shutdown`: every content of ours without a node gets its volumes' node, every
/// member's content its node, and every Node its class.
pub async fn run(
    client: Client,
    driver: String,
    topology_key: String,
    shutdown: impl Future<Output = ()>,
) {
    let api = Api::<DynamicObject>::all_with(client.clone(), &contents());
    let mut changes = watcher(api.clone(), watcher::Config::default().any_semantic())
        .default_backoff()
        .applied_objects()
        .boxed();
    // Names only: metadata requests.
    let nodes = Api::<PartialObjectMeta<Node>>::all(client.clone());
    let mut node_events = watcher(nodes, watcher::Config::default().any_semantic())
        .default_backoff()
        .boxed();
    let mut classes = NodeClasses::new(client.clone(), &driver);
    let (members_api, mut members) = group_members::unlabelled(client.clone());
    let mut locator = Locator::new(client, driver.clone(), topology_key);
    tokio::pin!(shutdown);
    loop {
        let content = tokio::select! {
            _ = &mut shutdown => break,
            member = members.next() => {
                match member {
                    Some(Ok(member)) => group_members::follow(&members_api, &mut locator, &member, &driver).await,
                    Some(Err(err)) => warn!(error = %err, "group snapshots: watching VolumeSnapshotContents failed; retrying"),
                    None => break,
                }
                continue;
            }
            event = node_events.next() => {
                match event {
                    Some(Ok(event)) => classes.follow(event).await,
                    Some(Err(err)) => warn!(error = %err, "group snapshots: watching Nodes failed; retrying"),
                    None => break,
                }
                continue;
            }
            content = changes.next() => match content {
                Some(Ok(content)) => content,
                Some(Err(err)) => {
                    warn!(error = %err, "group snapshots: watching VolumeGroupSnapshotContents failed (are the groupsnapshot.storage.k8s.io CRDs installed?); retrying");
                    continue;
                }
                None => break,
            },
        };
        let name = content.metadata.name.clone().unwrap_or_default();
        let json = serde_json::to_value(&content).unwrap_or_default();
        if let Err(err) = label(&api, &mut locator, &name, &json, &driver).await {
            // The next change of the content, or the watch's next relist, brings it back.
            warn!(content = %name, error = %err, "group snapshots: could not label a VolumeGroupSnapshotContent with its node");
        }
    }
}

/// The per-node classes (see the module comment), kept with the Nodes' watch.
struct NodeClasses {
    api: Api<DynamicObject>,
    driver: String,
    /// The classes' names start with it: the driver name's first label.
    prefix: String,
    /// Nodes listed since the watch (re)started, to delete the classes of nodes gone meanwhile.
    listed: Option<Vec<String>>,
}

impl NodeClasses {
    fn new(client: Client, driver: &str) -> NodeClasses {
        NodeClasses {
            api: Api::all_with(client, &classes()),
            driver: driver.to_string(),
            prefix: driver.split('.').next().unwrap_or(driver).to_string(),
            listed: None,
        }
    }

    async fn follow(&mut self, event: watcher::Event<PartialObjectMeta<Node>>) {
        let outcome = match event {
            watcher::Event::Init => {
                self.listed = Some(Vec::new());
                Ok(())
            }
            watcher::Event::InitApply(node) | watcher::Event::Apply(node) => {
                let name = node.metadata.name.unwrap_or_default();
                if let Some(listed) = self.listed.as_mut() {
                    listed.push(name.clone());
                }
                self.apply(&name).await
            }
            watcher::Event::InitDone => self.remove_stale().await,
            watcher::Event::Delete(node) => {
                self.remove(&node.metadata.name.unwrap_or_default()).await
            }
        };
        if let Err(err) = outcome {
            warn!(error = %err, "group snapshots: could not keep a node's VolumeGroupSnapshotClass; the next change of the Node or the watch's next relist retries");
        }
    }

    async fn apply(&self, node: &str) -> Result<(), kube::Error> {
        let name = node_class_name(&self.prefix, node);
        let class = node_class(&self.driver, &name, node);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        self.api
            .patch(&name, &params, &Patch::Apply(&class))
            .await?;
        Ok(())
    }

    async fn remove(&self, node: &str) -> Result<(), kube::Error> {
        let name = node_class_name(&self.prefix, node);
        match self.api.delete(&name, &Default::default()).await {
            Ok(_) => {
                info!(class = %name, node = %node, "group snapshots: removed the class of a node that is gone");
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// The classes of ours whose node was not in the list the watch just made.
    async fn remove_stale(&mut self) -> Result<(), kube::Error> {
        let Some(listed) = self.listed.take() else {
            return Ok(());
        };
        let ours = ListParams::default().labels("app.kubernetes.io/part-of=stickyvol");
        for class in self.api.list(&ours).await?.items {
            let node = class
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(MANAGED_BY))
                .cloned();
            let of_driver =
                class.data.get("driver").and_then(Value::as_str) == Some(self.driver.as_str());
            if let Some(node) = node.filter(|n| of_driver && !listed.contains(n)) {
                self.remove(&node).await?;
            }
        }
        Ok(())
    }
}

/// Labels one content with its node, where it has one to be given.
async fn label(
    api: &Api<DynamicObject>,
    locator: &mut Locator,
    name: &str,
    content: &Value,
    driver: &str,
) -> Result<(), kube::Error> {
    let Some(node) = node_of(route(content, driver), locator, name, "group").await? else {
        return Ok(());
    };
    if let Some(class) = content
        .pointer("/spec/volumeGroupSnapshotClassName")
        .and_then(Value::as_str)
    {
        adopt_class(
            &Api::all_with(api.clone().into_client(), &classes()),
            class,
            &node,
            driver,
        )
        .await?;
    }
    label_with(api, name, &node).await?;
    info!(content = %name, node = %node, "group snapshots: sent a group to its volumes' node");
    Ok(())
}

/// Gives a class of ours without a node the node of the first group that names it, so that
/// node's csi-snapshotter sees it (see the module comment); one labelled for another node is
/// left, said in the log: that group's node sees no such class, and its own class is wanted.
async fn adopt_class(
    classes: &Api<DynamicObject>,
    name: &str,
    node: &str,
    driver: &str,
) -> Result<(), kube::Error> {
    let Some(class) = classes.get_opt(name).await? else {
        return Ok(());
    };
    if class.data.get("driver").and_then(Value::as_str) != Some(driver) {
        return Ok(());
    }
    match class
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY))
    {
        Some(labelled) if labelled == node => Ok(()),
        Some(labelled) => {
            warn!(class = %name, class_node = %labelled, node = %node, "group snapshots: a group on this node names a VolumeGroupSnapshotClass of another node, which its csi-snapshotter cannot see; name the node's own class");
            Ok(())
        }
        None => {
            let patch = json!({"metadata": {"labels": {MANAGED_BY: node}}});
            classes
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            info!(class = %name, node = %node, "group snapshots: gave a VolumeGroupSnapshotClass without a node the node of its first group");
            Ok(())
        }
    }
}

/// The loop, where the configuration asks for it (a watch: nothing to wait for at the stop).
pub async fn start(inputs: &Inputs<'_>, shutdown: Shutdown) -> Result<Option<Loop>, kube::Error> {
    let config = inputs.config;
    if !config.group_snapshots {
        return Ok(None);
    }
    let client = client::make(Retries::On).await?;
    info!("group snapshot routing starting");
    let run = run(
        client,
        config.driver_name.clone(),
        config.topology_key(),
        shutdown.wait(),
    );
    Ok(Some(Loop::new(
        "group snapshot routing",
        Duration::ZERO,
        run,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    use crate::cluster::kit::fake_api::{self, respond, status};
    use crate::volume::state::id::{NodeTag, SnapshotId};

    const DRIVER: &str = "stickyvol.csi.io";

    fn content(source: Value, labels: Value) -> Value {
        json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshotContent",
               "metadata": {"name": "groupsnapcontent-1", "labels": labels},
               "spec": {"driver": DRIVER, "source": source}})
    }

    fn volume_on(node: &str) -> String {
        VolumeId::generate(&NodeTag::of(node)).to_string()
    }

    #[test]
    fn a_content_goes_to_the_node_its_first_tagged_id_names() {
        let dynamic = content(
            json!({"volumeHandles": ["sv-0123456789abcdef0123456789abcdef", volume_on("b"), volume_on("c")]}),
            json!({}),
        );
        assert_eq!(route(&dynamic, DRIVER), Route::Tag(NodeTag::of("b")));
        let handles = json!({"groupSnapshotHandles": {
            "volumeGroupSnapshotHandle": GroupSnapshotId::generate(&NodeTag::of("a")).to_string(),
            "volumeSnapshotHandles": [SnapshotId::generate(&NodeTag::of("a")).to_string()]}});
        assert_eq!(
            route(&content(handles, json!({})), DRIVER),
            Route::Tag(NodeTag::of("a"))
        );
    }

    #[test]
    fn labelled_foreign_and_nameless_contents_are_left_or_reported() {
        let labelled = content(
            json!({"volumeHandles": [volume_on("a")]}),
            json!({MANAGED_BY: "b"}),
        );
        assert_eq!(route(&labelled, DRIVER), Route::Leave);
        let mut foreign = content(json!({"volumeHandles": [volume_on("a")]}), json!({}));
        foreign["spec"]["driver"] = json!("other.csi.io");
        assert_eq!(route(&foreign, DRIVER), Route::Leave);
        let old = content(
            json!({"volumeHandles": ["sv-0123456789abcdef0123456789abcdef", "../x"]}),
            json!({}),
        );
        assert!(matches!(route(&old, DRIVER), Route::Unknown(_)));
    }

    #[tokio::test]
    async fn a_content_is_labelled_with_the_name_of_its_volumes_node() {
        let patches = Arc::new(Mutex::new(Vec::new()));
        let seen = patches.clone();
        let client = fake_api::client(move |method, path, body| match (method, path) {
            ("GET", "/api/v1/nodes") => respond(200, &fake_api::node_names(&["node-a", "node-b"])),
            ("GET", p) if p.ends_with("/volumegroupsnapshotclasses/made-by-a-test") => {
                let mut class = node_class(DRIVER, "made-by-a-test", "x");
                class["metadata"]["labels"] = json!({});
                respond(200, &class)
            }
            ("GET", p) if p.ends_with("/volumegroupsnapshotclasses/stickyvol-node-a") => {
                respond(200, &node_class(DRIVER, "stickyvol-node-a", "node-a"))
            }
            ("PATCH", p) if p.contains("/groupsnapshot.storage.k8s.io/v1/") => {
                let what = p.rsplit('/').next().unwrap_or_default();
                let labels =
                    serde_json::from_slice::<Value>(body).unwrap()["metadata"]["labels"].clone();
                seen.lock().unwrap().push(json!({what: labels}));
                respond(200, &content(json!({}), json!({})))
            }
            _ => respond(404, &status(404, "NotFound")),
        });
        let api = Api::<DynamicObject>::all_with(client.clone(), &contents());
        let mut locator = Locator::new(
            client,
            DRIVER.into(),
            "topology.stickyvol.csi.io/node".into(),
        );
        let ours = content(
            json!({"volumeHandles": [volume_on("node-b"), volume_on("node-a")]}),
            json!({}),
        );
        label(&api, &mut locator, "groupsnapcontent-1", &ours, DRIVER)
            .await
            .unwrap();
        let gone = content(json!({"volumeHandles": [volume_on("node-z")]}), json!({}));
        label(&api, &mut locator, "groupsnapcontent-1", &gone, DRIVER)
            .await
            .unwrap();
        // A class without a node gets the group's; one of another node is left as it is.
        for class in ["made-by-a-test", "stickyvol-node-a"] {
            let mut named = ours.clone();
            named["spec"]["volumeGroupSnapshotClassName"] = json!(class);
            label(&api, &mut locator, "groupsnapcontent-2", &named, DRIVER)
                .await
                .unwrap();
        }
        let patches = patches.lock().unwrap();
        assert_eq!(
            *patches,
            vec![
                json!({"groupsnapcontent-1": {MANAGED_BY: "node-b"}}),
                json!({"made-by-a-test": {MANAGED_BY: "node-b"}}),
                json!({"groupsnapcontent-2": {MANAGED_BY: "node-b"}}),
                json!({"groupsnapcontent-2": {MANAGED_BY: "node-b"}}),
            ],
            "contents labelled for the node that exists, the nodeless class adopted"
        );
    }

    fn node_meta(name: &str) -> PartialObjectMeta<Node> {
        serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn each_node_gets_a_class_labelled_with_it_and_a_gone_nodes_class_goes() {
        let writes = Arc::new(Mutex::new(Vec::new()));
        let seen = writes.clone();
        let client = fake_api::client(move |method, path, body| {
            let path = path.trim_start_matches(
                "/apis/groupsnapshot.storage.k8s.io/v1/volumegroupsnapshotclasses",
            );
            match method {
                "GET" => respond(
                    200,
                    &json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshotClassList", "metadata": {},
                    "items": [node_class(DRIVER, "stickyvol-node-a", "node-a"), node_class(DRIVER, "stickyvol-node-gone", "node-gone"),
                              node_class("other.csi.io", "other-node-x", "node-x")]}),
                ),
                "PATCH" => {
                    seen.lock().unwrap().push(format!(
                        "apply {path}: {}",
                        serde_json::from_slice::<Value>(body).unwrap()["metadata"]["labels"]
                            [MANAGED_BY]
                    ));
                    respond(200, &node_class(DRIVER, "x", "x"))
                }
                "DELETE" => {
                    seen.lock().unwrap().push(format!("delete {path}"));
                    respond(200, &status(200, "Success"))
                }
                _ => respond(404, &status(404, "NotFound")),
            }
        });
        let mut classes = NodeClasses::new(client, DRIVER);
        classes.follow(watcher::Event::Init).await;
        classes
            .follow(watcher::Event::InitApply(node_meta("node-a")))
            .await;
        classes.follow(watcher::Event::InitDone).await;
        classes
            .follow(watcher::Event::Apply(node_meta("node-b")))
            .await;
        classes
            .follow(watcher::Event::Delete(node_meta("node-b")))
            .await;
        assert_eq!(
            *writes.lock().unwrap(),
            vec![
                "apply /stickyvol-node-a: \"node-a\"".to_string(),
                "delete /stickyvol-node-gone".to_string(),
                "apply /stickyvol-node-b: \"node-b\"".to_string(),
                "delete /stickyvol-node-b".to_string(),
            ],
            "a class per node, the gone node's removed, another driver's left"
        );
    }
}
