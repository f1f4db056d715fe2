//! The watches that keep the reconciler's view (`view`): Nodes and PVs (as `crate::cluster::kit::slim` reads
//! them: a few fields of each, never whole Nodes) and StorageClasses, merged into one stream.
//!
//! Each watch starts with a consistent list in pages of `view::PAGE_SIZE`, not one served
//! from the API server's watch cache (`resourceVersion=0`, `any_semantic`): the watch cache
//! answers such a list whole whatever its `limit` (kubernetes/kubernetes#70735 sends it there
//! even with a limit), so every Node of the cluster would come in one response (some 55 MB at
//! 5,000 Nodes), which the client holds whole before reading it. A list happens at start and
//! when a watch falls too far behind (410 Gone); bookmarks keep its resourceVersion recent
//! meanwhile, so a watch that times out (every few minutes) resumes without one.

use futures::{Stream, StreamExt, stream};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::warn;

use super::view::{ClusterView, PAGE_SIZE};
use crate::cluster::kit::slim;

pub enum Change {
    Node(Result<watcher::Event<slim::Node>, watcher::Error>),
    Pv(Result<watcher::Event<slim::PersistentVolume>, watcher::Error>),
    Class(Result<watcher::Event<StorageClass>, watcher::Error>),
}

/// Every change to Nodes, PVs and StorageClasses, retried with backoff after errors.
pub fn changes(client: &Client) -> impl Stream<Item = Change> + Send + use<> {
    let config = watcher::Config::default().page_size(PAGE_SIZE);
    let nodes = watcher(Api::<slim::Node>::all(client.clone()), config.clone())
        .default_backoff()
        .map(Change::Node);
    let pvs = watcher(
        Api::<slim::PersistentVolume>::all(client.clone()),
        config.clone(),
    )
    .default_backoff()
    .map(Change::Pv);
    let classes = watcher(Api::<StorageClass>::all(client.clone()), config)
        .default_backoff()
        .map(Change::Class);
    stream::select_all([nodes.boxed(), pvs.boxed(), classes.boxed()])
}

/// Applies one change to `view`; true when it may change a decision.
pub fn apply(view: &mut ClusterView, change: Change) -> bool {
    let failed = match change {
        Change::Node(Ok(event)) => return view.node_event(event),
        Change::Pv(Ok(event)) => return view.pv_event(event),
        Change::Class(Ok(event)) => return view.class_event(event),
        Change::Node(Err(err)) => ("Nodes", err),
        Change::Pv(Err(err)) => ("PVs", err),
        Change::Class(Err(err)) => ("StorageClasses", err),
    };
    warn!(kind = failed.0, error = %failed.1, "node loss: watching failed; retrying");
    false
}
