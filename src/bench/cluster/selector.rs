//! The simulated API server's label selectors: the equality and existence requirements the
//! drivers send (`k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated), every one of which an
//! object's labels must meet. Without them a node plugin's watch of the PVs labelled for it
//! would be sent every PV of the cluster, as no real API server sends it.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Absent(String),
}

/// A parsed `labelSelector`; the empty one matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector(Vec<Requirement>);

impl Selector {
    pub fn parse(text: &str) -> Selector {
        let requirement = |part: &str| {
            let part = part.trim();
            if let Some((key, value)) = part.split_once("!=") {
                Requirement::NotEquals(key.trim().into(), value.trim().into())
            } else if let Some((key, value)) = part.split_once('=') {
                let value = value.strip_prefix('=').unwrap_or(value);
                Requirement::Equals(key.trim().into(), value.trim().into())
            } else if let Some(key) = part.strip_prefix('!') {
                Requirement::Absent(key.trim().into())
            } else {
                Requirement::Exists(part.into())
            }
        };
        Selector(
            text.split(',')
                .filter(|p| !p.trim().is_empty())
                .map(requirement)
                .collect(),
        )
    }

    /// Whether the serialized object's labels meet every requirement.
    pub fn matches(&self, object: &[u8]) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let Ok(object) = serde_json::from_slice::<Value>(object) else {
            return false;
        };
        let label = |key: &str| {
            object["metadata"]["labels"][key]
                .as_str()
                .map(str::to_string)
        };
        self.0.iter().all(|requirement| match requirement {
            Requirement::Equals(key, value) => label(key).as_deref() == Some(value.as_str()),
            Requirement::NotEquals(key, value) => label(key).as_deref() != Some(value.as_str()),
            Requirement::Exists(key) => label(key).is_some(),
            Requirement::Absent(key) => label(key).is_none(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(labels: Value) -> Vec<u8> {
        serde_json::json!({"metadata": {"name": "x", "labels": labels}})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn each_requirement_form_the_drivers_send_is_met_or_not() {
        let pv = labelled(serde_json::json!({"a": "1", "b": "2"}));
        for (selector, expected) in [
            ("", true),
            ("a=1", true),
            ("a==1", true),
            ("a=2", false),
            ("a!=2", true),
            ("a!=1", false),
            ("a", true),
            ("c", false),
            ("!c", true),
            ("!a", false),
            ("a=1,b=2", true),
            ("a=1, b=3", false),
            ("c!=1", true),
        ] {
            assert_eq!(
                Selector::parse(selector).matches(&pv),
                expected,
                "{selector:?}"
            );
        }
        let unlabelled = br#"{"metadata":{"name":"y"}}"#;
        assert!(Selector::parse("!a").matches(unlabelled));
        assert!(!Selector::parse("a=1").matches(unlabelled));
        assert!(!Selector::parse("a").matches(b"not json"));
    }
}
