//! Node loss, the node's side: a node whose claims the controller released while it was away
//! (`notice` follows the controller's release notice) moves the data of volumes whose PV is
//! gone to lost+found (`returned`), and lists them in the node's `report`, which `stickyvol
//! cluster orphans` reads. The controller's side is `cluster::controller::nodeloss`.

pub mod notice;
pub mod report;
pub mod returned;
