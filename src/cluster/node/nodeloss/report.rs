//! Each node's report of its volumes that no PV names, kept in a ConfigMap of the driver's
//! namespace so `stickyvol cluster orphans` can list them from anywhere: those volumes exist
//! only on their node, and Events expire after an hour. The ConfigMap is owned by the Node
//! object, so it goes when the Node is deleted; the driver applies it when what it reports
//! changes, and again after a release notice, and deletes it when nothing is left. The Node's
//! uid comes from the driver's own credentials (a SelfSubjectReview: the API server puts the
//! pod's node in a pod-bound token's user info), not from a read of the Node, which a node
//! plugin has no right to.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};

use crate::config::is_object_name;

/// Label on every report: its value is the CSI driver name, so two drivers in one namespace
/// keep apart.
pub const LABEL: &str = "stickyvol.csi.io/orphan-report";
const KEY_NODE: &str = "node";
const KEY_VOLUMES: &str = "volumes.json";
/// How many volumes did not fit (absent when none).
const KEY_OMITTED: &str = "omitted";
const FIELD_MANAGER: &str = "stickyvol-orphan-check";
/// What the entries of one report may take: a ConfigMap holds at most 1 MiB, and a node with
/// thousands of orphans still gets a report (the rest counted, not listed).
const REPORT_BUDGET_BYTES: usize = 256 * 1024;
/// Reports are read back from the API server: one bigger than this is not believed.
const MAX_REPORT_BYTES: usize = 512 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// Its PV was absent once; looked at again before anything moves.
    PvAbsent,
    /// Its data is in lost+found.
    Orphaned,
}

/// One volume of the node that no PV names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub volume_id: String,
    /// The PV its record names (absent, or naming another volume).
    pub pv: String,
    pub state: State,
    /// When its PV was first seen absent, or when it was orphaned, in ms since the epoch.
    pub since_unix_ms: u64,
    /// Where its data is now, on the node, when orphaned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_path: Option<String>,
}

/// The ConfigMap's name, if the node's name leaves room for one.
pub fn name(driver: &str, node: &str) -> Option<String> {
    let name = format!("{driver}-orphans-{node}");
    is_object_name(&name).then_some(name)
}

/// A node's report read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReport {
    pub node: String,
    pub entries: Vec<Entry>,
    /// Volumes beyond the report's budget: counted, not listed.
    pub omitted: u64,
}

/// The entries as one JSON array, as many as fit the budget, and how many did not.
fn encode(entries: &[Entry]) -> (String, u64) {
    let mut encoded = Vec::new();
    let mut used = 2;
    for entry in entries {
        let Ok(text) = serde_json::to_string(entry) else {
            continue;
        };
        if used + text.len() + 2 > REPORT_BUDGET_BYTES {
            break;
        }
        used += text.len() + 2;
        encoded.push(text);
    }
    let omitted = (entries.len() - encoded.len()) as u64;
    (format!("[{}]", encoded.join(",\n")), omitted)
}

/// The report as applied (server-side): `node`, `volumes.json` (and `omitted`), owned by the
/// Node when its uid is known.
pub fn config_map(
    driver: &str,
    node: &str,
    node_uid: Option<&str>,
    entries: &[Entry],
) -> Option<ConfigMap> {
    let (volumes, omitted) = encode(entries);
    let mut data = BTreeMap::from([
        (KEY_NODE.to_string(), node.to_string()),
        (KEY_VOLUMES.to_string(), volumes),
    ]);
    if omitted > 0 {
        data.insert(KEY_OMITTED.to_string(), omitted.to_string());
    }
    Some(ConfigMap {
        metadata: ObjectMeta {
            name: Some(name(driver, node)?),
            labels: Some(BTreeMap::from([(LABEL.to_string(), driver.to_string())])),
            owner_references: node_uid.map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: node.into(),
                    uid: uid.into(),
                    ..OwnerReference::default()
                }]
            }),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    })
}

/// A report read back, or why it cannot be believed.
pub fn parse(config_map: &ConfigMap) -> Result<NodeReport, String> {
    let name = config_map.metadata.name.as_deref().unwrap_or("?");
    let data = config_map.data.as_ref();
    let field = |key: &str| {
        data.and_then(|d| d.get(key))
            .ok_or_else(|| format!("report {name} has no {key}"))
    };
    let node = field(KEY_NODE)?;
    let volumes = field(KEY_VOLUMES)?;
    if volumes.len() > MAX_REPORT_BYTES {
        return Err(format!(
            "report {name} is over {MAX_REPORT_BYTES} bytes; not read"
        ));
    }
    let entries = serde_json::from_str(volumes)
        .map_err(|err| format!("report {name} is unreadable: {err}"))?;
    let omitted = match data.and_then(|d| d.get(KEY_OMITTED)) {
        None => 0,
        Some(count) => count
            .parse()
            .map_err(|_| format!("report {name} has an unreadable {KEY_OMITTED}"))?,
    };
    Ok(NodeReport {
        node: node.clone(),
        entries,
        omitted,
    })
}

/// Where a node's report goes.
#[derive(Debug, Clone)]
pub struct Target {
    pub driver: String,
    pub node: String,
    pub namespace: String,
}

/// Writes the node's report: applied while there are entries (the caller calls when they
/// changed, or a report the Node's deletion took must be made again), deleted once when they
/// are gone. `published` is whether a report may exist, carried between calls (true at start:
/// one may be left over).
pub async fn publish(
    client: &Client,
    target: &Target,
    entries: &[Entry],
    published: &mut bool,
) -> Result<(), kube::Error> {
    let Some(name) = name(&target.driver, &target.node) else {
        return Ok(());
    };
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), &target.namespace);
    if entries.is_empty() {
        if *published {
            match config_maps.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => return Err(err),
            }
            *published = false;
        }
        return Ok(());
    }
    let uid = own_node_uid(client, &target.node).await?;
    let Some(report) = config_map(&target.driver, &target.node, uid.as_deref(), entries) else {
        return Ok(());
    };
    *published = true;
    config_maps
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&report),
        )
        .await?;
    Ok(())
}

/// User-info keys of a pod-bound ServiceAccount token: the pod's node (Kubernetes 1.32 and later).
const NODE_NAME_KEY: &str = "authentication.kubernetes.io/node-name";
const NODE_UID_KEY: &str = "authentication.kubernetes.io/node-uid";

/// The uid of Node `node` as this driver's credentials carry it, if they are bound to a pod on
/// that node (any authenticated user may review itself).
async fn own_node_uid(client: &Client, node: &str) -> Result<Option<String>, kube::Error> {
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    let extra = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.extra)
        .unwrap_or_default();
    let one = |key: &str| match extra.get(key).map(Vec::as_slice) {
        Some([value]) => Some(value.clone()),
        _ => None,
    };
    Ok((one(NODE_NAME_KEY).as_deref() == Some(node))
        .then(|| one(NODE_UID_KEY))
        .flatten())
}

/// Every node's report of `driver` in `namespace`, or why one is unreadable.
pub async fn read_all(
    client: &Client,
    namespace: &str,
    driver: &str,
) -> Result<Vec<Result<NodeReport, String>>, kube::Error> {
    let reports = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("{LABEL}={driver}")))
        .await?;
    Ok(reports.iter().map(parse).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries() -> Vec<Entry> {
        vec![
            Entry {
                volume_id: "sv-1".into(),
                pv: "pvc-1".into(),
                state: State::Orphaned,
                since_unix_ms: 1_000,
                lost_path: Some("/pool/lost+found/sv-1".into()),
            },
            Entry {
                volume_id: "sv-2".into(),
                pv: "pvc-2".into(),
                state: State::PvAbsent,
                since_unix_ms: 2_000,
                lost_path: None,
            },
        ]
    }

    #[test]
    fn a_report_reads_back_as_written_and_is_owned_by_its_node() {
        let report = config_map("stickyvol.csi.io", "node-b", Some("uid-b"), &entries()).unwrap();
        assert_eq!(
            report.metadata.name.as_deref(),
            Some("stickyvol.csi.io-orphans-node-b")
        );
        assert_eq!(
            report.metadata.labels.as_ref().unwrap()[LABEL],
            "stickyvol.csi.io"
        );
        let owner = &report.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Node", "uid-b"));
        assert_eq!(
            parse(&report).unwrap(),
            NodeReport {
                node: "node-b".into(),
                entries: entries(),
                omitted: 0
            }
        );
        let text = &report.data.as_ref().unwrap()[KEY_VOLUMES];
        assert!(text.contains("\"state\":\"pv-absent\""), "{text}");
        assert!(!report.data.as_ref().unwrap().contains_key(KEY_OMITTED));
        // No uid known (the Node unreadable): no owner, still a report.
        let bare = config_map("d", "n", None, &entries()).unwrap();
        assert!(bare.metadata.owner_references.is_none());
    }

    #[test]
    fn a_node_with_thousands_of_orphans_reports_what_fits_and_counts_the_rest() {
        let many: Vec<Entry> = (0..10_000)
            .map(|i| Entry {
                volume_id: format!("sv-{i:08}"),
                pv: format!("pvc-{i:08}-0000-0000-0000-000000000000"),
                state: State::Orphaned,
                since_unix_ms: 1_000,
                lost_path: Some(format!(
                    "/var/lib/kubelet/volumes/stickyvol.csi.io/lost+found/sv-{i:08}"
                )),
            })
            .collect();
        let report = config_map("d", "n", None, &many).unwrap();
        let size: usize = report
            .data
            .as_ref()
            .unwrap()
            .values()
            .map(String::len)
            .sum();
        assert!(size <= REPORT_BUDGET_BYTES + 64, "{size} bytes");
        let back = parse(&report).unwrap();
        assert!(back.entries.len() > 500, "{}", back.entries.len());
        assert_eq!(back.entries[..], many[..back.entries.len()]);
        assert_eq!(back.entries.len() as u64 + back.omitted, 10_000);
    }

    #[test]
    fn a_node_name_leaving_no_room_gets_no_report() {
        assert!(name("stickyvol.csi.io", &"n".repeat(220)).is_some());
        assert!(name("stickyvol.csi.io", &"n".repeat(240)).is_none());
        assert!(config_map("stickyvol.csi.io", &"n".repeat(240), None, &entries()).is_none());
    }

    #[test]
    fn reports_that_cannot_be_believed_say_why() {
        let with = |data: &[(&str, String)]| ConfigMap {
            metadata: ObjectMeta {
                name: Some("r".into()),
                ..ObjectMeta::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect(),
            ),
            ..ConfigMap::default()
        };
        let missing = parse(&with(&[(KEY_NODE, "n".into())])).unwrap_err();
        assert!(missing.contains("no volumes.json"), "{missing}");
        let garbled = parse(&with(&[(KEY_NODE, "n".into()), (KEY_VOLUMES, "{".into())]));
        assert!(garbled.unwrap_err().contains("unreadable"));
        let huge = format!("[{}]", " ".repeat(MAX_REPORT_BYTES));
        let oversized = parse(&with(&[(KEY_NODE, "n".into()), (KEY_VOLUMES, huge)]));
        assert!(oversized.unwrap_err().contains("over"));
        let bad_count = parse(&with(&[
            (KEY_NODE, "n".into()),
            (KEY_VOLUMES, "[]".into()),
            (KEY_OMITTED, "-1".into()),
        ]));
        assert!(bad_count.unwrap_err().contains("omitted"));
    }
}
