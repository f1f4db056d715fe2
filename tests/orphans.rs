//! A node that comes back after the cluster released its claims: the real driver, with
//! `--orphan-check-interval`, reads PVs from a stub API server (its kubeconfig) and moves the
//! data of volumes whose PV is gone to lost+found, never deleting it; a volume whose PV exists,
//! one that is published, and one whose PV cannot be read stay where they are. The node's
//! report of them (a ConfigMap owned by its Node, whose uid its credentials carry) follows what
//! is left. A driver that ran through its node's loss learns of it from the controller's
//! release notice. No Node is ever read: the stub refuses them, as RBAC does.

mod common;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::apistub::{self, status};
use common::*;
use serde_json::{Value, json};

/// What the stub API server holds and saw.
#[derive(Default)]
struct Api {
    /// PVs by name.
    pvs: HashMap<String, Value>,
    /// Bodies of the Events posted.
    events: Vec<Value>,
    /// ConfigMaps of namespace `stickyvol` by name, as last applied.
    config_maps: HashMap<String, Value>,
    /// How many times each PV was read.
    reads: HashMap<String, usize>,
    /// The node's release notice, if the controller wrote one.
    notice: Option<Value>,
    /// The store's resourceVersion: bumped at each change of the notice.
    version: u64,
    /// Requests for Nodes (refused).
    node_requests: usize,
}

type Shared = Arc<Mutex<Api>>;

/// The paths the driver uses: GET a PV (names starting with "pv-broken" answer 500), POST an
/// Event, review itself (a token bound to a pod on node NODE_ID), apply (PATCH) and DELETE a
/// ConfigMap of namespace `stickyvol`, list and watch its release notice. Nodes are refused.
fn handle(api: &Shared, method: &str, full_path: &str, body: &[u8]) -> (u16, Value) {
    let (path, query) = full_path.split_once('?').unwrap_or((full_path, ""));
    let mut api = api.lock().unwrap();
    if path.starts_with("/api/v1/nodes") {
        api.node_requests += 1;
        return (403, status(403, "Forbidden"));
    }
    if method == "GET"
        && let Some(name) = path.strip_prefix("/api/v1/persistentvolumes/")
    {
        *api.reads.entry(name.to_string()).or_default() += 1;
        if name.starts_with("pv-broken") {
            return (500, status(500, "InternalError"));
        }
        return match api.pvs.get(name) {
            Some(pv) => (200, pv.clone()),
            None => (404, status(404, "NotFound")),
        };
    }
    if method == "POST" && path == "/apis/authentication.k8s.io/v1/selfsubjectreviews" {
        return (
            201,
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
                   "status": {"userInfo": {"username": "system:serviceaccount:stickyvol:stickyvol-node",
                   "extra": {"authentication.kubernetes.io/node-name": [NODE_ID],
                             "authentication.kubernetes.io/node-uid": ["uid-node"]}}}}),
        );
    }
    if method == "GET" && path == "/api/v1/namespaces/stickyvol/configmaps" {
        return notice_list_or_watch(&api, query);
    }
    if let Some(name) = path.strip_prefix("/api/v1/namespaces/stickyvol/configmaps/") {
        match method {
            "PATCH" => {
                let applied: Value = serde_json::from_slice(body).unwrap();
                api.config_maps.insert(name.to_string(), applied.clone());
                return (200, applied);
            }
            "DELETE" if name == notice_name() => return take_back_notice(&mut api, body),
            "DELETE" => {
                return match api.config_maps.remove(name) {
                    Some(_) => (200, apistub::success()),
                    None => (404, status(404, "NotFound")),
                };
            }
            _ => {}
        }
    }
    if method == "POST" && path == "/apis/events.k8s.io/v1/namespaces/default/events" {
        let event: Value = serde_json::from_slice(body).unwrap();
        api.events.push(event.clone());
        return (201, event);
    }
    (404, status(404, "NotFound"))
}

fn notice_name() -> String {
    format!("{DRIVER_NAME}-released-{NODE_ID}")
}

/// The notice's list, or a watch of it: one from a version older than the notice's is told to
/// list again (an ERROR event of 410 Gone, as after a compaction), which brings the notice;
/// otherwise it idles.
fn notice_list_or_watch(api: &Api, query: &str) -> (u16, Value) {
    assert!(
        query.contains(&format!("fieldSelector=metadata.name%3D{}", notice_name())),
        "the notice is watched by its name alone: {query}"
    );
    if !query.contains("watch=true") {
        return (
            200,
            json!({"apiVersion": "v1", "kind": "ConfigMapList",
                   "metadata": {"resourceVersion": api.version.to_string()},
                   "items": api.notice.iter().collect::<Vec<_>>()}),
        );
    }
    let from: u64 = query
        .split('&')
        .find_map(|p| p.strip_prefix("resourceVersion="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if from < api.version {
        return (
            200,
            json!({"type": "ERROR", "object": status(410, "Expired")}),
        );
    }
    apistub::idle_watch()
}

/// A DELETE of the notice, its resourceVersion precondition kept.
fn take_back_notice(api: &mut Api, body: &[u8]) -> (u16, Value) {
    let params: Value = serde_json::from_slice(body).unwrap_or_default();
    let Some(notice) = &api.notice else {
        return (404, status(404, "NotFound"));
    };
    let wanted = params["preconditions"]["resourceVersion"].as_str();
    if wanted.is_some_and(|v| Some(v) != notice["metadata"]["resourceVersion"].as_str()) {
        return (409, status(409, "Conflict"));
    }
    api.notice = None;
    api.version += 1;
    (200, apistub::success())
}

/// The controller's release notice for this node, as it writes one before deleting a PV.
fn post_notice(api: &Shared) {
    let mut api = api.lock().unwrap();
    api.version += 1;
    api.notice = Some(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": notice_name(), "namespace": "stickyvol",
                     "resourceVersion": api.version.to_string()},
        "data": {"node": NODE_ID, "releasedAtUnixMs": "1795766400000"}}));
}

/// Serves the stub for the rest of the test; its kubeconfig.
async fn stub_api(api: Shared, dir: &Path) -> PathBuf {
    apistub::serve(
        Arc::new(move |method: &str, path: &str, body: &[u8]| handle(&api, method, path, body)),
        dir,
    )
    .await
}

fn pv(name: &str, handle: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
           "spec": {"csi": {"driver": DRIVER_NAME, "volumeHandle": handle}}})
}

/// A driver whose orphan check looks every second, against a fresh stub; the scratch directory
/// holds the stub's kubeconfig.
async fn checking_driver() -> (Shared, TestDriver, tempfile::TempDir) {
    let api = Shared::default();
    let scratch = tempfile::tempdir().unwrap();
    let kubeconfig = stub_api(api.clone(), scratch.path()).await;
    let driver = TestDriver::start_with_metrics(Options {
        kubeconfig: Some(kubeconfig),
        extra_args: vec![
            "--orphan-check-interval".into(),
            "1".into(),
            "--namespace".into(),
            "stickyvol".into(),
        ],
        ..Options::default()
    })
    .await;
    (api, driver, scratch)
}

/// A volume as the provisioner creates it for PV `pv_name`.
async fn volume_of_pv(driver: &TestDriver, pv_name: &str) -> csi::Volume {
    driver
        .create(csi::CreateVolumeRequest {
            parameters: params(&[("csi.storage.k8s.io/pv/name", pv_name)]),
            ..create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), SIZE)
        })
        .await
}

fn volumes_json(driver: &TestDriver) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_stickyvol"))
        .args(["volumes", "--json"])
        .env("ADMIN_SOCKET", &driver.admin_socket)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// The volume ids and states in the node's report, if there is one.
fn reported(api: &Shared) -> Option<Vec<(String, String)>> {
    let api = api.lock().unwrap();
    let report = api
        .config_maps
        .get(&format!("{DRIVER_NAME}-orphans-{NODE_ID}"))?;
    assert_eq!(report["metadata"]["ownerReferences"][0]["uid"], "uid-node");
    assert_eq!(report["data"]["node"], NODE_ID);
    let entries: Vec<Value> =
        serde_json::from_str(report["data"]["volumes.json"].as_str().unwrap()).unwrap();
    let mut entries: Vec<(String, String)> = entries
        .iter()
        .map(|e| {
            (
                e["volume_id"].as_str().unwrap().to_string(),
                e["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    entries.sort();
    Some(entries)
}

fn listed(driver: &TestDriver, id: &str) -> Value {
    volumes_json(driver)
        .into_iter()
        .find(|v| v["volume_id"] == id)
        .unwrap_or_else(|| panic!("{id} not listed"))
}

#[tokio::test(flavor = "multi_thread")]
async fn volumes_whose_pv_is_gone_move_to_lost_found_and_no_other() {
    let (api, mut driver, _scratch) = checking_driver().await;

    let kept = volume_of_pv(&driver, "pv-kept").await;
    api.lock()
        .unwrap()
        .pvs
        .insert("pv-kept".into(), pv("pv-kept", &kept.volume_id));
    let gone = volume_of_pv(&driver, "pv-gone").await;
    // A PV of that name that names another volume is not this volume's PV.
    let renamed = volume_of_pv(&driver, "pv-renamed").await;
    api.lock()
        .unwrap()
        .pvs
        .insert("pv-renamed".into(), pv("pv-renamed", "sv-someone-else"));
    let unreadable = volume_of_pv(&driver, "pv-broken-1").await;
    let (published, _target) = {
        let volume = volume_of_pv(&driver, "pv-published").await;
        let target = driver
            .publish_at_new_target(&volume, mount_cap(Mode::SingleNodeWriter))
            .await;
        (volume, target)
    };
    let data_of = |v: &csi::Volume| driver.data.join("volumes").join(&v.volume_id);
    fs::write(data_of(&gone).join("precious"), b"keep me").unwrap();
    // What the pool holds back for its volumes' unwritten bytes (none measured yet: all of it).
    let promised = |driver: &TestDriver| {
        driver.scrape().value(
            "stickyvol_pool_unwritten_promised_bytes",
            &[("pool", "default")],
        ) as i64
    };
    assert_eq!(promised(&driver), 5 * SIZE);

    // Absent on two looks one and a half intervals (1.5 s) apart, and older than that.
    let lost = driver.data.join("lost+found");
    eventually("the gone PV's volume in lost+found", || {
        lost.join(&gone.volume_id).join("precious").exists()
            && lost.join(&renamed.volume_id).exists()
    })
    .await;
    assert_eq!(
        fs::read(lost.join(&gone.volume_id).join("precious")).unwrap(),
        b"keep me"
    );
    assert!(!data_of(&gone).exists());
    // Never written again: an orphaned volume is promised nothing more (it held its whole size
    // back from every new claim's capacity).
    assert_eq!(promised(&driver), 3 * SIZE);
    // A few more looks: nothing else moves, and a PV seen present is not read again (the
    // unreadable one is, every interval).
    let reads = |pv: &str| api.lock().unwrap().reads.get(pv).copied().unwrap_or(0);
    let (kept_reads, broken_reads) = (reads("pv-kept"), reads("pv-broken-1"));
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(reads("pv-kept"), kept_reads, "pv-kept read again");
    assert!(reads("pv-broken-1") > broken_reads);
    for stays in [&kept, &unreadable, &published] {
        assert!(
            data_of(stays).is_dir(),
            "{} moved: {:?}",
            stays.volume_id,
            fs::read_dir(&lost).unwrap().collect::<Vec<_>>()
        );
        assert_eq!(listed(&driver, &stays.volume_id)["orphaned"], false);
    }

    // Reported: the volume list, the metrics, an Event on the node.
    let entry = listed(&driver, &gone.volume_id);
    assert_eq!(entry["orphaned"], true);
    assert_eq!(entry["abnormal"], true);
    assert_eq!(
        entry["host_path"],
        lost.join(&gone.volume_id).display().to_string()
    );
    assert!(
        entry["condition"].as_str().unwrap().contains("pv-gone"),
        "{entry}"
    );
    let metrics = driver.scrape();
    assert_eq!(metrics.value("stickyvol_orphaned_volumes", &[]), 2.0);
    assert_eq!(
        metrics.value(
            "stickyvol_node_loss_actions_total",
            &[("action", "orphan_to_lost_found"), ("result", "done")]
        ),
        2.0
    );
    {
        let api = api.lock().unwrap();
        assert_eq!(api.events.len(), 2, "{:?}", api.events);
        let event = api
            .events
            .iter()
            .find(|e| e["note"].as_str().unwrap().contains(&gone.volume_id))
            .unwrap();
        assert_eq!(event["reason"], "VolumeOrphaned");
        assert_eq!(event["regarding"]["kind"], "Node");
        assert_eq!(event["regarding"]["name"], NODE_ID);
    }
    let mut both = vec![
        (gone.volume_id.clone(), "orphaned".to_string()),
        (renamed.volume_id.clone(), "orphaned".to_string()),
    ];
    both.sort();
    eventually("both in the node's report", || {
        reported(&api).as_ref() == Some(&both)
    })
    .await;

    // The mark is durable; a start reads every candidate's PV again.
    driver.restart().await;
    assert_eq!(listed(&driver, &gone.volume_id)["orphaned"], true);
    assert_eq!(promised(&driver), 3 * SIZE);
    eventually("pv-kept read again at start", || {
        reads("pv-kept") > kept_reads
    })
    .await;

    // Never published again; a DeleteVolume drops the record and leaves the data.
    let refused = driver
        .publish(
            &gone,
            &driver.target_for(&mount_cap(Mode::SingleNodeWriter)),
            mount_cap(Mode::SingleNodeWriter),
            false,
        )
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    driver.delete(&gone.volume_id).await.unwrap();
    assert!(
        !volumes_json(&driver)
            .iter()
            .any(|v| v["volume_id"] == gone.volume_id)
    );
    assert_eq!(
        fs::read(lost.join(&gone.volume_id).join("precious")).unwrap(),
        b"keep me"
    );
    // The report follows: one volume left, then none, and then no report at all.
    let one = vec![(renamed.volume_id.clone(), "orphaned".to_string())];
    eventually("the deleted record out of the report", || {
        reported(&api).as_ref() == Some(&one)
    })
    .await;
    driver.delete(&renamed.volume_id).await.unwrap();
    eventually("the report deleted", || reported(&api).is_none()).await;
    assert_eq!(api.lock().unwrap().node_requests, 0, "a Node was asked for");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_notice_has_every_pv_read_again_and_is_taken_back() {
    let (api, driver, _scratch) = checking_driver().await;
    let volume = volume_of_pv(&driver, "pv-a").await;
    api.lock()
        .unwrap()
        .pvs
        .insert("pv-a".into(), pv("pv-a", &volume.volume_id));
    let reads = || api.lock().unwrap().reads.get("pv-a").copied().unwrap_or(0);
    eventually("pv-a read once", || reads() == 1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(reads(), 1, "a PV seen present is not read again");

    // The node ran through its loss: the controller wrote the notice, then deleted the PV.
    post_notice(&api);
    api.lock().unwrap().pvs.remove("pv-a");
    let lost = driver.data.join("lost+found").join(&volume.volume_id);
    eventually("pv-a's volume in lost+found", || lost.exists()).await;
    eventually("the notice taken back", || {
        api.lock().unwrap().notice.is_none()
    })
    .await;
    assert_eq!(listed(&driver, &volume.volume_id)["orphaned"], true);
    assert_eq!(api.lock().unwrap().node_requests, 0, "a Node was asked for");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_api_moves_nothing() {
    // No server at that address: every read fails.
    let scratch = tempfile::tempdir().unwrap();
    let kubeconfig = scratch.path().join("kubeconfig");
    let unused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = unused.local_addr().unwrap();
    drop(unused);
    fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: none\n  cluster: {{server: \"http://{address}\"}}\n\
             users:\n- name: none\n  user: {{}}\ncontexts:\n- name: none\n  context: {{cluster: none, user: none}}\n\
             current-context: none\n"
        ),
    )
    .unwrap();
    let driver = TestDriver::start_with(Options {
        kubeconfig: Some(kubeconfig),
        extra_args: vec!["--orphan-check-interval".into(), "1".into()],
        ..Options::default()
    })
    .await;
    let volume = volume_of_pv(&driver, "pv-anything").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(driver.data.join("volumes").join(&volume.volume_id).is_dir());
    assert!(driver.log_text().contains("cannot read the PV"));
    assert_eq!(listed(&driver, &volume.volume_id)["orphaned"], false);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_move_a_crash_interrupted_after_the_mark_is_finished_at_start() {
    let api = Shared::default();
    let scratch = tempfile::tempdir().unwrap();
    let kubeconfig = stub_api(api.clone(), scratch.path()).await;
    let mut driver = TestDriver::start_with(Options {
        kubeconfig: Some(kubeconfig),
        extra_args: vec!["--orphan-check-interval".into(), "1".into()],
        ..Options::default()
    })
    .await;
    let volume = volume_of_pv(&driver, "pv-gone").await;
    let data = driver.data.join("volumes").join(&volume.volume_id);
    let lost = driver.data.join("lost+found").join(&volume.volume_id);
    fs::write(data.join("precious"), b"keep me").unwrap();
    eventually("the volume in lost+found", || {
        lost.join("precious").exists()
    })
    .await;
    // As if the driver had died between marking the record and renaming the data; started
    // again without the check, it finishes the move from the record alone.
    driver.stop().await;
    fs::rename(&lost, &data).unwrap();
    driver.options_mut().extra_args.clear();
    driver.options_mut().kubeconfig = None;
    driver.start_again().await;
    assert!(!data.exists());
    assert_eq!(fs::read(lost.join("precious")).unwrap(), b"keep me");
    assert_eq!(listed(&driver, &volume.volume_id)["orphaned"], true);
}
