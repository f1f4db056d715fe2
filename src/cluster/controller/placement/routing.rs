//! Where a snapshot content of ours is handled: csi-snapshotter in `--node-deployment` mode
//! takes only the contents labelled with its node, so `groups` and `group_members` route the
//! contents snapshot-controller leaves unlabelled to the node their ids name.

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use tracing::warn;

use super::source::Locator;
use crate::volume::state::id::{Issuer, NodeTag};

/// The label csi-snapshotter in `--node-deployment` mode selects its contents by.
pub const MANAGED_BY: &str = "snapshot.storage.kubernetes.io/managed-by";

/// Where a content should be cut (or let go).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Another driver's, or labelled already: nothing to do.
    Leave,
    /// The node whose tag this is.
    Tag(NodeTag),
    /// Ours, but no id of it names a node (ids of an earlier version, or none yet).
    Unknown(String),
}

/// Whether an object (its JSON) carries the label.
pub fn labelled(object: &Value) -> bool {
    object
        .pointer(&format!(
            "/metadata/labels/{}",
            MANAGED_BY.replace('/', "~1")
        ))
        .is_some()
}

/// The route to the node of the first issuer naming one.
pub fn first_node(issuers: impl IntoIterator<Item = Issuer>) -> Route {
    match issuers.into_iter().find_map(|issuer| match issuer {
        Issuer::Node(tag) => Some(tag),
        Issuer::Unknown => None,
    }) {
        Some(tag) => Route::Tag(tag),
        None => Route::Unknown(
            "none of its handles is an id of stickyvol naming its node (ids of an earlier version name none)".into(),
        ),
    }
}

/// The name of the node `route` sends content `name` (a `what`) to; None, said in the log, when
/// there is none to send it to (left, no node named, or the node is gone).
pub async fn node_of(
    route: Route,
    locator: &mut Locator,
    name: &str,
    what: &str,
) -> Result<Option<String>, kube::Error> {
    let tag = match route {
        Route::Leave => return Ok(None),
        Route::Tag(tag) => tag,
        Route::Unknown(why) => {
            warn!(content = %name, reason = %why, "group snapshots: no node for this {what}");
            return Ok(None);
        }
    };
    let node = locator.node_of_tag(&tag).await?;
    if !crate::config::is_object_name(&node) {
        warn!(content = %name, node = %node, "group snapshots: the node of this {what} is gone");
        return Ok(None);
    }
    Ok(Some(node))
}

/// Labels object `name` with `node`.
pub async fn label_with(
    api: &Api<DynamicObject>,
    name: &str,
    node: &str,
) -> Result<(), kube::Error> {
    let patch = json!({"metadata": {"labels": {MANAGED_BY: node}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}
