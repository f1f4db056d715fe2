//! An overflowing volume's eviction request, the one thing a node plugin and the controller say
//! to each other about evictions. A node plugin has no eviction right: with one, its credentials
//! could evict any pod whose uid it learned (a generic ephemeral volume's claim carries its
//! pod's). It writes the pods it wants evicted on its own volume's PV instead (the node-volumes
//! admission policy already holds a node to the PVs pinned to it), and the controller evicts
//! each only after checking that the pod runs on that node and uses that volume
//! (`controller::evictions`).
//!
//! The request is an annotation (what to evict, why, until when) and a label (so the controller
//! watches only the PVs that carry one). The node writes it again every round while the volume
//! overflows; each write is a change the controller sees, and its retry. It expires on its own,
//! so a request left behind by a node that stopped (or a volume back within its size before the
//! node could withdraw it) evicts nothing after a controller restart.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::volume::state::record::PodRef;

/// On a PV that carries a request: what the controller's watch selects.
pub const LABEL: &str = "stickyvol.csi.io/eviction-requested";
/// The request itself, as JSON.
pub const ANNOTATION: &str = "stickyvol.csi.io/eviction-request";
/// Pods one request may name: more than one volume's publications ever are.
pub const MAX_PODS: usize = 32;
/// Characters of the node's reason the controller repeats in its Events.
const MAX_WHY: usize = 512;

/// What a node asks: evict these pods, for this reason, until then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EvictionRequest {
    pub pods: Vec<PodRef>,
    /// Why the volume overflows, as the node measured it ("uses N bytes, more than ...").
    pub why: String,
    /// Milliseconds since the epoch after which the request means nothing.
    pub expires_unix_ms: u64,
}

/// The JSON merge patch that puts `request` on a PV, or (None) takes any request off it.
pub fn merge_patch(request: Option<&EvictionRequest>) -> Value {
    match request {
        Some(request) => json!({"metadata": {
            "labels": {LABEL: "true"},
            "annotations": {ANNOTATION: serde_json::to_string(request).unwrap_or_default()},
        }}),
        None => json!({"metadata": {
            "labels": {LABEL: null},
            "annotations": {ANNOTATION: null},
        }}),
    }
}

/// Why a request is not acted on at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unusable {
    /// Past its expiry: a leftover, not a mistake.
    Expired,
    /// Not a request this driver writes (a node's, or anybody's with PV rights, mistake).
    Malformed(String),
}

/// The request an annotation holds, checked: well-formed, at most `MAX_PODS` valid pod names,
/// and not expired at `now_unix_ms`. The reason is cut to `MAX_WHY` characters.
pub fn parse(annotation: &str, now_unix_ms: u64) -> Result<EvictionRequest, Unusable> {
    let mut request: EvictionRequest = serde_json::from_str(annotation)
        .map_err(|err| Unusable::Malformed(format!("not an eviction request: {err}")))?;
    if request.pods.len() > MAX_PODS {
        return Err(Unusable::Malformed(format!(
            "names {} pods, more than {MAX_PODS}",
            request.pods.len()
        )));
    }
    if let Some(bad) = request.pods.iter().find(|pod| !well_formed(pod)) {
        let shown: String = format!("{}/{}", bad.namespace, bad.name)
            .chars()
            .take(80)
            .collect();
        return Err(Unusable::Malformed(format!(
            "names a pod that cannot exist: {shown:?}"
        )));
    }
    if request.expires_unix_ms <= now_unix_ms {
        return Err(Unusable::Expired);
    }
    request.why = request.why.chars().take(MAX_WHY).collect();
    Ok(request)
}

/// A pod's namespace, name and uid as Kubernetes allows them: they go into a URL's path.
fn well_formed(pod: &PodRef) -> bool {
    let namespace_ok = crate::config::is_object_name(&pod.namespace)
        && pod.namespace.len() <= 63
        && !pod.namespace.contains('.');
    let uid_ok = (1..=64).contains(&pod.uid.len())
        && pod
            .uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    namespace_ok && crate::config::is_object_name(&pod.name) && uid_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(namespace: &str, name: &str) -> PodRef {
        PodRef {
            namespace: namespace.into(),
            name: name.into(),
            uid: "0f6c1a52-1b7e-4c54-9d7e-2c1f3e0b9a11".into(),
        }
    }

    fn request(pods: Vec<PodRef>) -> EvictionRequest {
        EvictionRequest {
            pods,
            why: "uses 20 bytes, more than its size of 10 bytes".into(),
            expires_unix_ms: 2_000,
        }
    }

    fn annotation(request: &EvictionRequest) -> String {
        let patch = merge_patch(Some(request));
        patch["metadata"]["annotations"][ANNOTATION]
            .as_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn a_request_written_by_the_node_reads_back_until_it_expires() {
        let asked = request(vec![pod("shop", "web-0")]);
        let written = merge_patch(Some(&asked));
        assert_eq!(written["metadata"]["labels"][LABEL], "true");
        assert_eq!(parse(&annotation(&asked), 1_999), Ok(asked.clone()));
        assert_eq!(parse(&annotation(&asked), 2_000), Err(Unusable::Expired));
        let withdrawn = merge_patch(None);
        assert!(withdrawn["metadata"]["labels"][LABEL].is_null());
        assert!(withdrawn["metadata"]["annotations"][ANNOTATION].is_null());
    }

    #[test]
    fn a_request_naming_what_cannot_be_a_pod_is_refused_whole() {
        let malformed = |text: &str| matches!(parse(text, 0), Err(Unusable::Malformed(_)));
        assert!(malformed("not json"));
        assert!(malformed(
            r#"{"pods": [], "why": "", "expiresUnixMs": 5, "extra": 1}"#
        ));
        for bad in [
            pod("shop", "../../nodes/x"),
            pod("a.b", "web-0"),
            pod("shop", "Web"),
        ] {
            assert!(
                malformed(&annotation(&request(vec![bad.clone()]))),
                "{bad:?}"
            );
        }
        let mut bad_uid = pod("shop", "web-0");
        bad_uid.uid = "x/y".into();
        assert!(malformed(&annotation(&request(vec![bad_uid]))));
        let many = (0..=MAX_PODS)
            .map(|i| pod("shop", &format!("p{i}")))
            .collect();
        assert!(malformed(&annotation(&request(many))));
    }

    #[test]
    fn the_reason_is_cut_to_what_an_event_repeats() {
        let mut long = request(vec![pod("shop", "web-0")]);
        long.why = "x".repeat(5_000);
        let read = parse(&annotation(&long), 0).unwrap();
        assert_eq!(read.why.len(), MAX_WHY);
    }
}
