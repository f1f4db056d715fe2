//! Where a snapshot content of ours is handled: csi-snapshotter in `--node-deployment` mode
//! takes only the contents labelled with its node, so `groups` and `group_members` route the
//! contents snapshot-controller leaves unlabelled to the node their ids name.

use crate::volume::state::id::NodeTag;

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
