//! Whether this node came back while its driver ran: a watch of its own Node (a field selector
//! on its name, so only that object's changes come) says so when the Node is made again (a new
//! uid, or one after a deletion) or loses its out-of-service taint. The orphan check then reads
//! every volume's PV again (`returned`).

use futures::Stream;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use crate::cluster::kit::names::OUT_OF_SERVICE_TAINT;
use crate::cluster::kit::slim;

/// The Node as last seen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Seen {
    #[default]
    Unknown,
    Gone,
    Present {
        uid: String,
        out_of_service: bool,
    },
}

/// Whether going from `before` to `after` is the node coming back.
pub fn came_back(before: &Seen, after: &Seen) -> bool {
    match (before, after) {
        (Seen::Gone, Seen::Present { .. }) => true,
        (
            Seen::Present {
                uid: was,
                out_of_service: lost,
            },
            Seen::Present {
                uid: is,
                out_of_service: still,
            },
        ) => was != is || (*lost && !*still),
        _ => false,
    }
}

/// Follows the watch's events (a list that brings no Node says it is gone).
#[derive(Debug, Default)]
pub struct NodeState {
    seen: Seen,
    listing: Option<Seen>,
}

impl NodeState {
    /// The next event; true when the node came back.
    pub fn event(&mut self, event: Event<slim::Node>) -> bool {
        let after = match event {
            Event::Init => {
                self.listing = Some(Seen::Gone);
                return false;
            }
            Event::InitApply(node) => {
                self.listing = Some(present(&node));
                return false;
            }
            Event::InitDone => self.listing.take().unwrap_or(Seen::Gone),
            Event::Apply(node) => present(&node),
            Event::Delete(_) => Seen::Gone,
        };
        let back = came_back(&self.seen, &after);
        self.seen = after;
        back
    }
}

fn present(node: &slim::Node) -> Seen {
    Seen::Present {
        uid: node.metadata.uid.clone().unwrap_or_default(),
        out_of_service: node
            .spec
            .as_ref()
            .is_some_and(|s| s.taints.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT)),
    }
}

/// The watch of Node `name`, retried with backoff after errors.
pub fn watch(
    client: &Client,
    name: &str,
) -> impl Stream<Item = Result<Event<slim::Node>, watcher::Error>> + Send + use<> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    watcher::watcher(Api::<slim::Node>::all(client.clone()), config).default_backoff()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(uid: &str, taint: bool) -> slim::Node {
        let taints: Vec<_> = taint
            .then(|| json!({"key": OUT_OF_SERVICE_TAINT}))
            .into_iter()
            .collect();
        serde_json::from_value(
            json!({"metadata": {"name": "n", "uid": uid}, "spec": {"taints": taints}}),
        )
        .unwrap()
    }

    #[test]
    fn a_node_made_again_or_back_in_service_came_back_and_nothing_else() {
        let mut state = NodeState::default();
        assert!(!state.event(Event::Init));
        assert!(!state.event(Event::InitApply(node("u1", false))));
        assert!(
            !state.event(Event::InitDone),
            "the first sight is no return"
        );
        assert!(
            !state.event(Event::Apply(node("u1", false))),
            "a status update"
        );
        assert!(!state.event(Event::Apply(node("u1", true))), "tainted");
        assert!(
            state.event(Event::Apply(node("u1", false))),
            "the taint removed"
        );
        assert!(!state.event(Event::Delete(node("u1", false))));
        assert!(
            state.event(Event::Apply(node("u2", false))),
            "registered again"
        );
        // Deleted and made again while the watch was down: the list brings another uid.
        assert!(!state.event(Event::Init));
        assert!(!state.event(Event::InitApply(node("u3", false))));
        assert!(state.event(Event::InitDone));
        // Gone while the watch was down, then back.
        state.event(Event::Init);
        assert!(!state.event(Event::InitDone));
        assert!(state.event(Event::Apply(node("u4", false))));
    }
}
