//! What to do with one restore or clone claim, from what the API said about it: pure, so every
//! case is a unit test. The claim goes to its source's node through the annotation the scheduler
//! itself writes (`volume.kubernetes.io/selected-node`): csi-provisioner on that node makes the
//! volume, the scheduler considers no other node for the claim's pods, and a pod it had already
//! placed elsewhere fails its binding and is scheduled again, onto the PV's node. Nothing is
//! placed where the volume could not be used: on a node that is gone, cordoned or NotReady, or one
//! a pod of the claim excludes. Those wait, announced by an Event, and are looked at again.

use super::fits::NodeFacts;

/// Where a claim's source is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// On the node of this name (or, when `Node` lists none by that name, the node this
    /// names: a node tag, when the source's node is gone).
    Node(String),
    /// Not known yet (a snapshot not bound to its content, a claim not to its PV): look again.
    NotYet(String),
    /// Not ours, or not there: the provisioner says why on the claim.
    NotOurs,
}

/// A refusal's reason, as the Event's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    SourceNodeGone,
    SourceNodeCordoned,
    SourceNodeNotReady,
    PodExcludesSourceNode,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::SourceNodeGone => "SourceNodeGone",
            Refusal::SourceNodeCordoned => "SourceNodeCordoned",
            Refusal::SourceNodeNotReady => "SourceNodeNotReady",
            Refusal::PodExcludesSourceNode => "PodExcludesSourceNode",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to do, now or later: on its node already, or not ours.
    Leave,
    /// Nothing to do yet; look again.
    Wait(String),
    /// Set the claim's selected node to this node.
    Place { node: String },
    /// Not placed: announce why, and look again.
    Refuse { reason: Refusal, message: String },
}

/// What the rules read about one claim. `source` names it for messages ("VolumeSnapshot db-snap").
pub struct Facts<'a> {
    pub source: &'a str,
    pub selected_node: Option<&'a str>,
    pub location: &'a Location,
    /// The source's node, if the API knows it.
    pub node: Option<&'a NodeFacts>,
    /// Pods of the claim that cannot run on the source's node: (pod name, why).
    pub excluding_pods: &'a [(String, String)],
}

pub fn decide(facts: &Facts) -> Verdict {
    let node_name = match facts.location {
        Location::NotOurs => return Verdict::Leave,
        Location::NotYet(why) => return Verdict::Wait(why.clone()),
        Location::Node(name) => name,
    };
    let refuse = |reason, message: String| Verdict::Refuse { reason, message };
    let holder = format!("{}'s data is on node {node_name}", facts.source);
    let Some(node) = facts.node else {
        return refuse(
            Refusal::SourceNodeGone,
            format!(
                "{holder}, which is not in the cluster: nothing is made until it is back (the data is nowhere else)"
            ),
        );
    };
    if facts.selected_node == Some(node.name.as_str()) {
        return Verdict::Leave;
    }
    if node.unschedulable {
        return refuse(
            Refusal::SourceNodeCordoned,
            format!("{holder}, which is cordoned: nothing is made until it is uncordoned"),
        );
    }
    if !node.ready {
        return refuse(
            Refusal::SourceNodeNotReady,
            format!("{holder}, which is NotReady: nothing is made until it is Ready"),
        );
    }
    if let Some((pod, why)) = facts.excluding_pods.first() {
        return refuse(
            Refusal::PodExcludesSourceNode,
            format!(
                "{holder}, where pod {pod} cannot run ({why}): nothing is made; change the pod or restore elsewhere"
            ),
        );
    }
    Verdict::Place {
        node: node.name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            ready: true,
            ..NodeFacts::default()
        }
    }

    fn verdict(
        selected: Option<&str>,
        location: Location,
        node: Option<NodeFacts>,
        excluding: &[(String, String)],
    ) -> Verdict {
        decide(&Facts {
            source: "VolumeSnapshot snap",
            selected_node: selected,
            location: &location,
            node: node.as_ref(),
            excluding_pods: excluding,
        })
    }

    fn on(name: &str) -> Location {
        Location::Node(name.into())
    }

    #[test]
    fn a_claim_goes_to_its_source_node_whether_or_not_the_scheduler_chose_one() {
        for selected in [None, Some("n2")] {
            assert_eq!(
                verdict(selected, on("n1"), Some(node("n1")), &[]),
                Verdict::Place { node: "n1".into() }
            );
        }
    }

    #[test]
    fn a_claim_on_its_source_node_or_not_ours_is_left_alone() {
        assert_eq!(
            verdict(Some("n1"), on("n1"), Some(node("n1")), &[]),
            Verdict::Leave
        );
        assert_eq!(verdict(None, Location::NotOurs, None, &[]), Verdict::Leave);
        assert!(matches!(
            verdict(None, Location::NotYet("unbound".into()), None, &[]),
            Verdict::Wait(_)
        ));
    }

    fn refusal(v: Verdict) -> Refusal {
        match v {
            Verdict::Refuse { reason, message } => {
                assert!(message.contains("VolumeSnapshot snap"), "{message}");
                reason
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn nothing_is_placed_on_a_node_that_is_gone_cordoned_or_not_ready() {
        assert_eq!(
            refusal(verdict(Some("n2"), on("n1"), None, &[])),
            Refusal::SourceNodeGone
        );
        let mut cordoned = node("n1");
        cordoned.unschedulable = true;
        assert_eq!(
            refusal(verdict(None, on("n1"), Some(cordoned), &[])),
            Refusal::SourceNodeCordoned
        );
        let mut down = node("n1");
        down.ready = false;
        assert_eq!(
            refusal(verdict(None, on("n1"), Some(down), &[])),
            Refusal::SourceNodeNotReady
        );
    }

    #[test]
    fn a_pod_that_excludes_the_source_node_stops_the_placement_and_is_named() {
        let excluding = [("web-0".to_string(), "its nodeSelector disk=hdd".to_string())];
        match verdict(Some("n2"), on("n1"), Some(node("n1")), &excluding) {
            Verdict::Refuse { reason, message } => {
                assert_eq!(reason, Refusal::PodExcludesSourceNode);
                assert!(
                    message.contains("web-0") && message.contains("disk=hdd"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_claim_already_on_the_source_node_stays_even_if_the_node_went_bad_since() {
        let mut down = node("n1");
        down.ready = false;
        assert_eq!(
            verdict(Some("n1"), on("n1"), Some(down), &[]),
            Verdict::Leave
        );
    }
}
