//! Which node a PV is pinned to, read from its node affinity: what node loss, overflow evictions
//! and transfers go by.

use k8s_openapi::api::core::v1::VolumeNodeAffinity;

/// The one node a PV's required node affinity names on `topology_key` (`In` with a single value,
/// as our provisioner writes it); None for any other shape.
pub fn pinned_by(affinity: Option<&VolumeNodeAffinity>, topology_key: &str) -> Option<String> {
    let terms = &affinity?.required.as_ref()?.node_selector_terms;
    let mut found: Option<String> = None;
    for term in terms {
        for req in term.match_expressions.as_deref().unwrap_or_default() {
            if req.key != topology_key {
                continue;
            }
            match (req.operator.as_str(), req.values.as_deref()) {
                ("In", Some([value])) if found.as_ref().is_none_or(|f| f == value) => {
                    found = Some(value.clone());
                }
                _ => return None,
            }
        }
    }
    found
}
