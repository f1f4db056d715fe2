//! Restore placement (issue 33): a claim restored from one of our snapshots, or cloned from one of
//! our claims, can only be made on the node holding its source, which the scheduler does not
//! know. The controller tells it, by setting the claim's selected node to that node as soon as
//! it sees the claim (see `rules`). `fits` says whether a pod may run on a node, `source` reads
//! the API, `run` is the watch loop. `groups` places the other way round: a group snapshot's
//! cut goes to the node of its volumes, and `group_members` its members' contents with it.

pub mod fits;
pub mod group_members;
pub mod groups;
pub mod routing;
pub mod rules;
pub mod run;
pub mod source;
