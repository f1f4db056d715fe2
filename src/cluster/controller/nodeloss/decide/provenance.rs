//! Whether a StatefulSet's controller made a claim, from what the controller writes on the claims
//! it creates (Kubernetes v1.37 `pkg/controller/statefulset`): the name
//! `<template>-<statefulset>-<ordinal>`, the template's labels with the set's
//! `selector.matchLabels` over them, and, with a `persistentVolumeClaimRetentionPolicy` that
//! deletes, a controller reference to the set or to its pod. A name alone proves nothing: anyone
//! who may create StatefulSets can name one and its template after an existing claim. So the
//! claim must also carry those labels, be no older than the set (the controller creates a claim
//! only once its set exists), and be controlled by nothing else. A set deleted with
//! `--cascade=orphan` and created again is newer than its claims: they are refused, and stay
//! for an operator to release by hand.

use std::collections::BTreeMap;

use super::{ClaimView, Reason, Snapshot, StatefulSetView};

/// An ownerReference as the checks need it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnerView {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
    pub controller: bool,
}

/// One of a StatefulSet's `volumeClaimTemplates`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemplateView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// The StatefulSet whose controller made `claim`; otherwise why none is taken to have.
pub fn owning_statefulset<'s>(
    snapshot: &'s Snapshot,
    claim: &ClaimView,
) -> Result<&'s StatefulSetView, Reason> {
    let named: Vec<(&StatefulSetView, &TemplateView, &str)> = snapshot
        .statefulsets
        .iter()
        .filter(|set| set.object.namespace == claim.object.namespace)
        .flat_map(|set| {
            set.templates.iter().filter_map(move |template| {
                ordinal_of(&claim.object.name, &template.name, &set.object.name)
                    .map(|ordinal| (set, template, ordinal))
            })
        })
        .collect();
    if named.is_empty() {
        return Err(Reason::NotStatefulSetClaim);
    }
    let mut made = Vec::new();
    let mut refused = Vec::new();
    for (set, template, ordinal) in named {
        match made_by(claim, set, template, ordinal) {
            Ok(()) => made.push(set),
            Err(why) => refused.push(format!("StatefulSet {}: {why}", set.object.name)),
        }
    }
    match made.as_slice() {
        [set] => Ok(set),
        [] => Err(Reason::NotMadeByStatefulSet(refused.join("; "))),
        // Two sets whose names and templates spell the same claim name: neither is believed.
        _ => Err(Reason::NotMadeByStatefulSet(format!(
            "StatefulSets {} could each have made it",
            made.iter()
                .map(|s| s.object.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The ordinal in `claim` if it is `<template>-<set>-<ordinal>`.
fn ordinal_of<'c>(claim: &'c str, template: &str, set: &str) -> Option<&'c str> {
    claim
        .strip_prefix(template)?
        .strip_prefix('-')?
        .strip_prefix(set)?
        .strip_prefix('-')
        .filter(|rest| is_ordinal(rest))
}

/// A StatefulSet ordinal as its controller writes it: decimal, no sign, no leading zero.
fn is_ordinal(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 10
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'))
}

/// Whether what the controller writes on the claims it makes from `template` is on `claim`.
fn made_by(
    claim: &ClaimView,
    set: &StatefulSetView,
    template: &TemplateView,
    ordinal: &str,
) -> Result<(), String> {
    match (claim.created, set.created) {
        (Some(claim_at), Some(set_at)) if claim_at >= set_at => {}
        (Some(_), Some(_)) => return Err("the claim was created before the StatefulSet".into()),
        _ => return Err("a creation time is missing".into()),
    }
    // The selector's labels win over the template's, as in the controller.
    let mut wanted = template.labels.clone();
    wanted.extend(set.selector.iter().map(|(k, v)| (k.clone(), v.clone())));
    if let Some((key, value)) = wanted
        .iter()
        .find(|(k, v)| claim.labels.get(*k) != Some(*v))
    {
        return Err(format!(
            "the claim lacks the label {key}={value} the StatefulSet puts on its claims"
        ));
    }
    let pod = format!("{}-{ordinal}", set.object.name);
    for owner in &claim.owners {
        let is_set = owner.api_version == "apps/v1"
            && owner.kind == "StatefulSet"
            && owner.name == set.object.name;
        let is_pod = owner.api_version == "v1" && owner.kind == "Pod" && owner.name == pod;
        if is_set && owner.uid != set.object.uid {
            return Err("the claim belongs to an earlier StatefulSet of that name".into());
        }
        if owner.controller && !is_set && !is_pod {
            return Err(format!(
                "the claim is controlled by {} {}",
                owner.kind, owner.name
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::controller::nodeloss::decide::ObjectRef;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn set(name: &str, template: &str, created: i64) -> StatefulSetView {
        StatefulSetView {
            object: ObjectRef {
                namespace: "ns".into(),
                name: name.into(),
                uid: format!("uid-{name}"),
            },
            created: Some(created),
            selector: labels(&[("app", name)]),
            templates: vec![TemplateView {
                name: template.into(),
                labels: labels(&[("tier", "storage")]),
            }],
        }
    }

    /// What the controller of `set("db", "data", 100)` makes for ordinal 0, at time 105.
    fn genuine() -> ClaimView {
        ClaimView {
            object: ObjectRef {
                namespace: "ns".into(),
                name: "data-db-0".into(),
                uid: "uid-claim".into(),
            },
            created: Some(105),
            labels: labels(&[("app", "db"), ("tier", "storage")]),
            ..ClaimView::default()
        }
    }

    fn snapshot(sets: Vec<StatefulSetView>) -> Snapshot {
        Snapshot {
            statefulsets: sets,
            ..Snapshot::default()
        }
    }

    fn refusal(s: &Snapshot, claim: &ClaimView) -> String {
        match owning_statefulset(s, claim) {
            Err(Reason::NotMadeByStatefulSet(why)) => why,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_claim_the_controller_made_is_its_sets() {
        let s = snapshot(vec![set("db", "data", 100)]);
        assert_eq!(
            owning_statefulset(&s, &genuine()).unwrap().object.name,
            "db"
        );
        // Made in the same second as the set; more labels than the set's; owned by the set or
        // by its pod, as a deleting retention policy makes it.
        let mut claim = genuine();
        claim.created = Some(100);
        claim.labels.insert("extra".into(), "x".into());
        for owner in [
            ("apps/v1", "StatefulSet", "db", "uid-db"),
            ("v1", "Pod", "db-0", "uid-pod"),
        ] {
            claim.owners = vec![OwnerView {
                api_version: owner.0.into(),
                kind: owner.1.into(),
                name: owner.2.into(),
                uid: owner.3.into(),
                controller: true,
            }];
            assert!(owning_statefulset(&s, &claim).is_ok(), "{owner:?}");
        }
    }

    #[test]
    fn a_look_alike_set_made_after_the_claim_does_not_own_it() {
        // Someone names a set and its template after an existing claim, labels and all.
        let s = snapshot(vec![set("db", "data", 200)]);
        let why = refusal(&s, &genuine());
        assert!(why.contains("created before the StatefulSet"), "{why}");
        let mut undated = genuine();
        undated.created = None;
        assert!(refusal(&s, &undated).contains("creation time is missing"));
    }

    #[test]
    fn a_claim_without_the_sets_labels_is_not_its() {
        let s = snapshot(vec![set("db", "data", 100)]);
        for (key, value) in [("app", "other"), ("tier", "web")] {
            let mut claim = genuine();
            claim.labels.insert(key.into(), value.into());
            let why = refusal(&s, &claim);
            assert!(why.contains("lacks the label"), "{why}");
        }
        let mut bare = genuine();
        bare.labels.clear();
        assert!(refusal(&s, &bare).contains("lacks the label"));
        // The selector's value wins over the template's for the same key.
        let mut s = snapshot(vec![set("db", "data", 100)]);
        s.statefulsets[0].templates[0]
            .labels
            .insert("app".into(), "template".into());
        assert!(owning_statefulset(&s, &genuine()).is_ok());
    }

    #[test]
    fn a_claim_controlled_by_another_owner_is_not_the_sets() {
        let s = snapshot(vec![set("db", "data", 100)]);
        let owned = |api: &str, kind: &str, name: &str, uid: &str, controller| {
            let mut claim = genuine();
            claim.owners = vec![OwnerView {
                api_version: api.into(),
                kind: kind.into(),
                name: name.into(),
                uid: uid.into(),
                controller,
            }];
            claim
        };
        let why = refusal(&s, &owned("example.com/v1", "Database", "db", "u", true));
        assert!(why.contains("controlled by Database db"), "{why}");
        // Another pod than the set's for this ordinal.
        assert!(refusal(&s, &owned("v1", "Pod", "db-1", "u", true)).contains("controlled by"));
        // A set of the same name but another uid: an earlier one.
        let why = refusal(&s, &owned("apps/v1", "StatefulSet", "db", "uid-old", false));
        assert!(why.contains("earlier StatefulSet"), "{why}");
        // Another owner that is no controller does not matter.
        assert!(owning_statefulset(&s, &owned("v1", "ConfigMap", "x", "u", false)).is_ok());
    }

    #[test]
    fn two_sets_that_could_each_have_made_the_claim_are_both_refused() {
        // data + my-db and data-my + db both spell data-my-db-0.
        let mut a = set("my-db", "data", 100);
        let mut b = set("db", "data-my", 100);
        a.selector = labels(&[("app", "x")]);
        b.selector = labels(&[("app", "x")]);
        let s = snapshot(vec![a, b]);
        let mut claim = genuine();
        claim.object.name = "data-my-db-0".into();
        claim.labels = labels(&[("app", "x"), ("tier", "storage")]);
        let why = refusal(&s, &claim);
        assert!(why.contains("could each have made it"), "{why}");
        // The one that could not have is no rival.
        let mut s = s;
        s.statefulsets[1].created = Some(500);
        assert_eq!(owning_statefulset(&s, &claim).unwrap().object.name, "my-db");
    }

    #[test]
    fn names_not_of_the_template_set_ordinal_shape_are_no_sets_claims() {
        let s = snapshot(vec![set("db", "data", 100)]);
        for name in [
            "data-db",
            "data-db-",
            "data-db-x",
            "data-db-01",
            "data-db--1",
            "data-db-12345678901",
            "logs-db-0",
            "data-dbx-0",
            "data-other-0",
            "mine",
        ] {
            let mut claim = genuine();
            claim.object.name = name.into();
            assert_eq!(
                owning_statefulset(&s, &claim).unwrap_err(),
                Reason::NotStatefulSetClaim,
                "{name}"
            );
        }
        // The same name in another namespace than the set's.
        let mut claim = genuine();
        claim.object.namespace = "elsewhere".into();
        assert_eq!(
            owning_statefulset(&s, &claim).unwrap_err(),
            Reason::NotStatefulSetClaim
        );
    }
}
