//! Directory volumes whose pool cannot limit them behave like an emptyDir with a sizeLimit: the
//! real driver, with `--overflow-check-interval`, against a stub API server (its kubeconfig).
//! Volumes are published as kubelet publishes them with the CSIDriver's `podInfoOnMount` (the
//! pod's name, namespace and uid in volume_context) and filled through the mount past their size;
//! NodeGetVolumeStats measures them as kubelet's periodic call does. Then: an eviction request for
//! that pod alone, carrying its uid, written on the volume's PV for the controller (which checks
//! and evicts: `controller::evictions`' tests) and taken back once the volume fits, and Events on
//! the claim; with `onOverflow: report` none; a pool that enforces sizes never asks.

mod common;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::apistub::{self, status};
use common::chain::Chain;
use common::scratchfs::ScratchFs;
use common::*;
use serde_json::{Value, json};

const CLAIM_NS: &str = "shop";

/// What the stub API server holds and saw.
#[derive(Default)]
struct Api {
    /// Claims of namespace `shop` by name.
    claims: HashMap<String, Value>,
    /// (PV name, merge patch) of every PV patch: the eviction requests, and their withdrawals.
    requests: Vec<(String, Value)>,
    /// Bodies of the Events posted in namespace `shop`.
    events: Vec<Value>,
}

type Shared = Arc<Mutex<Api>>;

/// GET a claim of `shop`, PATCH a PV (an eviction request), POST an events.k8s.io Event in
/// `shop`.
fn handle(api: &Shared, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let path = path.split('?').next().unwrap_or_default();
    let mut api = api.lock().unwrap();
    if let (Some(pv), "PATCH") = (path.strip_prefix("/api/v1/persistentvolumes/"), method) {
        let patch: Value = serde_json::from_slice(body).unwrap();
        api.requests.push((pv.to_string(), patch));
        let reply =
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv}});
        return (200, reply);
    }
    if method == "POST" && path == format!("/apis/events.k8s.io/v1/namespaces/{CLAIM_NS}/events") {
        let event: Value = serde_json::from_slice(body).unwrap();
        api.events.push(event.clone());
        return (201, event);
    }
    let ns = format!("/api/v1/namespaces/{CLAIM_NS}/");
    let Some(rest) = path.strip_prefix(&ns) else {
        return (404, status(404, "NotFound"));
    };
    match (method, rest.split('/').collect::<Vec<_>>().as_slice()) {
        ("GET", ["persistentvolumeclaims", name]) => match api.claims.get(*name) {
            Some(claim) => (200, claim.clone()),
            None => (404, status(404, "NotFound")),
        },
        _ => (404, status(404, "NotFound")),
    }
}

struct Setup {
    api: Shared,
    driver: TestDriver,
    _scratch: tempfile::TempDir,
}

/// A driver whose overflow check runs every second, talking to a fresh stub; `args` adds flags.
async fn start(args: &[String]) -> Setup {
    start_every("1", args).await
}

/// The same with full rounds `interval` seconds apart.
async fn start_every(interval: &str, args: &[String]) -> Setup {
    let api = Shared::default();
    let scratch = tempfile::tempdir().unwrap();
    let stub = api.clone();
    let kubeconfig = apistub::serve(
        Arc::new(move |method: &str, path: &str, body: &[u8]| handle(&stub, method, path, body)),
        scratch.path(),
    )
    .await;
    let mut options = Options {
        kubeconfig: Some(kubeconfig),
        ..Options::default()
    };
    options.extra_args = [
        "--overflow-check-interval",
        interval,
        "--enforcement",
        "default=none",
    ]
    .iter()
    .map(ToString::to_string)
    .chain(args.iter().cloned())
    .collect();
    let driver = TestDriver::start_with_metrics(options).await;
    Setup {
        api,
        driver,
        _scratch: scratch,
    }
}

/// A claim `name` of `shop` bound to the PV `pv`, with uid `uid-<name>`.
fn claim(api: &Shared, name: &str, pv: &str) {
    api.lock().unwrap().claims.insert(
        name.into(),
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
               "metadata": {"name": name, "namespace": CLAIM_NS, "uid": format!("uid-{name}")},
               "spec": {"volumeName": pv}}),
    );
}

/// A volume as the provisioner creates it for claim `shop/<claim>`, with `extra` parameters.
async fn volume_of_claim(setup: &Setup, claim_name: &str, extra: &[(&str, &str)]) -> csi::Volume {
    volume_of_claim_sized(setup, claim_name, extra, SIZE).await
}

async fn volume_of_claim_sized(
    setup: &Setup,
    claim_name: &str,
    extra: &[(&str, &str)],
    size: i64,
) -> csi::Volume {
    let pv = new_name();
    claim(&setup.api, claim_name, &pv);
    let mut pairs = vec![
        ("csi.storage.k8s.io/pvc/name", claim_name),
        ("csi.storage.k8s.io/pvc/namespace", CLAIM_NS),
        ("csi.storage.k8s.io/pv/name", pv.as_str()),
    ];
    pairs.extend_from_slice(extra);
    setup
        .driver
        .create(csi::CreateVolumeRequest {
            parameters: params(&pairs),
            ..create_request(&pv, mount_cap(Mode::SingleNodeWriter), size)
        })
        .await
}

/// Published for pod `shop/<pod>` (uid `uid-<pod>`), as kubelet does with podInfoOnMount.
async fn publish_for_pod(driver: &TestDriver, volume: &csi::Volume, pod: &str) -> PathBuf {
    let target = driver.mount_target();
    let mut request = publish_request(volume, &target, mount_cap(Mode::SingleNodeWriter), false);
    request.volume_context.extend([
        ("csi.storage.k8s.io/pod.name".to_string(), pod.to_string()),
        (
            "csi.storage.k8s.io/pod.namespace".to_string(),
            CLAIM_NS.to_string(),
        ),
        (
            "csi.storage.k8s.io/pod.uid".to_string(),
            format!("uid-{pod}"),
        ),
        (
            "csi.storage.k8s.io/serviceAccount.name".to_string(),
            "default".to_string(),
        ),
    ]);
    driver
        .node()
        .node_publish_volume(request)
        .await
        .unwrap_or_else(|s| panic!("NodePublishVolume for {pod}: {s:?}"));
    target
}

/// Writes `bytes` of real (allocated) data into a new file under `dir`.
fn write(dir: &Path, name: &str, bytes: i64) {
    fs::write(dir.join(name), vec![0x5a; bytes as usize]).unwrap();
    let file = fs::File::open(dir.join(name)).unwrap();
    file.sync_all().unwrap();
}

/// NodeGetVolumeStats as kubelet calls it periodically; the volume's condition.
async fn measure(driver: &TestDriver, volume: &csi::Volume, target: &Path) -> csi::VolumeCondition {
    driver
        .stats(&volume.volume_id, &path_str(target))
        .await
        .unwrap()
        .volume_condition
        .unwrap()
}

/// Waits up to 20 s for `done` to hold of the stub's state.
async fn until(api: &Shared, what: &str, done: impl Fn(&Api) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done(&api.lock().unwrap()) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn reasons(api: &Shared) -> Vec<String> {
    api.lock()
        .unwrap()
        .events
        .iter()
        .map(|e| e["reason"].as_str().unwrap_or_default().to_string())
        .collect()
}

const REQUEST: &str = "stickyvol.csi.io/eviction-request";

/// The eviction requests written (withdrawals left out), parsed, with their PV.
fn requests(api: &Api) -> Vec<(String, Value)> {
    (api.requests.iter())
        .filter_map(|(pv, patch)| {
            let text = patch["metadata"]["annotations"][REQUEST].as_str()?;
            Some((pv.clone(), serde_json::from_str(text).unwrap()))
        })
        .collect()
}

/// The pods the requests named, each once, in the order first asked for.
fn asked_pods(api: &Shared) -> Vec<String> {
    let mut pods: Vec<String> = Vec::new();
    for (_, request) in requests(&api.lock().unwrap()) {
        for pod in request["pods"].as_array().unwrap() {
            let name = pod["name"].as_str().unwrap().to_string();
            if !pods.contains(&name) {
                pods.push(name);
            }
        }
    }
    pods
}

fn asked(api: &Api) -> bool {
    !requests(api).is_empty()
}

/// The PV the stub bound claim `name` to.
fn pv_of(api: &Shared, claim: &str) -> String {
    let api = api.lock().unwrap();
    api.claims[claim]["spec"]["volumeName"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Lets the check run a few more rounds (it runs every second).
async fn a_few_rounds() {
    tokio::time::sleep(Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_overflowing_volume_asks_for_its_pods_eviction_on_its_pv_and_no_other() {
    let setup = start(&[]).await;
    let driver = &setup.driver;
    let full = volume_of_claim(&setup, "full", &[]).await;
    let fine = volume_of_claim(&setup, "fine", &[]).await;
    let full_target = publish_for_pod(driver, &full, "writer").await;
    let fine_target = publish_for_pod(driver, &fine, "bystander").await;
    write(&full_target, "big", 2 * SIZE);
    write(&fine_target, "small", SIZE / 4);
    let condition = measure(driver, &full, &full_target).await;
    assert!(condition.abnormal, "{condition:?}");
    assert!(!measure(driver, &fine, &fine_target).await.abnormal);

    until(&setup.api, "the eviction request", asked).await;
    a_few_rounds().await;
    assert_eq!(asked_pods(&setup.api), ["writer"], "that pod only");
    let pv = pv_of(&setup.api, "full");
    {
        let api = setup.api.lock().unwrap();
        let written = requests(&api);
        assert!(
            written.iter().all(|(on, _)| *on == pv),
            "on its own PV only"
        );
        assert!(written.len() >= 2, "asked again every round: {written:?}");
        let (first, last) = (&written[0].1, &written[written.len() - 1].1);
        assert_eq!(
            first["pods"][0]["uid"], "uid-writer",
            "only the pod published, never a namesake made since: {first}"
        );
        assert!(
            first["why"]
                .as_str()
                .unwrap()
                .contains("more than its size of")
        );
        assert!(last["expiresUnixMs"].as_u64() > first["expiresUnixMs"].as_u64());
        let label = &api.requests[0].1["metadata"]["labels"]["stickyvol.csi.io/eviction-requested"];
        assert_eq!(label, "true", "the label the controller watches");
        for event in &api.events {
            assert_eq!(event["regarding"]["kind"], "PersistentVolumeClaim");
            assert_eq!(event["regarding"]["name"], "full");
            assert_eq!(event["regarding"]["uid"], "uid-full");
            assert_eq!(event["type"], "Warning");
        }
    }
    assert_eq!(reasons(&setup.api), ["VolumeOverflow"], "said once");
    let note = setup.api.lock().unwrap().events[0]["note"].to_string();
    assert!(
        note.contains("more than its size of")
            && note.contains("the controller evicts shop/writer"),
        "{note}"
    );
    let metrics = driver.scrape();
    assert_eq!(
        metrics.value("stickyvol_overflowing_volumes", &[("on_overflow", "evict")]),
        1.0
    );

    // Back within its size (data removed): the request is taken back, no longer counted.
    fs::remove_file(full_target.join("big")).unwrap();
    measure(driver, &full, &full_target).await;
    until(&setup.api, "the request taken back", |api| {
        let (on, last) = &api.requests[api.requests.len() - 1];
        let metadata = &last["metadata"];
        let has_null = |map: &Value, key: &str| map.get(key).is_some_and(Value::is_null);
        *on == pv
            && has_null(&metadata["annotations"], REQUEST)
            && has_null(&metadata["labels"], "stickyvol.csi.io/eviction-requested")
    })
    .await;
    let metrics = driver.scrape();
    assert_eq!(
        metrics.value("stickyvol_overflowing_volumes", &[("on_overflow", "evict")]),
        0.0
    );
    for (volume, target) in [(&full, &full_target), (&fine, &fine_target)] {
        driver.unpublish_ok(volume, target).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn report_evicts_nothing_but_says_so() {
    let setup = start(&[]).await;
    let driver = &setup.driver;
    let volume = volume_of_claim(&setup, "logs", &[("onOverflow", "report")]).await;
    let target = publish_for_pod(driver, &volume, "logger").await;
    write(&target, "big", 2 * SIZE);
    let condition = measure(driver, &volume, &target).await;
    assert!(
        condition.abnormal && condition.message.contains("more than its size"),
        "{condition:?}"
    );
    until(&setup.api, "the event", |api| !api.events.is_empty()).await;
    a_few_rounds().await;
    assert_eq!(asked_pods(&setup.api), Vec::<String>::new());
    assert!(setup.api.lock().unwrap().requests.is_empty());
    assert_eq!(reasons(&setup.api), ["VolumeOverflow"]);
    let note = setup.api.lock().unwrap().events[0]["note"].to_string();
    assert!(
        note.contains("onOverflow: report: no pod is evicted"),
        "{note}"
    );
    assert_eq!(
        driver.scrape().value(
            "stickyvol_overflowing_volumes",
            &[("on_overflow", "report")]
        ),
        1.0
    );
    driver.unpublish_ok(&volume, &target).await;
}

/// `onOverflow` from a VolumeAttributesClass (ControllerModifyVolume's mutable parameters) takes
/// the StorageClass's place: a volume of an evicting class, changed to `report`, evicts nothing.
#[tokio::test(flavor = "multi_thread")]
async fn on_overflow_from_the_attributes_class_takes_the_storage_class_s_place() {
    let setup = start(&[]).await;
    let driver = &setup.driver;
    let volume = volume_of_claim(&setup, "logs", &[]).await;
    let modify = |value: &str| csi::ControllerModifyVolumeRequest {
        volume_id: volume.volume_id.clone(),
        mutable_parameters: [("onOverflow".to_string(), value.to_string())].into(),
        ..Default::default()
    };
    let refused = driver
        .controller()
        .controller_modify_volume(modify("ignore"))
        .await;
    assert_eq!(refused.unwrap_err().code(), tonic::Code::InvalidArgument);
    (driver
        .controller()
        .controller_modify_volume(modify("report"))
        .await)
        .expect("onOverflow: report from the attributes class");
    let target = publish_for_pod(driver, &volume, "logger").await;
    write(&target, "big", 2 * SIZE);
    assert!(measure(driver, &volume, &target).await.abnormal);
    until(&setup.api, "the event", |api| !api.events.is_empty()).await;
    a_few_rounds().await;
    assert_eq!(asked_pods(&setup.api), Vec::<String>::new());
    let note = setup.api.lock().unwrap().events[0]["note"].to_string();
    assert!(
        note.contains("onOverflow: report: no pod is evicted"),
        "{note}"
    );
    driver.unpublish_ok(&volume, &target).await;
}

/// Between full rounds (an hour apart here) the volumes stats find above their size are acted on
/// at once, and the gauge counts them as soon as their Event is out (it once waited for the next
/// full round: the e2e scenario read 0 beside the Event).
#[tokio::test(flavor = "multi_thread")]
async fn the_gauge_counts_what_stats_found_before_the_next_full_round() {
    let setup = start_every("3600", &[]).await;
    let driver = &setup.driver;
    let volume = volume_of_claim(&setup, "logs", &[("onOverflow", "report")]).await;
    let target = publish_for_pod(driver, &volume, "logger").await;
    write(&target, "big", 2 * SIZE);
    assert!(measure(driver, &volume, &target).await.abnormal);
    until(&setup.api, "the event", |api| !api.events.is_empty()).await;
    let gauge = |on: &str| {
        driver
            .scrape()
            .value("stickyvol_overflowing_volumes", &[("on_overflow", on)])
    };
    // Set just after the round's Events: a few seconds at most, never the hour.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while gauge("report") != 1.0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(gauge("report"), 1.0, "the gauge before the next full round");
    assert_eq!(gauge("evict"), 0.0);
    driver.unpublish_ok(&volume, &target).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_info_survives_a_restart_and_hostile_pod_info_is_refused() {
    let mut setup = start(&[]).await;
    let volume = volume_of_claim(&setup, "kept", &[]).await;
    let target = publish_for_pod(&setup.driver, &volume, "survivor").await;
    // Hostile pod info never reaches an API path.
    let other = setup.driver.mount_target();
    let mut request = publish_request(&volume, &other, mount_cap(Mode::SingleNodeWriter), false);
    request.volume_context.extend([
        (
            "csi.storage.k8s.io/pod.name".to_string(),
            "../../nodes/x".to_string(),
        ),
        (
            "csi.storage.k8s.io/pod.namespace".to_string(),
            CLAIM_NS.to_string(),
        ),
        ("csi.storage.k8s.io/pod.uid".to_string(), "u".to_string()),
    ]);
    let err = setup
        .driver
        .node()
        .node_publish_volume(request)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

    setup.driver.kill9_and_restart().await;
    write(&target, "big", 2 * SIZE);
    measure(&setup.driver, &volume, &target).await;
    until(&setup.api, "the eviction request after the restart", asked).await;
    assert_eq!(asked_pods(&setup.api), ["survivor"]);
    setup.driver.unpublish_ok(&volume, &target).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_that_enforces_sizes_never_asks_for_evictions() {
    // btrfs with quota: the qgroup counts extents shared by reflinked copies once, a walk
    // counts each copy. Three copies of 3/4 of the size are "above the size" to a walk, within
    // it to the quota: a check that walked a limited volume would evict.
    let fs = ScratchFs::new("btrfs", 512 * MIB as u64, &["-q"], "");
    let pool = fs.mount_point.join("pool");
    let setup = start(&[
        "--pool".into(),
        format!("fast={}", pool.display()),
        "--enforcement".into(),
        "fast=btrfs".into(),
    ])
    .await;
    let driver = &setup.driver;
    let volume = volume_of_claim(&setup, "limited", &[("pool", "fast")]).await;
    let target = publish_for_pod(driver, &volume, "tenant").await;
    write(&target, "data", SIZE * 3 / 4);
    for copy in ["copy-1", "copy-2"] {
        let status = Command::new("cp")
            .arg("--reflink=always")
            .arg(target.join("data"))
            .arg(target.join(copy))
            .status()
            .unwrap();
        assert!(status.success(), "cp --reflink");
    }
    let walked = Command::new("du")
        .args(["-s", "-B1"])
        .arg(&target)
        .output()
        .unwrap();
    let walked: u64 = String::from_utf8_lossy(&walked.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        walked > SIZE as u64,
        "a walk sees {walked} bytes: the test would prove nothing"
    );
    let condition = measure(driver, &volume, &target).await;
    assert!(!condition.abnormal, "{condition:?}");
    tokio::time::sleep(Duration::from_secs(4)).await;
    {
        let api = setup.api.lock().unwrap();
        assert!(
            api.requests.is_empty() && api.events.is_empty(),
            "nothing asked or reported"
        );
    }
    assert!(driver.log_text().contains("overflow check starting"));
    driver.unpublish_ok(&volume, &target).await;
}

/// `tree::MAX_DEPTH`: walks enter no deeper, so no measurement of a deeper tree succeeds.
const MAX_DEPTH: usize = stickyvol::host::tree::MAX_DEPTH;

/// A tenant cannot hide from the check by making its tree unmeasurable: a volume no walk can
/// measure (a chain of directories deeper than walks enter) counts as above its size.
#[tokio::test(flavor = "multi_thread")]
async fn a_volume_too_deep_to_measure_has_its_pods_eviction_asked_for() {
    let setup = start(&[]).await;
    let driver = &setup.driver;
    // Roomy enough that the chain's own blocks (4,100 directories, a block each) and the data
    // stay within its size while a walk still gets to the bottom: an overflow found by size
    // before the chain is deep is another test's.
    let volume = volume_of_claim_sized(&setup, "deep", &[], 4 * SIZE).await;
    let target = publish_for_pod(driver, &volume, "climber").await;
    write(&target, "small", SIZE / 4);
    let chain = Chain::make(&target, MAX_DEPTH + 4);

    until(&setup.api, "the eviction request", asked).await;
    assert_eq!(asked_pods(&setup.api), ["climber"]);
    assert_eq!(reasons(&setup.api), ["VolumeOverflow"]);
    let note = setup.api.lock().unwrap().events[0]["note"].to_string();
    assert!(
        note.contains("cannot be measured")
            && note.contains(&format!("more than {MAX_DEPTH} levels deep"))
            && note.contains("the controller evicts shop/climber"),
        "{note}"
    );
    assert!(
        driver.log_text().contains("cannot be measured"),
        "the log says why"
    );
    // Kubelet's volume health says so too, and so does ControllerGetVolume (no walk there:
    // the failure is remembered).
    let condition = measure(driver, &volume, &target).await;
    assert!(
        condition.abnormal && condition.message.contains("not measured"),
        "{condition:?}"
    );
    let got = driver.get_volume(&volume.volume_id).await.unwrap();
    let condition = got.status.unwrap().volume_condition.unwrap();
    assert!(
        condition.abnormal && condition.message.contains("cannot be measured"),
        "{condition:?}"
    );
    drop(chain);
    driver.unpublish_ok(&volume, &target).await;
}

/// Writes a 4 KiB file `name` into `dir` from the pod's namespace; the error's errno, if any.
fn pod_write(pod: &common::namespace::OtherNode, dir: &Path, name: &str) -> Option<i32> {
    let file = dir.join(name);
    pod.run(move || {
        fs::write(&file, [0x5a; 4096])
            .err()
            .and_then(|e| e.raw_os_error())
    })
}

fn host_write(dir: &Path, name: &str) -> Option<i32> {
    fs::write(dir.join(name), [0x5a; 4096])
        .err()
        .and_then(|e| e.raw_os_error())
}

/// A pod whose eviction a PodDisruptionBudget always refuses goes on writing only for the
/// grace: then the volume's mounts are read-only, kubelet's target and the copy in the pod's own
/// mount namespace (which a remount of the target does not reach) alike, and so is a new
/// publication. An admin's unfence gives a fresh grace; an expansion that makes the volume fit
/// lifts the fence, and the pod writes again.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_no_eviction_can_remove_is_fenced_read_only_after_its_grace() {
    let setup = start(&["--overflow-fence-after".into(), "2".into()]).await;
    let driver = &setup.driver;
    let volume = volume_of_claim(&setup, "hog", &[]).await;
    let target = publish_for_pod(driver, &volume, "stubborn").await;
    // The container's mount namespace: a private copy holding its own mount of the target.
    let pod = common::namespace::OtherNode::private_copy();
    assert_eq!(pod_write(&pod, &target, "before"), None);
    // A second container of the pod keeps a file open for writing: the kernel will not make its
    // mount read-only while it does.
    let script = format!(
        "exec 3>>{}/held && echo ready && exec sleep 600",
        target.display()
    );
    let mut holder = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("unshare(1)");
    let mut ready = [0u8; 6];
    std::io::Read::read_exact(holder.stdout.as_mut().unwrap(), &mut ready).unwrap();
    write(&target, "big", 2 * SIZE);
    measure(driver, &volume, &target).await;
    until(&setup.api, "the fence's event", |api| {
        api.events.iter().any(|e| e["reason"] == "OverflowFenced")
    })
    .await;
    assert_eq!(
        pod_write(&pod, &target, "after"),
        Some(libc::EROFS),
        "the pod's own mount"
    );
    assert_eq!(
        host_write(&target, "after"),
        Some(libc::EROFS),
        "kubelet's target"
    );
    assert!(fs::read(target.join("big")).is_ok(), "reads go on");
    let note = setup.api.lock().unwrap().events.last().unwrap()["note"].to_string();
    assert!(
        note.contains("fenced read-only") && note.contains("expand the claim"),
        "{note}"
    );
    assert!(
        note.contains(
            "1 processes of containers that kept files open for writing on it were stopped"
        ),
        "{note}"
    );
    let status = holder.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL),
        "the writing container stopped"
    );
    let condition = measure(driver, &volume, &target).await;
    assert!(
        condition.abnormal && condition.message.contains("fenced read-only"),
        "{condition:?}"
    );
    let fenced = || {
        driver
            .scrape()
            .value("stickyvol_fenced_volumes", &[("cause", "overflow")])
    };
    assert_eq!(fenced(), 1.0);
    // A pod that mounts it now gets it read-only, whatever it asks.
    let second = publish_for_pod(driver, &volume, "newcomer").await;
    assert_eq!(host_write(&second, "new"), Some(libc::EROFS));

    // The admin lifts it: writable at once, fenced again after a fresh grace.
    let lifted = stickyvol::admin_api::admin_client::AdminClient::new(driver.admin_channel().await)
        .unfence_volume(stickyvol::admin_api::UnfenceVolumeRequest {
            volume_id: volume.volume_id.clone(),
        })
        .await
        .expect("UnfenceVolume")
        .into_inner();
    assert!(
        lifted.was_fenced && lifted.mounts_writable >= 2,
        "{lifted:?}"
    );
    let unfenced_at = Instant::now();
    assert_eq!(
        pod_write(&pod, &target, "window"),
        None,
        "writable after unfence"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while pod_write(&pod, &target, "window") != Some(libc::EROFS) {
        assert!(Instant::now() < deadline, "not fenced again");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        unfenced_at.elapsed() >= Duration::from_secs(2),
        "a fresh grace, not fenced again at once"
    );

    // The claim grows past what the volume holds: the fence lifts.
    driver
        .expand(expand_request(&volume.volume_id, &target, 8 * SIZE, 0))
        .await
        .expect("NodeExpandVolume");
    until(&setup.api, "the fence lifted", |api| {
        api.events
            .iter()
            .any(|e| e["reason"] == "OverflowFenceLifted")
    })
    .await;
    assert_eq!(
        pod_write(&pod, &target, "again"),
        None,
        "the pod writes again"
    );
    assert_eq!(fenced(), 0.0);
    assert_eq!(host_write(&target, "again"), None);
    let condition = measure(driver, &volume, &target).await;
    assert!(!condition.abnormal, "{condition:?}");
    drop(pod);
    driver.unpublish_ok(&volume, &second).await;
    driver.unpublish_ok(&volume, &target).await;
}

/// Space that no walk sees still counts: a pod that writes through a file it unlinked and keeps
/// open is found above its size and evicted, the Event saying what the deleted files hold.
#[tokio::test(flavor = "multi_thread")]
async fn bytes_a_pod_keeps_in_unlinked_open_files_count_against_its_volume() {
    use std::io::Write;
    let setup = start(&[]).await;
    let driver = &setup.driver;
    let volume = volume_of_claim(&setup, "ghost", &[]).await;
    let target = publish_for_pod(driver, &volume, "ghostwriter").await;
    let mut hidden = fs::File::create(target.join("hidden")).unwrap();
    fs::remove_file(target.join("hidden")).unwrap();
    hidden.write_all(&vec![0x5a; 2 * SIZE as usize]).unwrap();
    hidden.sync_all().unwrap();
    let condition = measure(driver, &volume, &target).await;
    assert!(!condition.abnormal, "the walk sees nothing: {condition:?}");
    until(&setup.api, "the eviction request", asked).await;
    assert_eq!(asked_pods(&setup.api), ["ghostwriter"]);
    let note = setup.api.lock().unwrap().events[0]["note"].to_string();
    assert!(
        note.contains("in deleted files its pods keep open"),
        "{note}"
    );
    drop(hidden);
    driver.unpublish_ok(&volume, &target).await;
}
