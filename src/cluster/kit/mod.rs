//! What both sides of the cluster wing share: the slim object types the watches decode
//! (`slim`), which node a PV is pinned to (`affinity`), the one Event recorder (`events`), the
//! one way to make a Kubernetes client (`client`), the names Kubernetes and we give annotations,
//! taints and finalizers (`names`), what a background loop is (`task`), what a node asks the
//! controller to evict (`eviction_request`), what the controller tells a node whose PVs it
//! released (`release_notice`), what a PV says about a pull into its volume (`pull_request`) and
//! about a change of its IO limits (`modify_request`),
//! sizes as bytes (`quantity`), and, for unit tests, an in-process fake API server (`fake_api`).
//! Nothing here uses the rest of `cluster`.

pub mod affinity;
pub mod client;
pub mod events;
pub mod eviction_request;
#[cfg(test)]
pub mod fake_api;
pub mod modify_request;
pub mod names;
pub mod pull_request;
pub mod quantity;
pub mod release_notice;
pub mod slim;
pub mod task;
