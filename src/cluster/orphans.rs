//! `stickyvol cluster orphans`: from anywhere with a kubeconfig, our PVs whose node is deleted or
//! out of service, and what the reconciler would do with each (`decide` in dry run, on the same
//! reads the reconciler makes); then the volumes that no PV names, from each node's report
//! (`report`). Read-only: the reconciler's list permissions, and listing ConfigMaps in the
//! driver's namespace.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use super::controller::nodeloss::decide::{self, Action, Decision, Options, Snapshot};
use super::controller::nodeloss::reconcile::{self, Settings};
use super::controller::nodeloss::view::ClusterView;
use super::node::nodeloss::report::{self, Entry, NodeReport, State};

#[derive(Debug, Args)]
pub struct OrphansArgs {
    /// CSI driver name whose PVs to look at.
    #[arg(long, env = "DRIVER_NAME", default_value = "stickyvol.csi.io")]
    pub driver_name: String,
    /// The driver's namespace, where the nodes keep their reports.
    #[arg(long, env = "POD_NAMESPACE", default_value = "stickyvol")]
    pub namespace: String,
    /// One JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One line of the report.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Orphan {
    pub pv: String,
    pub volume_id: String,
    pub node: String,
    /// `deleted` or `out-of-service`.
    pub node_state: &'static str,
    pub claim: String,
    pub on_node_loss: &'static str,
    /// What the reconciler would do: none, release_claim, delete_pods, delete_pv,
    /// drop_pv_finalizer.
    pub action: &'static str,
    /// The objects it would delete.
    pub deletes: Vec<String>,
    pub reason: String,
}

/// A volume that no PV names, as its node reported it.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Unnamed {
    pub node: String,
    #[serde(flatten)]
    pub entry: Entry,
}

/// Everything the command shows.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Report {
    pub pvs_on_lost_nodes: Vec<Orphan>,
    pub volumes_without_pv: Vec<Unnamed>,
    /// Per node, volumes beyond what its report lists (`stickyvol volumes` there has them).
    pub not_listed: BTreeMap<String, u64>,
    /// Reports that could not be read, and why.
    pub unreadable_reports: Vec<String>,
}

pub fn orphans(snapshot: &Snapshot, decisions: &[Decision]) -> Vec<Orphan> {
    decisions
        .iter()
        .map(|d| {
            let pv = snapshot.pvs.iter().find(|pv| pv.name == d.pv);
            let deletes = match &d.action {
                Action::Nothing => Vec::new(),
                Action::ReleaseClaim { claim, pods } => std::iter::once(format!("pvc/{claim}"))
                    .chain(pods.iter().map(|p| format!("pod/{p}")))
                    .collect(),
                Action::DeletePods { pods } => pods.iter().map(|p| format!("pod/{p}")).collect(),
                Action::DeletePv { pv } => vec![format!("pv/{pv}")],
                Action::DropPvFinalizer { .. } => Vec::new(),
            };
            Orphan {
                pv: d.pv.clone(),
                volume_id: pv.map(|pv| pv.volume_handle.clone()).unwrap_or_default(),
                node: d.node.clone(),
                node_state: d.loss.as_str(),
                claim: pv
                    .and_then(|pv| pv.claim.as_ref())
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                on_node_loss: d.policy.as_str(),
                action: d.action.kind(),
                deletes,
                reason: d.reason.to_string(),
            }
        })
        .collect()
}

/// The command's report: the PVs on lost nodes as given, then the nodes' reports, their entries
/// sorted by node then volume.
pub fn assemble(
    reports: Vec<Result<NodeReport, String>>,
    pvs_on_lost_nodes: Vec<Orphan>,
) -> Report {
    let mut report = Report {
        pvs_on_lost_nodes,
        volumes_without_pv: Vec::new(),
        not_listed: BTreeMap::new(),
        unreadable_reports: Vec::new(),
    };
    for read in reports {
        match read {
            Ok(NodeReport {
                node,
                entries,
                omitted,
            }) => {
                if omitted > 0 {
                    report.not_listed.insert(node.clone(), omitted);
                }
                report
                    .volumes_without_pv
                    .extend(entries.into_iter().map(|entry| Unnamed {
                        node: node.clone(),
                        entry,
                    }));
            }
            Err(why) => report.unreadable_reports.push(why),
        }
    }
    report
        .volumes_without_pv
        .sort_by(|a, b| (&a.node, &a.entry.volume_id).cmp(&(&b.node, &b.entry.volume_id)));
    report
}

/// The report as text: the PVs, then the volumes no PV names.
pub fn table(report: &Report) -> String {
    let mut out = pv_table(&report.pvs_on_lost_nodes);
    if report.volumes_without_pv.is_empty() {
        out.push_str("no node reports a volume that no PV names\n");
    }
    for v in &report.volumes_without_pv {
        let since = since(v.entry.since_unix_ms);
        out.push_str(&match (v.entry.state, &v.entry.lost_path) {
            (State::Orphaned, Some(path)) => format!(
                "volume {} on node {}  PV {} gone  orphaned since {since}\n    data in {path} (on that node); remove it by hand once looked at\n",
                v.entry.volume_id, v.node, v.entry.pv
            ),
            _ => format!(
                "volume {} on node {}  PV {} absent since {since}\n    moved to lost+found if it stays absent\n",
                v.entry.volume_id, v.node, v.entry.pv
            ),
        });
    }
    for (node, count) in &report.not_listed {
        out.push_str(&format!(
            "and {count} more on node {node}, beyond what its report holds: stickyvol volumes there lists them\n"
        ));
    }
    for why in &report.unreadable_reports {
        out.push_str(&format!("unreadable: {why}\n"));
    }
    out
}

fn since(unix_ms: u64) -> String {
    i64::try_from(unix_ms)
        .ok()
        .and_then(|ms| k8s_openapi::jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(
            || format!("{unix_ms} ms"),
            |t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        )
}

/// One PV per line, then what would be deleted and why, indented beneath it.
fn pv_table(orphans: &[Orphan]) -> String {
    if orphans.is_empty() {
        return "no PV of this driver is on a deleted or out-of-service node\n".into();
    }
    let mut out = String::new();
    for o in orphans {
        let claim = if o.claim.is_empty() { "-" } else { &o.claim };
        out.push_str(&format!(
            "{}  volume {}  node {} ({})  claim {}  onNodeLoss: {}\n    would: {}{}\n    because: {}\n",
            o.pv,
            o.volume_id,
            o.node,
            o.node_state,
            claim,
            o.on_node_loss,
            o.action,
            if o.deletes.is_empty() {
                String::new()
            } else {
                format!(" (delete {})", o.deletes.join(", "))
            },
            o.reason
        ));
    }
    out
}

pub fn run(args: OrphansArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("stickyvol cluster orphans: {err}");
            return ExitCode::FAILURE;
        }
    };
    let settings = Settings {
        topology_key: format!("topology.{}/node", args.driver_name),
        driver: args.driver_name,
        dry_run: true,
        interval: Duration::ZERO,
        lease_namespace: String::new(),
        lease_name: String::new(),
        identity: String::new(),
    };
    let result = runtime.block_on(async {
        let client =
            crate::cluster::kit::client::make(crate::cluster::kit::client::Retries::On).await?;
        let view = ClusterView::listed(&client, &settings.driver, &settings.topology_key).await?;
        let snapshot = reconcile::snapshot(&client, &settings, &view).await?;
        let reports = report::read_all(&client, &args.namespace, &settings.driver).await?;
        Ok::<_, kube::Error>((snapshot, reports))
    });
    let (snapshot, reports) = match result {
        Ok(read) => read,
        Err(err) => {
            eprintln!("stickyvol cluster orphans: {err}");
            return ExitCode::FAILURE;
        }
    };
    let decisions = decide::decide(
        &snapshot,
        Options {
            driver: &settings.driver,
            dry_run: true,
        },
    );
    let found = assemble(reports, orphans(&snapshot, &decisions));
    if args.json {
        match serde_json::to_string_pretty(&found) {
            Ok(text) => println!("{text}"),
            Err(err) => {
                eprintln!("stickyvol cluster orphans: {err}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", table(&found));
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::class::OnNodeLoss;
    use crate::cluster::controller::nodeloss::decide::{ClassView, ObjectRef, PvView};

    #[test]
    fn each_pv_on_a_lost_node_is_listed_with_what_would_be_done() {
        let class = |name: &str, policy: &str| ClassView {
            name: name.into(),
            provisioner: "d".into(),
            on_node_loss: OnNodeLoss::parse(Some(policy)),
        };
        let pv = |name: &str, class: &str, claim: Option<&str>| PvView {
            name: name.into(),
            uid: format!("uid-{name}"),
            driver: "d".into(),
            volume_handle: format!("sv-{name}"),
            storage_class: class.into(),
            node: Some("gone".into()),
            claim: claim.map(|c| ObjectRef {
                namespace: "ns".into(),
                name: c.into(),
                uid: String::new(),
            }),
            reclaim_retain: false,
            deleting: false,
            provisioner_finalizer: true,
            attributes_class: None,
        };
        let snapshot = Snapshot {
            nodes: vec![decide::NodeView {
                name: "up".into(),
                ..Default::default()
            }],
            pvs: vec![pv("kept", "k", Some("mine")), pv("released", "r", None)],
            classes: vec![class("k", "keep"), class("r", "release")],
            ..Snapshot::default()
        };
        let decisions = decide::decide(
            &snapshot,
            Options {
                driver: "d",
                dry_run: true,
            },
        );
        let found = orphans(&snapshot, &decisions);
        assert_eq!(found.len(), 2);
        assert_eq!(
            (
                found[0].pv.as_str(),
                found[0].action,
                found[0].claim.as_str()
            ),
            ("kept", "none", "ns/mine")
        );
        assert_eq!(found[0].volume_id, "sv-kept");
        assert_eq!(
            (found[1].action, found[1].deletes.clone()),
            ("delete_pv", vec!["pv/released".to_string()])
        );
        let text = pv_table(&found);
        assert!(text.contains("node gone (deleted)"), "{text}");
        assert!(
            text.contains("would: delete_pv (delete pv/released)"),
            "{text}"
        );
        assert!(text.contains("onNodeLoss: keep"), "{text}");
        assert!(pv_table(&[]).starts_with("no PV"));
    }

    #[test]
    fn volumes_no_pv_names_are_listed_from_every_readable_report() {
        let entry = |id: &str, state, lost: Option<&str>| Entry {
            volume_id: id.into(),
            pv: format!("pvc-{id}"),
            state,
            since_unix_ms: 1_764_144_000_000,
            lost_path: lost.map(Into::into),
        };
        let report = assemble(
            vec![
                Ok(NodeReport {
                    node: "b".into(),
                    entries: vec![entry("sv-2", State::PvAbsent, None)],
                    omitted: 7,
                }),
                Err("report x is unreadable: EOF".into()),
                Ok(NodeReport {
                    node: "a".into(),
                    entries: vec![entry(
                        "sv-1",
                        State::Orphaned,
                        Some("/pool/lost+found/sv-1"),
                    )],
                    omitted: 0,
                }),
            ],
            Vec::new(),
        );
        assert_eq!(
            report
                .volumes_without_pv
                .iter()
                .map(|v| v.node.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        let text = table(&report);
        assert!(text.starts_with("no PV of this driver"), "{text}");
        assert!(
            text.contains(
                "volume sv-1 on node a  PV pvc-sv-1 gone  orphaned since 2025-11-26T08:00:00Z"
            ),
            "{text}"
        );
        assert!(text.contains("data in /pool/lost+found/sv-1"), "{text}");
        assert!(
            text.contains("volume sv-2 on node b  PV pvc-sv-2 absent since"),
            "{text}"
        );
        assert!(
            text.contains("unreadable: report x is unreadable: EOF"),
            "{text}"
        );
        assert!(text.contains("and 7 more on node b"), "{text}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["not_listed"]["b"], 7);
        assert_eq!(json["volumes_without_pv"][0]["node"], "a");
        assert_eq!(json["volumes_without_pv"][0]["state"], "orphaned");
        assert_eq!(json["volumes_without_pv"][1]["state"], "pv-absent");
        let none = table(&assemble(Vec::new(), Vec::new()));
        assert!(
            none.contains("no node reports a volume that no PV names"),
            "{none}"
        );
    }
}
