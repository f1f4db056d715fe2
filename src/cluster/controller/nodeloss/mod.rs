//! Node loss, the controller's side: what happens to claims pinned to a node that is gone. The
//! class's choice is `crate::class::OnNodeLoss`; `decide` holds the pure rules
//! (`decide::provenance`: whether a StatefulSet's controller made a claim); `observe` turns API
//! objects (as `kit::slim` reads them) into their views, `lease` elects one acting replica,
//! `view` is what the reconciler keeps of Nodes, PVs and classes, `watch` feeds it, and
//! `reconcile` is the loop that decides, acts and reports. The node's side (a node that comes
//! back) is `cluster::node::nodeloss`.

pub mod decide;
pub mod lease;
pub mod observe;
pub mod reconcile;
pub mod view;
pub mod watch;
