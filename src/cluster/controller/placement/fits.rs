//! Whether a pod may run on a node as far as the pod itself says: its `nodeName`, its
//! `nodeSelector`, its required node affinity, and its tolerations of the node's NoSchedule and
//! NoExecute taints. The scheduler's other filters (resources, ports, spreading) are its own
//! business: a restore can go nowhere else anyway, and they may change; these cannot, short of
//! editing the pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, Taint, Toleration,
};

use crate::cluster::kit::slim::Pod;

/// What of a node the rules read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFacts {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub ready: bool,
    pub unschedulable: bool,
}

impl NodeFacts {
    pub fn of(node: &Node) -> NodeFacts {
        let spec = node.spec.as_ref();
        let conditions = node.status.as_ref().and_then(|s| s.conditions.as_deref());
        NodeFacts {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: spec.and_then(|s| s.taints.clone()).unwrap_or_default(),
            ready: conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True"),
            unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        }
    }
}

/// Why a pod cannot run on a node, in words for an Event; None when it may.
pub fn excluded_by(pod: &Pod, node: &NodeFacts) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(name) = spec.node_name.as_deref().filter(|n| !n.is_empty())
        && name != node.name
    {
        return Some(format!("its nodeName is {name}"));
    }
    for (key, value) in &spec.node_selector {
        if node.labels.get(key) != Some(value) {
            return Some(format!("its nodeSelector {key}={value}"));
        }
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    if let Some(selector) = required
        && !selector
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, node))
    {
        return Some("its required node affinity".into());
    }
    let tolerations = &spec.tolerations;
    node.taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
        .map(|t| format!("it does not tolerate the taint {}:{}", t.key, t.effect))
}

/// A term matches when all its requirements do; a term with none matches no node (as the
/// scheduler reads it).
fn term_matches(term: &NodeSelectorTerm, node: &NodeFacts) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions
        .iter()
        .all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            let value = (r.key == "metadata.name").then_some(node.name.as_str());
            requirement_matches(r, value)
        })
}

fn requirement_matches(req: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = req.values.as_deref().unwrap_or_default();
    let number = |v: &str| v.parse::<i64>().ok();
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => match (
            value.and_then(number),
            values.first().and_then(|x| number(x)),
        ) {
            (Some(v), Some(bound)) if req.operator == "Gt" => v > bound,
            (Some(v), Some(bound)) => v < bound,
            _ => false,
        },
        _ => false,
    }
}

fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect_ok = toleration
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key = toleration.key.as_deref().unwrap_or_default();
    let exists = toleration.operator.as_deref() == Some("Exists");
    if key.is_empty() {
        // An empty key tolerates every taint, with Exists only.
        return exists && effect_ok;
    }
    let value_ok = exists
        || toleration.value.as_deref().unwrap_or_default()
            == taint.value.as_deref().unwrap_or_default();
    key == taint.key && value_ok && effect_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node() -> NodeFacts {
        NodeFacts {
            name: "n1".into(),
            labels: [
                ("kubernetes.io/hostname".to_string(), "n1".to_string()),
                ("disk".to_string(), "nvme".to_string()),
                ("cores".to_string(), "8".to_string()),
            ]
            .into(),
            taints: vec![Taint {
                key: "dedicated".into(),
                value: Some("db".into()),
                effect: "NoSchedule".into(),
                ..Taint::default()
            }],
            ready: true,
            unschedulable: false,
        }
    }

    fn pod(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c"}]);
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    const DB: &str =
        r#"{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}"#;

    fn tolerating(mut spec: serde_json::Value) -> serde_json::Value {
        spec["tolerations"] = json!([serde_json::from_str::<serde_json::Value>(DB).unwrap()]);
        spec
    }

    #[test]
    fn a_pod_that_says_nothing_fits_an_untainted_node() {
        let mut n = node();
        n.taints.clear();
        assert_eq!(excluded_by(&pod(json!({})), &n), None);
    }

    #[test]
    fn taints_need_a_matching_toleration() {
        let why = excluded_by(&pod(json!({})), &node()).unwrap();
        assert!(why.contains("dedicated:NoSchedule"), "{why}");
        assert_eq!(excluded_by(&pod(tolerating(json!({}))), &node()), None);
        let wrong_value =
            json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "web"}]});
        assert!(excluded_by(&pod(wrong_value), &node()).is_some());
        let everything = json!({"tolerations": [{"operator": "Exists"}]});
        assert_eq!(excluded_by(&pod(everything), &node()), None);
        let other_effect = json!({"tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}]});
        assert!(excluded_by(&pod(other_effect), &node()).is_some());
        let mut soft = node();
        soft.taints[0].effect = "PreferNoSchedule".into();
        assert_eq!(excluded_by(&pod(json!({})), &soft), None);
    }

    #[test]
    fn node_name_and_selector_must_name_this_node() {
        assert!(excluded_by(&pod(tolerating(json!({"nodeName": "n2"}))), &node()).is_some());
        assert_eq!(
            excluded_by(&pod(tolerating(json!({"nodeName": "n1"}))), &node()),
            None
        );
        let sel = |v: &str| tolerating(json!({"nodeSelector": {"disk": v}}));
        assert_eq!(excluded_by(&pod(sel("nvme")), &node()), None);
        let why = excluded_by(&pod(sel("hdd")), &node()).unwrap();
        assert!(why.contains("disk=hdd"), "{why}");
    }

    fn affinity(terms: serde_json::Value) -> Pod {
        pod(tolerating(json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}})))
    }

    #[test]
    fn required_affinity_terms_are_ored_and_their_requirements_anded() {
        let fits = |terms| excluded_by(&affinity(terms), &node()).is_none();
        assert!(fits(
            json!([{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["nvme"]}]}])
        ));
        assert!(!fits(
            json!([{"matchExpressions": [{"key": "disk", "operator": "NotIn", "values": ["nvme"]}]}])
        ));
        assert!(fits(json!([
            {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["hdd"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        ])));
        assert!(!fits(json!([{"matchExpressions": [
            {"key": "disk", "operator": "Exists"},
            {"key": "gpu", "operator": "Exists"}
        ]}])));
        assert!(fits(
            json!([{"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}])
        ));
        assert!(fits(
            json!([{"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["4"]}]}])
        ));
        assert!(!fits(
            json!([{"matchExpressions": [{"key": "cores", "operator": "Lt", "values": ["4"]}]}])
        ));
        assert!(!fits(json!([{}])), "an empty term matches nothing");
        assert!(!fits(json!([])), "no term matches nothing");
    }
}
