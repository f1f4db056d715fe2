//! Node loss, the node's side: a node that comes back (`comeback` watches its own Node) moves
//! the data of volumes whose PV is gone to lost+found (`returned`), and lists them in the node's
//! `report`, which `stickyvol cluster orphans` reads. The controller's side is
//! `cluster::controller::nodeloss`.

pub mod comeback;
pub mod report;
pub mod returned;
