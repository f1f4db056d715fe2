//! `stickyvol cluster drain NODE`: after `kubectl cordon` and `kubectl drain` have evicted the
//! pods of NODE, moves every claim of ours on NODE that a pod waits for (Pending, not scheduled:
//! its volume pins it to NODE) to a node where that pod may run (its nodeSelector, required
//! affinity and tolerations; the node Ready and schedulable) and the move is allowed (room, both
//! nodes serving transfers: `accept::check`), a few at a time (`--parallel`). `--dry-run` says
//! what would move where; claims nobody waits for are listed, and moved only with `--all`. The
//! moves themselves are the controller's (`cluster move`).

use std::collections::{BTreeMap, HashMap};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use kube::Client;
use kube::api::{Api, ListParams};

use super::controller::moves::accept::{self, Checked, Settings};
use super::controller::moves::state::MoveState;
use super::controller::placement::fits::{NodeFacts, excluded_by};
use super::kit::affinity::pinned_by;
use super::kit::client::{self, Retries};
use super::kit::slim::Pod;
use super::moving::{self, Progress};

#[derive(Debug, Args)]
pub struct DrainArgs {
    /// The node whose claims to move (cordoned and drained first).
    pub node: String,
    /// Say what would move where, and move nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Move the claims nobody waits for too (to a node any of their pods could use).
    #[arg(long)]
    pub all: bool,
    /// Moves at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=32))]
    pub parallel: u16,
    /// CSI driver name.
    #[arg(long, env = "DRIVER_NAME", default_value = "stickyvol.csi.io")]
    pub driver_name: String,
    /// The driver's namespace, where the nodes' transfer adverts are.
    #[arg(long, env = "POD_NAMESPACE", default_value = "stickyvol")]
    pub namespace: String,
}

/// One claim of the node, and where it goes (or why not).
struct Planned {
    claim: String,
    pv: String,
    waiting: Vec<String>,
    target: Result<String, String>,
}

pub fn run(args: DrainArgs) -> ExitCode {
    match client::block_on(drain(&args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(why) => {
            eprintln!("stickyvol cluster drain: {why}");
            ExitCode::FAILURE
        }
    }
}

/// Plans, prints the plan, and (unless a dry run) moves; whether every planned move ended well.
async fn drain(args: &DrainArgs) -> Result<bool, String> {
    let client = client::make(Retries::On).await.map_err(|e| e.to_string())?;
    let settings = Settings {
        topology_key: format!("topology.{}/node", args.driver_name),
        driver: args.driver_name.clone(),
        namespace: args.namespace.clone(),
    };
    let planned = plan(&client, &settings, &args.node, args.all).await?;
    for p in &planned {
        let waiting = match p.waiting.is_empty() {
            true => "no pod waits".to_string(),
            false => format!("waited for by {}", p.waiting.join(", ")),
        };
        match &p.target {
            Ok(to) => println!("{} (PV {}, {waiting}): to node {to}", p.claim, p.pv),
            Err(why) => println!("{} (PV {}, {waiting}): not moved: {why}", p.claim, p.pv),
        }
    }
    let moves: Vec<(String, String)> = (planned.iter())
        .filter_map(|p| Some((p.claim.clone(), p.target.clone().ok()?)))
        .collect();
    if args.dry_run || moves.is_empty() {
        println!(
            "{} claim(s) on node {}, {} to move{}",
            planned.len(),
            args.node,
            moves.len(),
            if args.dry_run { " (dry run)" } else { "" }
        );
        return Ok(true);
    }
    let done = run_moves(&client, &settings, moves, usize::from(args.parallel)).await?;
    Ok(done)
}

/// Every claim of ours bound to a PV on `node`, with its waiting pods and its target.
async fn plan(
    client: &Client,
    settings: &Settings,
    node: &str,
    all: bool,
) -> Result<Vec<Planned>, String> {
    let read = |what: &str, err: kube::Error| format!("listing {what}: {err}");
    let pvs = (Api::<PersistentVolume>::all(client.clone())
        .list(&ListParams::default())
        .await)
        .map_err(|e| read("PVs", e))?;
    let nodes = (Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await)
        .map_err(|e| read("Nodes", e))?;
    let others: Vec<NodeFacts> = (nodes.items.iter())
        .map(NodeFacts::of)
        .filter(|n| n.name != node && n.ready && !n.unschedulable)
        .collect();
    let mut pods_of: HashMap<String, Vec<Pod>> = HashMap::new();
    let mut planned = vec![];
    for pv in pvs.items.iter().filter(|pv| on_node(pv, settings, node)) {
        let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
            continue;
        };
        let namespace = claim_ref.namespace.clone().unwrap_or_default();
        let name = claim_ref.name.clone().unwrap_or_default();
        if !pods_of.contains_key(&namespace) {
            let pods = (Api::<Pod>::namespaced(client.clone(), &namespace))
                .list(&ListParams::default())
                .await
                .map_err(|e| read(&format!("the pods of {namespace}"), e))?;
            pods_of.insert(namespace.clone(), pods.items);
        }
        let waiting: Vec<&Pod> = pods_of[&namespace]
            .iter()
            .filter(|pod| waits_for(pod, &name))
            .collect();
        let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &namespace);
        let claim = claims.get_opt(&name).await.map_err(|e| read("claims", e))?;
        // A move under way (an earlier drain cut short): followed to where it goes.
        let moving = MoveState::on(pv.metadata.annotations.as_ref()).and_then(Result::ok);
        let target = match (&claim, waiting.is_empty() && !all) {
            _ if moving.is_some() => Ok(moving.map(|state| state.to).unwrap_or_default()),
            (None, _) => Err(format!("claim {namespace}/{name} does not exist")),
            (Some(_), true) => Err("nobody waits for it (--all moves it anyway)".into()),
            (Some(claim), false) => target(client, settings, claim, &waiting, &others).await,
        };
        planned.push(Planned {
            claim: format!("{namespace}/{name}"),
            pv: pv.metadata.name.clone().unwrap_or_default(),
            waiting: (waiting.iter())
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect(),
            target,
        });
    }
    Ok(planned)
}

/// Whether `pv` is one of ours pinned to `node`.
fn on_node(pv: &PersistentVolume, settings: &Settings, node: &str) -> bool {
    let spec = pv.spec.as_ref();
    let ours = (spec.and_then(|s| s.csi.as_ref())).is_some_and(|c| c.driver == settings.driver);
    let affinity = spec.and_then(|s| s.node_affinity.as_ref());
    ours && pinned_by(affinity, &settings.topology_key).as_deref() == Some(node)
}

/// Whether `pod` waits, unscheduled, for claim `name`.
fn waits_for(pod: &Pod, name: &str) -> bool {
    let phase = (pod.status.as_ref()).and_then(|s| s.phase.as_deref());
    let spec = pod.spec.as_ref();
    let scheduled = (spec.and_then(|s| s.node_name.as_deref())).is_some_and(|n| !n.is_empty());
    let names = (spec.map(|s| s.volumes.as_slice()).unwrap_or_default())
        .iter()
        .any(|v| (v.persistent_volume_claim.as_ref()).is_some_and(|c| c.claim_name == name));
    phase == Some("Pending") && !scheduled && names
}

/// The first node (by name) where every waiting pod may run and the move is allowed; else why
/// none is.
async fn target(
    client: &Client,
    settings: &Settings,
    claim: &PersistentVolumeClaim,
    waiting: &[&Pod],
    nodes: &[NodeFacts],
) -> Result<String, String> {
    let mut why_not = BTreeMap::new();
    for node in nodes {
        if let Some(why) = waiting.iter().find_map(|pod| excluded_by(pod, node)) {
            why_not.insert(node.name.clone(), format!("the pod's {why}"));
            continue;
        }
        match accept::check(client, settings, claim, (&node.name, None)).await {
            Ok(Checked::May { .. }) => return Ok(node.name.clone()),
            Ok(Checked::Started(state)) => return Ok(state.to),
            Err(why) => {
                why_not.insert(node.name.clone(), why.why);
            }
        }
    }
    if why_not.is_empty() {
        return Err("no other node is Ready and schedulable".into());
    }
    let reasons: Vec<String> = why_not.iter().map(|(n, w)| format!("{n}: {w}")).collect();
    Err(format!("no node fits ({})", reasons.join("; ")))
}

/// Asks for `moves` (claim, target), at most `parallel` under way at once, and follows each to
/// its end; whether all ended moved.
async fn run_moves(
    client: &Client,
    settings: &Settings,
    moves: Vec<(String, String)>,
    parallel: usize,
) -> Result<bool, String> {
    let started = Instant::now();
    let mut queue = moves.into_iter();
    let mut active: Vec<(String, String, String)> = vec![];
    let mut all_moved = true;
    loop {
        while active.len() < parallel {
            let Some((claim, to)) = queue.next() else {
                break;
            };
            let (namespace, name) = claim.split_once('/').unwrap_or_default();
            // A move under way needs no asking (its claim may be gone meanwhile).
            let under_way = moving::progress(client, settings, (namespace, name), &to).await;
            if let Ok(Progress::Waiting(_)) = under_way {
                active.push((claim, to, String::new()));
                continue;
            }
            match moving::ask(client, (namespace, name), (&to, None)).await {
                Ok(()) => active.push((claim, to, String::new())),
                Err(why) => {
                    println!("{claim}: not moved: {why}");
                    all_moved = false;
                }
            }
        }
        if active.is_empty() {
            return Ok(all_moved);
        }
        let mut still = vec![];
        for (claim, to, said) in active {
            let (namespace, name) = claim.split_once('/').unwrap_or_default();
            let at = started.elapsed().as_secs();
            match moving::progress(client, settings, (namespace, name), &to).await? {
                Progress::Done(line) => println!("[{at:>4} s] {line}"),
                Progress::Refused(why) => {
                    println!("[{at:>4} s] {claim}: not moved: {why}");
                    all_moved = false;
                }
                Progress::Waiting(now) if now != said => {
                    println!("[{at:>4} s] {claim}: {now}");
                    still.push((claim, to, now));
                }
                Progress::Waiting(_) => still.push((claim, to, said)),
            }
        }
        active = still;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pod_waits_for_a_claim_while_pending_and_unscheduled() {
        let pod = |phase: &str, node: Option<&str>| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "db-0"},
                "spec": {"nodeName": node,
                         "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data-db-0"}}]},
                "status": {"phase": phase}
            }))
            .unwrap()
        };
        assert!(waits_for(&pod("Pending", None), "data-db-0"));
        assert!(!waits_for(&pod("Pending", None), "data-db-1"));
        assert!(!waits_for(&pod("Pending", Some("a")), "data-db-0"));
        assert!(!waits_for(&pod("Running", Some("a")), "data-db-0"));
    }
}
