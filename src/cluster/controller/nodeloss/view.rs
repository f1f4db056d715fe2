//! What the reconciler keeps between rounds, fed by watches (`watch`), or filled by one paged
//! listing (`stickyvol cluster orphans`, tests): each Node as `decide` sees it (name, taint
//! keys, readiness), the node of each PV of our driver by PV name, and the StorageClasses.
//! Nothing else: a PV's other fields matter only once its node is lost, and are then read
//! again, consistently, by the round. At 5,000 Nodes and 50,000 PVs this is a few MB, however
//! big the objects are.
//!
//! Each kind follows its watch: a (re)list starts a new epoch, and what the list did not bring
//! again is dropped when it ends. The view is `ready` once every kind was listed and none is
//! being listed again. Each change says whether it may change a decision: a node lost or back,
//! a PV of a lost node, a class.

use std::collections::HashMap;

use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::{Api, ListParams};
use kube::runtime::watcher::Event;
use serde::de::DeserializeOwned;

use super::decide::{ClassView, NodeView};
use super::observe;
use crate::cluster::kit::names::OUT_OF_SERVICE_TAINT;
use crate::cluster::kit::slim;

/// Objects per page when listing.
pub const PAGE_SIZE: u32 = 250;

/// One kind's objects, with the epoch of the list that last brought each.
struct Cache<T> {
    items: HashMap<String, (T, u32)>,
    epoch: u32,
    listing: bool,
    listed: bool,
}

impl<T> Default for Cache<T> {
    fn default() -> Self {
        Self {
            items: HashMap::new(),
            epoch: 0,
            listing: false,
            listed: false,
        }
    }
}

impl<T> Cache<T> {
    fn begin(&mut self) {
        self.epoch += 1;
        self.listing = true;
    }

    fn put(&mut self, name: String, value: T) -> Option<T> {
        self.items.insert(name, (value, self.epoch)).map(|(v, _)| v)
    }

    fn take(&mut self, name: &str) -> Option<T> {
        self.items.remove(name).map(|(v, _)| v)
    }

    fn finish(&mut self) {
        let epoch = self.epoch;
        self.items.retain(|_, (_, seen)| *seen == epoch);
        self.items.shrink_to_fit();
        self.listing = false;
        self.listed = true;
    }

    fn ready(&self) -> bool {
        self.listed && !self.listing
    }

    fn get(&self, name: &str) -> Option<&T> {
        self.items.get(name).map(|(v, _)| v)
    }
}

pub struct ClusterView {
    driver: String,
    topology_key: String,
    nodes: Cache<NodeView>,
    /// PVs of our driver: the node each is pinned to (None: no node `decide` would act on).
    pvs: Cache<Option<Box<str>>>,
    classes: Cache<ClassView>,
}

fn out_of_service(node: &NodeView) -> bool {
    node.taints.iter().any(|t| t == OUT_OF_SERVICE_TAINT)
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

impl ClusterView {
    pub fn new(driver: &str, topology_key: &str) -> ClusterView {
        ClusterView {
            driver: driver.to_string(),
            topology_key: topology_key.to_string(),
            nodes: Cache::default(),
            pvs: Cache::default(),
            classes: Cache::default(),
        }
    }

    /// Every kind listed, none being listed again.
    pub fn ready(&self) -> bool {
        self.nodes.ready() && self.pvs.ready() && self.classes.ready()
    }

    /// Whether a node of that name is lost: no Node, or one out of service.
    pub fn lost(&self, node: &str) -> bool {
        self.nodes.get(node).is_none_or(out_of_service)
    }

    pub fn nodes(&self) -> Vec<NodeView> {
        self.nodes.items.values().map(|(n, _)| n.clone()).collect()
    }

    pub fn classes(&self) -> Vec<ClassView> {
        self.classes
            .items
            .values()
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// Our PVs pinned to a lost node, by name (none while no Node is seen: an empty view is
    /// a broken one, not a cluster without nodes).
    pub fn on_lost_nodes(&self) -> Vec<String> {
        if self.nodes.items.is_empty() {
            return Vec::new();
        }
        let mut names: Vec<String> = (self.pvs.items.iter())
            .filter(|(_, (node, _))| node.as_deref().is_some_and(|n| self.lost(n)))
            .map(|(name, _)| name.clone())
            .collect();
        names.sort();
        names
    }

    pub fn pv_count(&self) -> usize {
        self.pvs.items.len()
    }

    /// A Node watch event; true when a node was lost or came back.
    pub fn node_event(&mut self, event: Event<slim::Node>) -> bool {
        match event {
            Event::Init => {
                self.nodes.begin();
                false
            }
            Event::InitApply(node) | Event::Apply(node) => {
                let view = observe::node(&node);
                let now_lost = out_of_service(&view);
                let before = self.nodes.put(view.name.clone(), view);
                before.is_none_or(|b| out_of_service(&b) != now_lost)
            }
            Event::Delete(node) => self.nodes.take(&name_of(&node.metadata)).is_some(),
            Event::InitDone => {
                self.nodes.finish();
                true
            }
        }
    }

    /// A PV watch event; true when it concerns one of our PVs on a lost node.
    pub fn pv_event(&mut self, event: Event<slim::PersistentVolume>) -> bool {
        let on_lost = |view: &Self, node: Option<Box<str>>| node.is_some_and(|n| view.lost(&n));
        match event {
            Event::Init => {
                self.pvs.begin();
                false
            }
            Event::InitApply(pv) | Event::Apply(pv) => {
                let name = name_of(&pv.metadata);
                let view = observe::pv(&pv, &self.topology_key);
                if view.driver != self.driver {
                    let before = self.pvs.take(&name).flatten();
                    return on_lost(self, before);
                }
                let node = view.node.map(String::into_boxed_str);
                let before = self.pvs.put(name, node.clone()).flatten();
                on_lost(self, node) || on_lost(self, before)
            }
            Event::Delete(pv) => {
                let before = self.pvs.take(&name_of(&pv.metadata)).flatten();
                on_lost(self, before)
            }
            Event::InitDone => {
                self.pvs.finish();
                true
            }
        }
    }

    /// A StorageClass watch event: every change may change a policy.
    pub fn class_event(&mut self, event: Event<StorageClass>) -> bool {
        match event {
            Event::Init => {
                self.classes.begin();
                false
            }
            Event::InitApply(class) | Event::Apply(class) => {
                let view = observe::class(&class);
                self.classes.put(view.name.clone(), view);
                true
            }
            Event::Delete(class) => self.classes.take(&name_of(&class.metadata)).is_some(),
            Event::InitDone => {
                self.classes.finish();
                true
            }
        }
    }

    /// The view from one paged listing of each kind.
    pub async fn listed(
        client: &Client,
        driver: &str,
        topology_key: &str,
    ) -> Result<ClusterView, kube::Error> {
        let mut view = ClusterView::new(driver, topology_key);
        list_into(&Api::<slim::Node>::all(client.clone()), &mut |e| {
            view.node_event(e);
        })
        .await?;
        list_into(
            &Api::<slim::PersistentVolume>::all(client.clone()),
            &mut |e| {
                view.pv_event(e);
            },
        )
        .await?;
        list_into(&Api::<StorageClass>::all(client.clone()), &mut |e| {
            view.class_event(e);
        })
        .await?;
        Ok(view)
    }
}

/// Lists `api` page by page into `feed`, as a watch's initial list would.
async fn list_into<K>(api: &Api<K>, feed: &mut dyn FnMut(Event<K>)) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    feed(Event::Init);
    let mut params = ListParams::default().limit(PAGE_SIZE);
    loop {
        let page = api.list(&params).await?;
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        for item in page.items {
            feed(Event::InitApply(item));
        }
        match next {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    feed(Event::InitDone);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DRIVER: &str = "stickyvol.csi.io";
    const KEY: &str = "topology.stickyvol.csi.io/node";

    fn node(name: &str, taint: Option<&str>) -> slim::Node {
        let taints: Vec<_> = taint.into_iter().map(|k| json!({"key": k})).collect();
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"taints": taints}}))
            .unwrap()
    }

    fn pv(name: &str, driver: &str, node: &str) -> slim::PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
            "csi": {"driver": driver, "volumeHandle": "h"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": KEY, "operator": "In", "values": [node]}]}]}}}}))
        .unwrap()
    }

    fn listed(nodes: &[&str], pvs: &[(&str, &str)]) -> ClusterView {
        let mut view = ClusterView::new(DRIVER, KEY);
        view.node_event(Event::Init);
        for n in nodes {
            view.node_event(Event::InitApply(node(n, None)));
        }
        view.node_event(Event::InitDone);
        view.pv_event(Event::Init);
        for (name, on) in pvs {
            view.pv_event(Event::InitApply(pv(name, DRIVER, on)));
        }
        view.pv_event(Event::InitDone);
        assert!(!view.ready(), "classes not listed yet");
        view.class_event(Event::Init);
        view.class_event(Event::InitDone);
        view
    }

    #[test]
    fn only_changes_that_may_change_a_decision_matter() {
        let mut view = listed(&["a", "b"], &[("pv-a", "a"), ("pv-b", "b")]);
        assert!(view.ready());
        assert!(view.on_lost_nodes().is_empty());
        // A status update of a live node, a new PV on a live node, another driver's PV.
        assert!(!view.node_event(Event::Apply(node("a", Some("other")))));
        assert!(!view.pv_event(Event::Apply(pv("pv-a2", DRIVER, "a"))));
        assert!(!view.pv_event(Event::Apply(pv("x", "other.csi.io", "b"))));
        // Node b deleted: its PV is on a lost node, and its changes matter from then on.
        assert!(view.node_event(Event::Delete(node("b", None))));
        assert_eq!(view.on_lost_nodes(), ["pv-b"]);
        assert!(view.pv_event(Event::Apply(pv("pv-b", DRIVER, "b"))));
        assert!(view.pv_event(Event::Delete(pv("pv-b", DRIVER, "b"))));
        assert!(view.on_lost_nodes().is_empty());
        // Node a tainted out of service, then back.
        let oos = Some(OUT_OF_SERVICE_TAINT);
        assert!(view.node_event(Event::Apply(node("a", oos))));
        assert_eq!(view.on_lost_nodes(), ["pv-a", "pv-a2"]);
        assert!(
            !view.node_event(Event::Apply(node("a", oos))),
            "still out of service"
        );
        assert!(view.node_event(Event::Apply(node("a", None))));
        assert!(view.on_lost_nodes().is_empty());
    }

    #[test]
    fn a_relist_drops_what_it_did_not_bring_and_the_view_waits_for_it() {
        let mut view = listed(&["a", "b"], &[("pv-b", "b")]);
        view.node_event(Event::Init);
        assert!(!view.ready(), "being listed again");
        view.node_event(Event::InitApply(node("a", None)));
        assert!(view.node_event(Event::InitDone));
        assert!(view.ready());
        assert_eq!(
            view.on_lost_nodes(),
            ["pv-b"],
            "b went while the watch was down"
        );
    }

    #[test]
    fn no_node_seen_is_no_pv_lost() {
        let view = listed(&[], &[("pv-b", "b")]);
        assert!(view.on_lost_nodes().is_empty());
    }
}
