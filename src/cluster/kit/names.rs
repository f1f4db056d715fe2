//! Names Kubernetes and its sidecars give to annotations, labels, taints and finalizers that both
//! sides of the cluster wing read or write.

/// The claim annotation the scheduler sets and csi-provisioner follows.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// The finalizer external-provisioner puts on PVs it provisioned; only the dead node's
/// provisioner would remove it.
pub const PROVISIONER_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// The taint Kubernetes documents for a node shut down non-gracefully.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// On one of our PVs: the node its volume may be copied to (`cluster::node::transfer`), set by
/// the cluster's admin (or, for a move, the controller); a node plugin writes only its own PVs.
pub const MOVE_TO: &str = "stickyvol.csi.io/move-to";

/// On a claim asked to move (beside `MOVE_TO`): its node is dead and its disk is attached to the
/// target node, mounted at `<data-dir>/adopt/<this name>`: the data is read from there.
pub const MOVE_FROM_DISK: &str = "stickyvol.csi.io/move-from-disk";

/// The ConfigMap, in the driver's namespace, where `node`'s plugin says where its transfer
/// endpoint is (`cluster::node::transfer::advert`).
pub fn transfer_advert(driver: &str, node: &str) -> String {
    format!("{driver}-transfer-{node}")
}
