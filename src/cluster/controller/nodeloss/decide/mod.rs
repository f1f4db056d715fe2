//! The reconciler's decisions, as a pure function of what the API server showed: no I/O, so
//! every rule is a unit test. The loop (`nodeloss::reconcile`) fills a [`Snapshot`] from its
//! watches and carries out the [`Action`]s; `stickyvol cluster orphans` prints the same plan.
//!
//! The rules, in the order they are applied to each of our PVs:
//! 1. A PV of another driver is not looked at.
//! 2. If no Node is seen at all, nothing is done: an empty list is far likelier a broken view
//!    than a cluster that lost every node (and there would be nowhere to start pods anyway).
//! 3. A PV whose node exists and has no `node.kubernetes.io/out-of-service` taint is left alone,
//!    whatever its Ready condition: NotReady may be a partition that heals, and a node that came
//!    back (even as a new Node object of the same name) has its data.
//! 4. The policy is the `onNodeLoss` parameter of the PV's StorageClass (default `keep`); a class
//!    that is gone, of another provisioner or with a bad value means `keep`.
//! 5. With `release`, a claim bound to the PV is released only if a StatefulSet's controller made
//!    it from one of its volumeClaimTemplates (`provenance`: its name, labels, creation time and
//!    owners, not its name alone), no pod uses it on a live node, and a pod of that StatefulSet
//!    waits for it unscheduled: the claim and that pod
//!    are deleted, and the StatefulSet makes both again. A claim already being deleted only has
//!    its waiting pods deleted (a pod recreated before the claim was gone holds it).
//! 6. A PV no claim holds any more is deleted once its Node object is gone (its provisioner, which
//!    would have deleted it, ran on that node), unless its reclaim policy is Retain. A node only
//!    tainted out-of-service may return with its data, so its PVs stay.

use std::collections::BTreeMap;
use std::fmt;

use crate::class::{OnNodeLoss, PARAM_ON_NODE_LOSS};
use crate::cluster::kit::names::OUT_OF_SERVICE_TAINT;
pub mod provenance;

use provenance::{OwnerView, TemplateView};

/// A namespaced (or, with an empty namespace, cluster) object, with the uid a delete must match.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct NodeView {
    pub name: String,
    /// Taint keys (any effect: Kubernetes itself looks only at the key).
    pub taints: Vec<String>,
    /// Shown in reports only: readiness alone never leads to an action.
    pub ready: bool,
}

#[derive(Debug, Clone, Default)]
pub struct PvView {
    pub name: String,
    pub uid: String,
    /// `spec.csi.driver`.
    pub driver: String,
    /// `spec.csi.volumeHandle`: the volume id on its node.
    pub volume_handle: String,
    pub storage_class: String,
    /// The node named by its required node affinity on our topology key, if exactly one.
    pub node: Option<String>,
    /// `spec.claimRef`: namespace, name and (when bound) uid of the claim.
    pub claim: Option<ObjectRef>,
    pub reclaim_retain: bool,
    /// It has a deletionTimestamp: a finalizer (pv-protection, the provisioner's) holds it.
    pub deleting: bool,
    /// It carries external-provisioner's finalizer, which only the provisioner of its node
    /// removes.
    pub provisioner_finalizer: bool,
    /// `spec.volumeAttributesClassName`: its VolumeAttributesClass, whose `onNodeLoss` takes the
    /// place of its StorageClass's.
    pub attributes_class: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct ClaimView {
    pub object: ObjectRef,
    /// `spec.volumeName`.
    pub volume_name: String,
    pub deleting: bool,
    /// `metadata.creationTimestamp`, in seconds since the epoch.
    pub created: Option<i64>,
    pub labels: BTreeMap<String, String>,
    pub owners: Vec<OwnerView>,
}

#[derive(Debug, Clone, Default)]
pub struct PodView {
    pub object: ObjectRef,
    /// `spec.nodeName`; None while unscheduled.
    pub node: Option<String>,
    /// Claim names of its `persistentVolumeClaim` volumes.
    pub claims: Vec<String>,
    /// The uid of the StatefulSet that controls it, if one does.
    pub statefulset_uid: Option<String>,
    pub deleting: bool,
    /// Succeeded or Failed: holds nothing.
    pub finished: bool,
}

#[derive(Debug, Clone, Default)]
pub struct StatefulSetView {
    pub object: ObjectRef,
    /// `metadata.creationTimestamp`, in seconds since the epoch.
    pub created: Option<i64>,
    /// `spec.selector.matchLabels`: the controller puts them on every claim it makes.
    pub selector: BTreeMap<String, String>,
    pub templates: Vec<TemplateView>,
}

#[derive(Debug, Clone)]
pub struct ClassView {
    pub name: String,
    pub provisioner: String,
    /// The class's `onNodeLoss`, parsed when the class was seen (the message names a bad value).
    pub on_node_loss: Result<OnNodeLoss, String>,
}

/// A VolumeAttributesClass a PV on a lost node names: its `onNodeLoss`, if it sets one.
#[derive(Debug, Clone)]
pub struct AttributesClassView {
    pub name: String,
    pub driver: String,
    pub on_node_loss: Option<Result<OnNodeLoss, String>>,
}

/// What the API server showed, complete (the loop builds one only after every list arrived).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub nodes: Vec<NodeView>,
    pub pvs: Vec<PvView>,
    pub claims: Vec<ClaimView>,
    pub pods: Vec<PodView>,
    pub statefulsets: Vec<StatefulSetView>,
    pub classes: Vec<ClassView>,
    pub attributes_classes: Vec<AttributesClassView>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options<'a> {
    /// Our CSI driver name (`--driver-name`).
    pub driver: &'a str,
    /// Decide, report, but carry nothing out.
    pub dry_run: bool,
}

/// How a PV's node is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// No Node object of that name.
    Deleted,
    /// The Node exists with the out-of-service taint.
    OutOfService,
}

impl Loss {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deleted => "deleted",
            Self::OutOfService => "out-of-service",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Nothing,
    /// Delete the claim, then these pods waiting for it.
    ReleaseClaim {
        claim: ObjectRef,
        pods: Vec<ObjectRef>,
    },
    /// The claim is already being deleted: delete the pods that wait for it and hold it.
    DeletePods {
        pods: Vec<ObjectRef>,
    },
    /// Delete the PV and drop the provisioner's finalizer (that provisioner ran on the node).
    DeletePv {
        pv: ObjectRef,
    },
    /// The PV is already being deleted: drop the provisioner's finalizer that holds it (what
    /// `DeletePv` left when its patch met a conflict).
    DropPvFinalizer {
        pv: ObjectRef,
    },
}

impl Action {
    /// The metric label and the word in reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Nothing => "none",
            Self::ReleaseClaim { .. } => "release_claim",
            Self::DeletePods { .. } => "delete_pods",
            Self::DeletePv { .. } => "delete_pv",
            Self::DropPvFinalizer { .. } => "drop_pv_finalizer",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    NoNodesSeen,
    NoNodeAffinity,
    PolicyKeep,
    ClassMissing,
    ClassOfAnotherProvisioner,
    ClassParameterInvalid(String),
    NotStatefulSetClaim,
    /// Named like a StatefulSet's claim, but not what its controller makes: why.
    NotMadeByStatefulSet(String),
    InUseOnLiveNode(String),
    NoPodWaiting,
    ClaimReleased,
    ClaimBeingDeleted,
    PvReleased,
    ReclaimRetain,
    NodeMayReturn,
    PvBeingDeleted,
    PvHeldByProvisionerFinalizer,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoNodesSeen => f.write_str("no Node is visible; nothing is decided on an empty view"),
            Self::NoNodeAffinity => f.write_str("the PV names no node in its node affinity"),
            Self::PolicyKeep => write!(f, "the StorageClass says {PARAM_ON_NODE_LOSS}: keep"),
            Self::ClassMissing => f.write_str("its StorageClass is gone, so the policy is keep"),
            Self::ClassOfAnotherProvisioner => {
                f.write_str("its StorageClass belongs to another provisioner, so the policy is keep")
            }
            Self::ClassParameterInvalid(err) => write!(f, "{err}; the policy is keep"),
            Self::NotStatefulSetClaim => {
                f.write_str("the claim was not made from a StatefulSet's volumeClaimTemplates")
            }
            Self::NotMadeByStatefulSet(why) => write!(
                f,
                "the claim is named like a StatefulSet's but its controller did not make it ({why})"
            ),
            Self::InUseOnLiveNode(node) => write!(f, "a pod uses the claim on live node {node}"),
            Self::NoPodWaiting => {
                f.write_str("no pod of its StatefulSet waits for the claim yet")
            }
            Self::ClaimReleased => f.write_str(
                "released by policy: the StatefulSet makes the claim and its pod again, on a live node",
            ),
            Self::ClaimBeingDeleted => {
                f.write_str("the claim is being deleted; pods waiting for it are deleted so it can go")
            }
            Self::PvReleased => f.write_str(
                "no claim holds it and its node is deleted; its data stays on that node",
            ),
            Self::ReclaimRetain => f.write_str("its reclaim policy is Retain"),
            Self::NodeMayReturn => {
                f.write_str("its node is only out of service and may return with the data")
            }
            Self::PvBeingDeleted => {
                f.write_str("the PV is already being deleted; it goes when its finalizers do")
            }
            Self::PvHeldByProvisionerFinalizer => f.write_str(
                "the PV is being deleted but held by the finalizer of the provisioner that ran on its deleted node",
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub pv: String,
    pub node: String,
    pub loss: Loss,
    pub policy: OnNodeLoss,
    pub action: Action,
    pub reason: Reason,
    /// Only reported: the loop must not carry it out.
    pub dry_run: bool,
}

impl Decision {
    /// What the loop carries out: the action, unless it is nothing or a dry run.
    pub fn to_carry_out(&self) -> Option<&Action> {
        (!self.dry_run && self.action != Action::Nothing).then_some(&self.action)
    }
}

/// The decision for each of our PVs whose node is lost (PVs on live nodes get none), in PV order.
pub fn decide(snapshot: &Snapshot, options: Options<'_>) -> Vec<Decision> {
    let nodes: BTreeMap<&str, &NodeView> = snapshot
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n))
        .collect();
    let mut pvs: Vec<&PvView> = snapshot
        .pvs
        .iter()
        .filter(|pv| pv.driver == options.driver)
        .collect();
    pvs.sort_by(|a, b| a.name.cmp(&b.name));
    let mut decisions = Vec::new();
    for pv in pvs {
        let Some(node) = pv.node.as_deref() else {
            continue;
        };
        let loss = match nodes.get(node) {
            Some(n) if n.taints.iter().any(|t| t == OUT_OF_SERVICE_TAINT) => Loss::OutOfService,
            Some(_) => continue,
            None => Loss::Deleted,
        };
        let decision = |policy, action, reason| Decision {
            pv: pv.name.clone(),
            node: node.to_string(),
            loss,
            policy,
            action,
            reason,
            dry_run: options.dry_run,
        };
        if nodes.is_empty() {
            decisions.push(decision(
                OnNodeLoss::Keep,
                Action::Nothing,
                Reason::NoNodesSeen,
            ));
            continue;
        }
        let policy = match policy_of(snapshot, pv, options.driver) {
            Ok(policy) => policy,
            Err(reason) => {
                decisions.push(decision(OnNodeLoss::Keep, Action::Nothing, reason));
                continue;
            }
        };
        if policy == OnNodeLoss::Keep {
            decisions.push(decision(policy, Action::Nothing, Reason::PolicyKeep));
            continue;
        }
        let (action, reason) = match bound_claim(snapshot, pv) {
            Some(claim) => release(snapshot, &nodes, node, claim),
            None => remove_pv(pv, loss),
        };
        decisions.push(decision(policy, action, reason));
    }
    decisions
}

/// The PV's policy: its VolumeAttributesClass's `onNodeLoss` when it sets one, else its
/// StorageClass's.
fn policy_of(snapshot: &Snapshot, pv: &PvView, driver: &str) -> Result<OnNodeLoss, Reason> {
    let attributes = pv.attributes_class.as_ref().and_then(|name| {
        snapshot
            .attributes_classes
            .iter()
            .find(|c| &c.name == name && c.driver == driver)
    });
    if let Some(policy) = attributes.and_then(|c| c.on_node_loss.clone()) {
        return policy.map_err(Reason::ClassParameterInvalid);
    }
    let class = snapshot
        .classes
        .iter()
        .find(|c| c.name == pv.storage_class)
        .ok_or(Reason::ClassMissing)?;
    if class.provisioner != driver {
        return Err(Reason::ClassOfAnotherProvisioner);
    }
    class
        .on_node_loss
        .clone()
        .map_err(Reason::ClassParameterInvalid)
}

/// The claim the PV is bound to: named by its claimRef (same uid when the ref has one) and
/// naming the PV back.
fn bound_claim<'s>(snapshot: &'s Snapshot, pv: &PvView) -> Option<&'s ClaimView> {
    let wanted = pv.claim.as_ref()?;
    snapshot.claims.iter().find(|c| {
        c.object.namespace == wanted.namespace
            && c.object.name == wanted.name
            && (wanted.uid.is_empty() || c.object.uid == wanted.uid)
            && c.volume_name == pv.name
    })
}

fn release(
    snapshot: &Snapshot,
    nodes: &BTreeMap<&str, &NodeView>,
    lost: &str,
    claim: &ClaimView,
) -> (Action, Reason) {
    let set = match provenance::owning_statefulset(snapshot, claim) {
        Ok(set) => set,
        Err(reason) => return (Action::Nothing, reason),
    };
    let users: Vec<&PodView> = snapshot
        .pods
        .iter()
        .filter(|p| {
            p.object.namespace == claim.object.namespace
                && !p.finished
                && p.claims.contains(&claim.object.name)
        })
        .collect();
    // A pod running elsewhere would mean the data is reachable after all: never pull it away.
    if let Some(live) = users.iter().find_map(|p| {
        p.node
            .as_deref()
            .filter(|n| *n != lost && nodes.get(n).is_some_and(|v| !is_out_of_service(v)))
    }) {
        return (Action::Nothing, Reason::InUseOnLiveNode(live.to_string()));
    }
    let mut waiting: Vec<ObjectRef> = users
        .iter()
        .filter(|p| {
            p.node.is_none()
                && !p.deleting
                && p.statefulset_uid.as_deref() == Some(set.object.uid.as_str())
        })
        .map(|p| p.object.clone())
        .collect();
    waiting.sort();
    if waiting.is_empty() {
        let reason = if claim.deleting {
            Reason::ClaimBeingDeleted
        } else {
            Reason::NoPodWaiting
        };
        return (Action::Nothing, reason);
    }
    if claim.deleting {
        return (
            Action::DeletePods { pods: waiting },
            Reason::ClaimBeingDeleted,
        );
    }
    (
        Action::ReleaseClaim {
            claim: claim.object.clone(),
            pods: waiting,
        },
        Reason::ClaimReleased,
    )
}

fn is_out_of_service(node: &NodeView) -> bool {
    node.taints.iter().any(|t| t == OUT_OF_SERVICE_TAINT)
}

fn remove_pv(pv: &PvView, loss: Loss) -> (Action, Reason) {
    let this_pv = || ObjectRef {
        namespace: String::new(),
        name: pv.name.clone(),
        uid: pv.uid.clone(),
    };
    match loss {
        Loss::OutOfService => (Action::Nothing, Reason::NodeMayReturn),
        Loss::Deleted if pv.reclaim_retain => (Action::Nothing, Reason::ReclaimRetain),
        // Deleted already: only what holds it is left to do (not a second deletion, which
        // would be counted twice).
        Loss::Deleted if pv.deleting && pv.provisioner_finalizer => (
            Action::DropPvFinalizer { pv: this_pv() },
            Reason::PvHeldByProvisionerFinalizer,
        ),
        Loss::Deleted if pv.deleting => (Action::Nothing, Reason::PvBeingDeleted),
        Loss::Deleted => (Action::DeletePv { pv: this_pv() }, Reason::PvReleased),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRIVER: &str = "stickyvol.csi.io";
    const ACT: Options<'static> = Options {
        driver: DRIVER,
        dry_run: false,
    };

    fn obj(namespace: &str, name: &str) -> ObjectRef {
        ObjectRef {
            namespace: namespace.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    fn node(name: &str, taints: &[&str], ready: bool) -> NodeView {
        NodeView {
            name: name.into(),
            taints: taints.iter().map(|t| t.to_string()).collect(),
            ready,
        }
    }

    fn class(name: &str, on_node_loss: Option<&str>) -> ClassView {
        ClassView {
            name: name.into(),
            provisioner: DRIVER.into(),
            on_node_loss: OnNodeLoss::parse(on_node_loss),
        }
    }

    /// Node `a` up, node `b` lost (absent unless the test adds it); StatefulSet `db` in `ns`
    /// with template `data` (selector app=db), replica 0's claim `data-db-0`, made by its
    /// controller after it, bound to `pv-b` on `b`, its pod `db-0` pending; class `sv` with
    /// `release`.
    fn cluster() -> Snapshot {
        let app_db = BTreeMap::from([("app".to_string(), "db".to_string())]);
        let set = StatefulSetView {
            object: obj("ns", "db"),
            created: Some(1_000),
            selector: app_db.clone(),
            templates: vec![TemplateView {
                name: "data".into(),
                labels: BTreeMap::new(),
            }],
        };
        Snapshot {
            nodes: vec![node("a", &[], true)],
            pvs: vec![PvView {
                name: "pv-b".into(),
                uid: "uid-pv-b".into(),
                driver: DRIVER.into(),
                volume_handle: "sv-123".into(),
                storage_class: "sv".into(),
                node: Some("b".into()),
                claim: Some(obj("ns", "data-db-0")),
                reclaim_retain: false,
                deleting: false,
                provisioner_finalizer: true,
                attributes_class: None,
            }],
            claims: vec![ClaimView {
                object: obj("ns", "data-db-0"),
                volume_name: "pv-b".into(),
                deleting: false,
                created: Some(1_001),
                labels: app_db,
                owners: Vec::new(),
            }],
            pods: vec![PodView {
                object: obj("ns", "db-0"),
                node: None,
                claims: vec!["data-db-0".into()],
                statefulset_uid: Some(set.object.uid.clone()),
                deleting: false,
                finished: false,
            }],
            statefulsets: vec![set],
            classes: vec![class("sv", Some("release"))],
            attributes_classes: Vec::new(),
        }
    }

    fn only(decisions: Vec<Decision>) -> Decision {
        assert_eq!(decisions.len(), 1, "{decisions:#?}");
        decisions.into_iter().next().unwrap()
    }

    fn release_of_db0() -> Action {
        Action::ReleaseClaim {
            claim: obj("ns", "data-db-0"),
            pods: vec![obj("ns", "db-0")],
        }
    }

    #[test]
    fn a_deleted_node_with_release_frees_the_claim_and_its_pending_pod() {
        let d = only(decide(&cluster(), ACT));
        assert_eq!((d.loss, d.policy), (Loss::Deleted, OnNodeLoss::Release));
        assert_eq!(d.action, release_of_db0());
        assert_eq!(d.reason, Reason::ClaimReleased);
        assert_eq!(d.to_carry_out(), Some(&release_of_db0()));
    }

    #[test]
    fn an_out_of_service_node_with_release_frees_the_claim_too() {
        let mut s = cluster();
        s.nodes
            .push(node("b", &["other/taint", OUT_OF_SERVICE_TAINT], false));
        let d = only(decide(&s, ACT));
        assert_eq!(d.loss, Loss::OutOfService);
        assert_eq!(d.action, release_of_db0());
    }

    #[test]
    fn an_attributes_class_policy_wins_over_the_storage_class_only_when_it_is_ours() {
        let attributes = |driver: &str, policy: Option<&str>| AttributesClassView {
            name: "vac".into(),
            driver: driver.into(),
            on_node_loss: policy.map(|p| OnNodeLoss::parse(Some(p))),
        };
        let with = |view: AttributesClassView| {
            let mut s = cluster();
            s.pvs[0].attributes_class = Some("vac".into());
            s.attributes_classes = vec![view];
            only(decide(&s, ACT))
        };
        assert_eq!(
            with(attributes(DRIVER, Some("keep"))).action,
            Action::Nothing
        );
        // Another driver's class of that name, or one without the key: the StorageClass's.
        assert_eq!(
            with(attributes("other.csi.io", Some("keep"))).action,
            release_of_db0()
        );
        assert_eq!(with(attributes(DRIVER, None)).action, release_of_db0());
        let bad = with(attributes(DRIVER, Some("sometimes")));
        assert!(
            matches!(bad.reason, Reason::ClassParameterInvalid(_)),
            "{bad:?}"
        );
        assert_eq!(bad.action, Action::Nothing);
    }

    #[test]
    fn keep_is_the_default_and_does_nothing() {
        for params in [None, Some("keep")] {
            let mut s = cluster();
            s.classes = vec![class("sv", params)];
            let d = only(decide(&s, ACT));
            assert_eq!((d.policy, &d.action), (OnNodeLoss::Keep, &Action::Nothing));
            assert_eq!(d.reason, Reason::PolicyKeep);
            assert_eq!(d.to_carry_out(), None);
        }
    }

    #[test]
    fn a_class_that_is_gone_foreign_or_invalid_means_keep() {
        let mut foreign = class("sv", Some("release"));
        foreign.provisioner = "other.csi.io".into();
        for (classes, reason) in [
            (vec![], Reason::ClassMissing),
            (vec![foreign], Reason::ClassOfAnotherProvisioner),
        ] {
            let mut s = cluster();
            s.classes = classes;
            let d = only(decide(&s, ACT));
            assert_eq!((d.action, d.reason), (Action::Nothing, reason));
        }
        let mut s = cluster();
        s.classes = vec![class("sv", Some("Release"))];
        let d = only(decide(&s, ACT));
        assert_eq!(d.action, Action::Nothing);
        assert!(
            matches!(d.reason, Reason::ClassParameterInvalid(_)),
            "{:?}",
            d.reason
        );
    }

    #[test]
    fn a_not_ready_node_without_the_taint_is_never_touched() {
        let mut s = cluster();
        s.nodes
            .push(node("b", &["node.kubernetes.io/unreachable"], false));
        assert_eq!(decide(&s, ACT), vec![]);
    }

    #[test]
    fn a_node_that_came_back_is_never_touched() {
        // Deleted, then registered again under the same name (a new Node object).
        let mut s = cluster();
        s.nodes.push(node("b", &[], true));
        assert_eq!(decide(&s, ACT), vec![]);
        // Or its out-of-service taint removed: same view.
    }

    #[test]
    fn pvs_and_classes_of_other_drivers_are_never_touched() {
        let mut s = cluster();
        s.pvs[0].driver = "other.csi.io".into();
        s.classes[0].provisioner = "other.csi.io".into();
        assert_eq!(decide(&s, ACT), vec![]);
    }

    #[test]
    fn claims_not_made_from_a_statefulset_template_are_never_touched() {
        // (Every other shape of name: `provenance`.)
        for name in ["data-db-01", "logs-db-0", "mine"] {
            let mut s = cluster();
            s.claims[0].object.name = name.into();
            s.pvs[0].claim = Some(ObjectRef {
                name: name.into(),
                ..obj("ns", "data-db-0")
            });
            s.pods[0].claims = vec![name.into()];
            let d = only(decide(&s, ACT));
            assert_eq!(
                (d.action, d.reason),
                (Action::Nothing, Reason::NotStatefulSetClaim),
                "{name}"
            );
        }
        // Dashes in both names still parse, and a large ordinal is fine.
        let mut s = cluster();
        s.statefulsets[0].object.name = "my-db".into();
        s.statefulsets[0].templates[0].name = "pg-data".into();
        s.claims[0].object.name = "pg-data-my-db-12".into();
        s.pvs[0].claim.as_mut().unwrap().name = "pg-data-my-db-12".into();
        s.pods[0].claims = vec!["pg-data-my-db-12".into()];
        assert_eq!(only(decide(&s, ACT)).reason, Reason::ClaimReleased);
    }

    #[test]
    fn a_claim_only_named_like_a_statefulsets_is_never_touched() {
        // A set (and its pending pod) named after a claim that was there before it.
        let mut s = cluster();
        s.statefulsets[0].created = Some(2_000);
        let d = only(decide(&s, ACT));
        assert_eq!(d.action, Action::Nothing);
        let why = d.reason.to_string();
        assert!(
            why.starts_with("the claim is named like a StatefulSet's but its controller did not")
                && why.contains("StatefulSet db: the claim was created before the StatefulSet"),
            "{why}"
        );
        // Or made after it, but without the labels the set's controller puts on its claims.
        let mut s = cluster();
        s.claims[0].labels.clear();
        let d = only(decide(&s, ACT));
        assert_eq!(d.action, Action::Nothing);
        assert!(
            d.reason.to_string().contains("lacks the label app=db"),
            "{}",
            d.reason
        );
        // Dry run reports the same.
        let mut s = cluster();
        s.statefulsets[0].created = Some(2_000);
        let dry = Options {
            dry_run: true,
            ..ACT
        };
        assert!(matches!(
            only(decide(&s, dry)).reason,
            Reason::NotMadeByStatefulSet(_)
        ));
    }

    #[test]
    fn only_pending_pods_of_the_owning_statefulset_are_deleted() {
        // Scheduled to the lost node (Kubernetes removes it), being deleted, of another
        // controller, finished, or absent: nobody waits, so nothing yet.
        let cases: [fn(&mut PodView); 4] = [
            |p| p.node = Some("b".into()),
            |p| p.deleting = true,
            |p| p.statefulset_uid = Some("uid-someone-else".into()),
            |p| p.statefulset_uid = None,
        ];
        for change in cases {
            let mut s = cluster();
            change(&mut s.pods[0]);
            let d = only(decide(&s, ACT));
            assert_eq!(
                (d.action, d.reason),
                (Action::Nothing, Reason::NoPodWaiting)
            );
        }
        let mut s = cluster();
        s.pods.clear();
        assert_eq!(only(decide(&s, ACT)).reason, Reason::NoPodWaiting);
        // A pod in another namespace with the same claim name is not a user.
        let mut s = cluster();
        s.pods[0].object.namespace = "elsewhere".into();
        assert_eq!(only(decide(&s, ACT)).reason, Reason::NoPodWaiting);
    }

    #[test]
    fn a_claim_in_use_on_a_live_node_is_never_released() {
        let mut s = cluster();
        let mut running = s.pods[0].clone();
        running.object = obj("ns", "reader");
        running.node = Some("a".into());
        running.statefulset_uid = None;
        s.pods.push(running.clone());
        let d = only(decide(&s, ACT));
        assert_eq!(
            (d.action, d.reason),
            (Action::Nothing, Reason::InUseOnLiveNode("a".into()))
        );
        // A finished pod holds nothing.
        let mut s = cluster();
        running.finished = true;
        s.pods.push(running);
        assert_eq!(only(decide(&s, ACT)).reason, Reason::ClaimReleased);
    }

    #[test]
    fn a_claim_being_deleted_has_its_waiting_pods_deleted_again() {
        let mut s = cluster();
        s.claims[0].deleting = true;
        let d = only(decide(&s, ACT));
        assert_eq!(
            d.action,
            Action::DeletePods {
                pods: vec![obj("ns", "db-0")]
            }
        );
        assert_eq!(d.reason, Reason::ClaimBeingDeleted);
        s.pods.clear();
        let d = only(decide(&s, ACT));
        assert_eq!(
            (d.action, d.reason),
            (Action::Nothing, Reason::ClaimBeingDeleted)
        );
    }

    #[test]
    fn a_pv_no_claim_holds_is_deleted_only_when_its_node_is_deleted() {
        let pv_gone = Action::DeletePv {
            pv: ObjectRef {
                namespace: String::new(),
                name: "pv-b".into(),
                uid: "uid-pv-b".into(),
            },
        };
        // Claim deleted (released PV), or replaced by a new claim of the same name.
        let mut released = cluster();
        released.claims.clear();
        let mut replaced = cluster();
        replaced.claims[0].object.uid = "uid-new".into();
        replaced.claims[0].volume_name = "pv-new".into();
        for s in [&released, &replaced] {
            let d = only(decide(s, ACT));
            assert_eq!((&d.action, &d.reason), (&pv_gone, &Reason::PvReleased));
        }
        // The node only out of service: it may come back with its data.
        let mut s = released.clone();
        s.nodes.push(node("b", &[OUT_OF_SERVICE_TAINT], false));
        let d = only(decide(&s, ACT));
        assert_eq!(
            (d.action, d.reason),
            (Action::Nothing, Reason::NodeMayReturn)
        );
        // Retain is the owner's word.
        let mut s = released.clone();
        s.pvs[0].reclaim_retain = true;
        let d = only(decide(&s, ACT));
        assert_eq!(
            (d.action, d.reason),
            (Action::Nothing, Reason::ReclaimRetain)
        );
        // A PV already being deleted is not deleted, nor counted, twice: the provisioner's
        // finalizer is dropped if it still holds it, and then it is left to go.
        let mut s = released.clone();
        s.pvs[0].deleting = true;
        let d = only(decide(&s, ACT));
        let Action::DeletePv { pv } = pv_gone.clone() else {
            unreachable!()
        };
        assert_eq!(
            (d.action, d.reason),
            (
                Action::DropPvFinalizer { pv },
                Reason::PvHeldByProvisionerFinalizer
            )
        );
        s.pvs[0].provisioner_finalizer = false;
        let d = only(decide(&s, ACT));
        assert_eq!(
            (d.action, d.reason),
            (Action::Nothing, Reason::PvBeingDeleted)
        );
        // keep keeps the PV too.
        let mut s = released;
        s.classes = vec![class("sv", None)];
        assert_eq!(only(decide(&s, ACT)).action, Action::Nothing);
    }

    #[test]
    fn a_claim_ref_without_uid_matches_by_name_and_a_claim_must_name_the_pv_back() {
        let mut s = cluster();
        s.pvs[0].claim.as_mut().unwrap().uid.clear();
        assert_eq!(only(decide(&s, ACT)).action, release_of_db0());
        let mut s = cluster();
        s.claims[0].volume_name = "pv-other".into();
        assert!(matches!(
            only(decide(&s, ACT)).action,
            Action::DeletePv { .. }
        ));
    }

    #[test]
    fn an_empty_node_list_decides_nothing() {
        let mut s = cluster();
        s.nodes.clear();
        let d = only(decide(&s, ACT));
        assert_eq!((d.action, d.reason), (Action::Nothing, Reason::NoNodesSeen));
    }

    #[test]
    fn a_pv_without_a_node_or_on_a_live_node_gets_no_decision() {
        let mut s = cluster();
        s.pvs[0].node = None;
        assert_eq!(decide(&s, ACT), vec![]);
        let mut s = cluster();
        s.pvs[0].node = Some("a".into());
        assert_eq!(decide(&s, ACT), vec![]);
    }

    #[test]
    fn dry_run_decides_the_same_and_carries_out_nothing() {
        let acting = decide(&cluster(), ACT);
        let dry = decide(
            &cluster(),
            Options {
                dry_run: true,
                ..ACT
            },
        );
        assert_eq!(dry.len(), acting.len());
        for (a, d) in acting.iter().zip(&dry) {
            assert_eq!((&a.action, &a.reason), (&d.action, &d.reason));
            assert!(d.dry_run);
            assert_eq!(d.to_carry_out(), None);
        }
        assert!(acting[0].to_carry_out().is_some());
    }

    #[test]
    fn several_pvs_are_decided_each_in_name_order() {
        let mut s = cluster();
        let mut second = s.pvs[0].clone();
        second.name = "pv-a-second".into();
        second.uid = "uid-pv-a-second".into();
        second.claim = None;
        s.pvs.push(second);
        let mut live = s.pvs[0].clone();
        live.name = "pv-on-a".into();
        live.node = Some("a".into());
        s.pvs.push(live);
        let got: Vec<_> = decide(&s, ACT)
            .into_iter()
            .map(|d| (d.pv, d.action.kind()))
            .collect();
        assert_eq!(
            got,
            [
                ("pv-a-second".to_string(), "delete_pv"),
                ("pv-b".to_string(), "release_claim")
            ]
        );
    }
}
