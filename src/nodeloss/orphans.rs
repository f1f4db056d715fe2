//! `stickyvol cluster orphans`: from anywhere with a kubeconfig, our PVs whose node is deleted or
//! out of service, and what the reconciler would do with each (`decide` in dry run, on the same
//! reads the reconciler makes). Read-only: it needs only the reconciler's list permissions.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde::Serialize;

use super::decide::{self, Action, Decision, Options, Snapshot};
use super::reconcile::{self, Settings};

/// Commands that ask the Kubernetes API rather than the driver on this node.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Our PVs whose node is deleted or tainted node.kubernetes.io/out-of-service, with the
    /// node-loss reconciler's decision for each (KUBECONFIG, or in-cluster credentials).
    Orphans(OrphansArgs),
}

#[derive(Debug, Args)]
pub struct OrphansArgs {
    /// CSI driver name whose PVs to look at.
    #[arg(long, env = "DRIVER_NAME", default_value = "stickyvol.csi.io")]
    pub driver_name: String,
    /// One JSON array instead of a table.
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
    /// What the reconciler would do: none, release_claim, delete_pods, delete_pv.
    pub action: &'static str,
    /// The objects it would delete.
    pub deletes: Vec<String>,
    pub reason: String,
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

/// The table: one PV per line, then what would be deleted and why, indented beneath it.
pub fn table(orphans: &[Orphan]) -> String {
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

pub fn run(command: ClusterCommand) -> ExitCode {
    let ClusterCommand::Orphans(args) = command;
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
        let client = kube::Client::try_default().await?;
        reconcile::snapshot(&client, &settings).await
    });
    let snapshot = match result {
        Ok(snapshot) => snapshot,
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
    let found = orphans(&snapshot, &decisions);
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
    use crate::nodeloss::decide::{ClassView, ObjectRef, PvView};

    #[test]
    fn each_pv_on_a_lost_node_is_listed_with_what_would_be_done() {
        let class = |name: &str, policy: &str| ClassView {
            name: name.into(),
            provisioner: "d".into(),
            parameters: [("onNodeLoss".to_string(), policy.to_string())].into(),
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
        let text = table(&found);
        assert!(text.contains("node gone (deleted)"), "{text}");
        assert!(
            text.contains("would: delete_pv (delete pv/released)"),
            "{text}"
        );
        assert!(text.contains("onNodeLoss: keep"), "{text}");
        assert!(table(&[]).starts_with("no PV"));
    }
}
