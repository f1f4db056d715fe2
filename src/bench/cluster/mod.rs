//! `stickyvol-bench cluster`: a big cluster on one machine. A simulated API server of our own
//! (`store`, `apiserver`) holds Nodes shaped like real ones (`objects`) and PVs of our driver;
//! the controller (`serve --mode=controller --node-loss=on`) and one node plugin (`serve
//! --mode=all --orphan-check-interval`, with volumes of its own) run against it, each on a
//! listener of its own that counts its requests and the bytes it was sent. Every Node is
//! updated once per `--node-update-period`, as kubelets report status. Measured: peak RSS
//! (VmHWM), steady-state requests and bytes, and the time from a Node's deletion, and from an
//! out-of-service taint, to the reconciler's deletion of the claim waiting on it.

mod apiserver;
mod objects;
mod selector;
mod store;

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use crate::cli::ClusterArgs;
use crate::client::Csi;
use crate::driver_process::{DriverProcess, status_kib};
use objects::{CLASS, NAMESPACE};
use store::Store;

const NODES: &str = "/api/v1/nodes";
const PVS: &str = "/api/v1/persistentvolumes";
/// The node whose Node is deleted, and the one tainted out of service.
const DELETED_NODE: usize = 42;
const TAINTED_NODE: usize = 43;
/// The node the node plugin runs as.
const PLUGIN_NODE: usize = 7;
const DEADLINE: Duration = Duration::from_secs(60);

#[derive(Debug, Serialize)]
pub struct ClusterReport {
    pub nodes: usize,
    pub pvs: usize,
    pub controller: Usage,
    pub node_plugin: Usage,
    /// Seconds from the Node's deletion to the claim's deletion.
    pub node_deleted_to_release_s: Option<f64>,
    /// Seconds from the out-of-service taint to the claim's deletion.
    pub taint_to_release_s: Option<f64>,
    pub window_s: f64,
    #[serde(skip)]
    pub errors_total: u64,
    #[serde(skip)]
    pub leftovers: Vec<String>,
}

/// One client's cost: peak RSS, and its steady-state requests and bytes received.
#[derive(Debug, Default, Serialize)]
pub struct Usage {
    pub peak_rss_kib: u64,
    pub requests: u64,
    pub bytes: u64,
    pub requests_per_s: f64,
    pub bytes_per_s: f64,
}

/// The store filled: Nodes, PVs spread over them, our class, and the two StatefulSets whose
/// claims sit on the nodes that are lost.
fn populate(store: &Store, nodes: usize, pvs: usize) {
    let now = "2026-11-27T12:00:00Z";
    for i in 0..nodes {
        store.put(NODES, objects::node(i, now));
    }
    for k in 0..pvs {
        let name = objects::pv_name(k);
        let node = objects::node_name(k % nodes);
        let claim = format!("data-app-{k}-0");
        let handle = format!("sv-{k:032x}-00000000");
        let ns = format!("team-{}", k % 50);
        store.put(PVS, objects::pv(&name, &node, &ns, &claim, &handle));
    }
    store.put("/apis/storage.k8s.io/v1/storageclasses", objects::class());
    for (set, node) in [("db", DELETED_NODE), ("web", TAINTED_NODE)] {
        let pv = format!("pv-sim-{set}");
        let node = objects::node_name(node);
        let claim = format!("data-{set}-0");
        let handle = format!("sv-sim-{set}");
        store.put(PVS, objects::pv(&pv, &node, NAMESPACE, &claim, &handle));
        let ns = format!("/namespaces/{NAMESPACE}");
        store.put(
            &format!("/apis/apps/v1{ns}/statefulsets"),
            objects::statefulset(set),
        );
        store.put(
            &format!("/api/v1{ns}/persistentvolumeclaims"),
            objects::claim(set, &pv),
        );
        store.put(&format!("/api/v1{ns}/pods"), objects::pending_pod(set));
    }
}

/// Each Node's status written again once per `period`, spread evenly, as kubelets do.
async fn update_nodes(store: Arc<Store>, nodes: usize, period: Duration) {
    let mut tick = tokio::time::interval(period / nodes as u32);
    let mut i = 0;
    loop {
        tick.tick().await;
        let heartbeat = k8s_openapi::jiff::Timestamp::now().to_string();
        // Nodes the scenario changed keep their change.
        if i != DELETED_NODE && i != TAINTED_NODE {
            store.put(NODES, objects::node(i, &heartbeat));
        }
        i = (i + 1) % nodes;
    }
}

fn kubeconfig(dir: &Path, name: &str, address: SocketAddr) -> Result<PathBuf, String> {
    let path = dir.join(format!("kubeconfig-{name}"));
    fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster: {{server: \"http://{address}\"}}\n\
             users:\n- name: sim\n  user: {{}}\ncontexts:\n- name: sim\n  context: {{cluster: sim, user: sim}}\n\
             current-context: sim\n"
        ),
    )
    .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path)
}

/// Starts `stickyvol serve ARGS`, its log in `dir/<name>.log`, and waits until it is ready.
async fn start(
    binary: &Path,
    dir: &Path,
    name: &str,
    env: &str,
    args: &str,
) -> Result<(DriverProcess, u32, Csi), String> {
    let socket = dir.join(format!("{name}.sock"));
    let log = dir.join(format!("{name}.log"));
    let command = format!(
        "{env} RUST_LOG=info exec {} serve --endpoint=unix://{} --driver-name={} {args} >>{} 2>&1",
        binary.display(),
        socket.display(),
        objects::DRIVER,
        log.display()
    );
    let mut process = DriverProcess::start(&command)?;
    let ready = process
        .wait_ready(&socket, DEADLINE, Duration::from_secs(120))
        .await?;
    Ok((process, ready.pid, Csi::new(ready.channel, DEADLINE)))
}

/// The node plugin's volumes, made by a first start without the API: each with the PV name
/// the provisioner passes, its PV then put in the store.
async fn make_plugin_volumes(
    args: &ClusterArgs,
    dir: &Path,
    store: &Store,
    node_args: &str,
) -> Result<(), String> {
    let (mut process, _, csi) = start(&args.stickyvol, dir, "node-prepare", "", node_args).await?;
    let node = objects::node_name(PLUGIN_NODE);
    for j in 0..args.node_volumes {
        let pv = format!("pv-{node}-{j}");
        let request = stickyvol::csi::CreateVolumeRequest {
            name: pv.clone(),
            capacity_range: Some(stickyvol::csi::CapacityRange {
                required_bytes: 1 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![stickyvol::csi::VolumeCapability {
                access_type: Some(stickyvol::csi::volume_capability::AccessType::Mount(
                    Default::default(),
                )),
                access_mode: Some(stickyvol::csi::volume_capability::AccessMode {
                    mode: stickyvol::csi::volume_capability::access_mode::Mode::SingleNodeWriter
                        as i32,
                }),
            }],
            parameters: [("csi.storage.k8s.io/pv/name".to_string(), pv.clone())].into(),
            ..Default::default()
        };
        let volume = csi
            .controller
            .clone()
            .create_volume(csi.request(request))
            .await
            .map_err(|s| format!("CreateVolume {pv}: {s}"))?
            .into_inner()
            .volume
            .ok_or("CreateVolume returned no volume")?;
        let claim = format!("data-local-{j}");
        store.put(
            PVS,
            objects::pv(&pv, &node, "team-0", &claim, &volume.volume_id),
        );
    }
    process.stop().await
}

fn peak_rss(pid: u32) -> u64 {
    status_kib(pid, "VmHWM").unwrap_or(0)
}

fn usage(pid: u32, before: (u64, u64), after: (u64, u64), window: Duration) -> Usage {
    let (requests, bytes) = (after.0 - before.0, after.1 - before.1);
    let secs = window.as_secs_f64();
    Usage {
        peak_rss_kib: peak_rss(pid),
        requests,
        bytes,
        requests_per_s: requests as f64 / secs,
        bytes_per_s: bytes as f64 / secs,
    }
}

/// Waits until the claim `data-<set>-0` is deleted after `since`: the seconds it took.
async fn released(store: &Store, set: &str, since: Instant, timeout: Duration) -> Option<f64> {
    let path = format!("/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/data-{set}-0");
    while since.elapsed() < timeout {
        if let Some(at) = store.written("DELETE", &path, since) {
            return Some(at.duration_since(since).as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// Deletes one Node, then taints another out of service, timing the reconciler's release.
async fn node_loss(store: &Store, timeout: Duration) -> (Option<f64>, Option<f64>) {
    let deleted = Instant::now();
    store.remove(NODES, &objects::node_name(DELETED_NODE));
    let after_delete = released(store, "db", deleted, timeout).await;
    let heartbeat = k8s_openapi::jiff::Timestamp::now().to_string();
    let mut node = objects::node(TAINTED_NODE, &heartbeat);
    node["spec"]["taints"] = json!([{"key": "node.kubernetes.io/out-of-service",
                                     "value": "nodeshutdown", "effect": "NoExecute"}]);
    let tainted = Instant::now();
    store.put(NODES, node);
    let after_taint = released(store, "web", tainted, timeout).await;
    (after_delete, after_taint)
}

pub async fn cluster(args: &ClusterArgs) -> Result<ClusterReport, String> {
    let dir = &args
        .work_dir
        .join(format!("stickyvol-cluster-{}", std::process::id()));
    fs::create_dir_all(dir.join("admin")).map_err(|e| format!("making {}: {e}", dir.display()))?;
    let result = run(args, dir).await;
    if !args.keep {
        let _ = fs::remove_dir_all(dir);
    }
    result
}

async fn run(args: &ClusterArgs, dir: &Path) -> Result<ClusterReport, String> {
    let store = Arc::new(Store::new());
    populate(&store, args.nodes, args.pvs);
    let node_args = plugin_base_args(dir);
    make_plugin_volumes(args, dir, &store, &node_args).await?;
    // A listener for each driver, so that each one's requests and bytes are counted apart.
    let (controller_address, controller_counters) = listen(&store).await?;
    let (node_address, node_counters) = listen(&store).await?;
    tokio::spawn(update_nodes(
        store.clone(),
        args.nodes,
        args.node_update_period,
    ));
    let controller_args = "--mode=controller --node-loss=on --node-id=sim-controller --namespace=stickyvol --identity=stickyvol-controller-0";
    let (mut controller, controller_pid) =
        start_against(args, dir, "controller", controller_address, controller_args).await?;
    let plugin_args = format!(
        "{node_args} --orphan-check-interval={}",
        args.orphan_check_interval
    );
    let (mut plugin, plugin_pid) =
        start_against(args, dir, "node", node_address, &plugin_args).await?;
    let (controller_usage, node_usage, window) = steady_state(
        args,
        (controller_pid, &controller_counters),
        (plugin_pid, &node_counters),
    )
    .await;
    let (node_deleted_to_release_s, taint_to_release_s) = node_loss(&store, DEADLINE).await;
    let mut report = ClusterReport {
        nodes: args.nodes,
        pvs: args.pvs,
        // The peaks are read again: node loss may have raised them.
        controller: Usage {
            peak_rss_kib: peak_rss(controller_pid),
            ..controller_usage
        },
        node_plugin: Usage {
            peak_rss_kib: peak_rss(plugin_pid),
            ..node_usage
        },
        node_deleted_to_release_s,
        taint_to_release_s,
        window_s: window.as_secs_f64(),
        errors_total: 0,
        leftovers: Vec::new(),
    };
    for (name, process) in [
        ("controller", &mut controller),
        ("node plugin", &mut plugin),
    ] {
        if let Err(err) = process.stop().await {
            report.leftovers.push(format!("{name}: {err}"));
        }
    }
    if report.node_deleted_to_release_s.is_none() || report.taint_to_release_s.is_none() {
        report.errors_total += 1;
    }
    Ok(report)
}

/// The node plugin's flags for paths and identity, its directories all in `dir`.
fn plugin_base_args(dir: &Path) -> String {
    let node = objects::node_name(PLUGIN_NODE);
    format!(
        "--mode=all --node-id={node} --data-dir={} --kubelet-dir={} --run-dir={} --admin-socket={} --namespace=stickyvol",
        dir.join("data").display(),
        dir.join("kubelet").display(),
        dir.join("run").display(),
        dir.join("admin/node.sock").display(),
    )
}

/// A simulated API server on `store`: its address and what it counts.
async fn listen(store: &Arc<Store>) -> Result<(SocketAddr, Arc<apiserver::Counters>), String> {
    apiserver::serve(store.clone())
        .await
        .map_err(|e| format!("listening: {e}"))
}

/// Starts the driver `name` with `args` against the API server at `address` (a kubeconfig of
/// its own names it): the process and its pid.
async fn start_against(
    cluster: &ClusterArgs,
    dir: &Path,
    name: &str,
    address: SocketAddr,
    args: &str,
) -> Result<(DriverProcess, u32), String> {
    let env = format!("KUBECONFIG={}", kubeconfig(dir, name, address)?.display());
    let (process, pid, _) = start(&cluster.stickyvol, dir, name, &env, args).await?;
    Ok((process, pid))
}

/// Lets both drivers settle, then counts for `--window` what each asks of its API server:
/// their usage and the window's length.
async fn steady_state(
    args: &ClusterArgs,
    controller: (u32, &apiserver::Counters),
    node: (u32, &apiserver::Counters),
) -> (Usage, Usage, Duration) {
    eprintln!(
        "cluster: {} nodes, {} PVs; settling for {:?}",
        args.nodes, args.pvs, args.settle
    );
    tokio::time::sleep(args.settle).await;
    let (c0, n0) = (controller.1.read(), node.1.read());
    let started = Instant::now();
    eprintln!("cluster: measuring for {:?}", args.window);
    tokio::time::sleep(args.window).await;
    let window = started.elapsed();
    let controller_usage = usage(controller.0, c0, controller.1.read(), window);
    let node_usage = usage(node.0, n0, node.1.read(), window);
    (controller_usage, node_usage, window)
}

fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

fn seconds(s: Option<f64>) -> String {
    s.map_or_else(|| "none (timed out)".into(), |s| format!("{s:.2} s"))
}

pub fn text(r: &ClusterReport) -> String {
    format!(
        "cluster: {} nodes, {} PVs of {CLASS}; steady state over {:.0} s\n\
         controller:  peak RSS {:.1} MiB, {:.3} requests/s, {:.3} MiB/s received\n\
         node plugin: peak RSS {:.1} MiB, {:.2} requests/min, {:.1} KiB/min received\n\
         Node deleted -> claim released: {}\n\
         out-of-service taint -> claim released: {}\n",
        r.nodes,
        r.pvs,
        r.window_s,
        r.controller.peak_rss_kib as f64 / 1024.0,
        r.controller.requests_per_s,
        mib(r.controller.bytes_per_s),
        r.node_plugin.peak_rss_kib as f64 / 1024.0,
        r.node_plugin.requests_per_s * 60.0,
        r.node_plugin.bytes_per_s * 60.0 / 1024.0,
        seconds(r.node_deleted_to_release_s),
        seconds(r.taint_to_release_s),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_shaped_like_a_real_one() {
        let size = objects::node(1, "2026-11-27T12:00:00Z").to_string().len();
        assert!((9_000..14_000).contains(&size), "{size} bytes");
    }

    #[tokio::test]
    async fn lists_page_and_watches_replay_from_their_version() {
        let store = Store::new();
        populate(&store, 10, 30);
        let all = |_: &str, _: &[u8]| true;
        let page = store.page(NODES, None, Some(4), all);
        assert_eq!(page.items.len(), 4);
        let next = store.page(NODES, page.more_after.as_deref(), Some(100), all);
        assert_eq!(next.items.len(), 6);
        assert!(next.more_after.is_none());
        let version = store.version();
        store.remove(NODES, &objects::node_name(3));
        let watch = store.subscribe(version).unwrap();
        assert_eq!(watch.backlog.len(), 1);
        assert_eq!(watch.backlog[0].kind, "DELETED");
        let named = |name: &str, _: &[u8]| name == "node-00004";
        assert_eq!(store.page(NODES, None, None, named).items.len(), 1);
        // A label selector, with a limit counted after it (as the API server counts).
        let labelled = selector::Selector::parse("kubernetes.io/hostname=node-00005");
        let page = store.page(NODES, None, Some(1), |_, object| labelled.matches(object));
        assert_eq!(page.items.len(), 1);
        assert!(page.more_after.is_none());
        let node: serde_json::Value = serde_json::from_slice(&page.items[0]).unwrap();
        assert_eq!(node["metadata"]["name"], "node-00005");
    }
}
