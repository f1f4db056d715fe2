//! Node loss: what happens to claims pinned to a node that is gone (issue 23). `policy` is the
//! StorageClass parameter, `decide` the pure rules (`decide::provenance`: whether a
//! StatefulSet's controller made a claim); `observe` turns API objects (as `crate::slim` reads
//! them) into their views, `lease` elects one acting replica, `view` is what the reconciler
//! keeps of Nodes, PVs and classes, `watch` feeds it, and `reconcile` is the loop that decides,
//! acts and reports; `orphans` is `stickyvol cluster orphans`; `returned` runs in the node
//! driver: a node that comes back (`comeback` watches its Node) moves the data of volumes whose
//! PV is gone to lost+found, and lists them in the node's `report`.

pub mod comeback;
pub mod decide;
pub mod lease;
pub mod observe;
pub mod orphans;
pub mod policy;
pub mod reconcile;
pub mod report;
pub mod returned;
pub mod view;
pub mod watch;
