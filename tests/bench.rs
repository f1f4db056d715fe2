//! `stickyvol-bench` against the real driver: its JSON report counts every call, driver errors
//! make it fail, and it leaves nothing behind (volumes, records, mounts, loop devices, kubelet
//! directories). Speed is what the tool measures, never what these tests assert.

mod common;

use std::process::{Command, Output};

use common::*;
use serde_json::Value;

/// The calls of one volume's cycle of a driver that stages, as the tool makes them.
const CYCLE_CALLS: [&str; 6] = [
    "CreateVolume",
    "NodeStageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeUnstageVolume",
    "DeleteVolume",
];

/// Runs the tool with `args` (off the async runtime) and returns its output.
async fn bench(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_stickyvol-bench"))
            .args(&args)
            .output()
            .expect("running stickyvol-bench")
    })
    .await
    .expect("bench task")
}

/// The flags that point the tool at `driver`'s socket and kubelet directory.
fn target_flags(driver: &TestDriver) -> Vec<String> {
    vec![
        "--endpoint".into(),
        format!("unix://{}", driver.socket.display()),
        "--kubelet-dir".into(),
        path_str(&driver.kubelet),
        "--json".into(),
    ]
}

/// The JSON report on stdout; the tool's stderr in the panic message otherwise.
fn report(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}); status {}; stderr:\n{}\nstdout:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

#[track_caller]
fn assert_exit(output: &Output, code: i32) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "stickyvol-bench stderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Count and errors of `rpc` in a summary map such as `report["rpcs"]`.
#[track_caller]
fn calls(summaries: &Value, rpc: &str) -> (u64, u64) {
    let s = &summaries[rpc];
    assert!(s.is_object(), "no {rpc} in {summaries:#}");
    (s["count"].as_u64().unwrap(), s["errors"].as_u64().unwrap())
}

/// No volume, record, mount, loop device or kubelet directory of ours is left.
async fn assert_nothing_left(driver: &mut TestDriver) {
    assert_eq!(
        driver.data_entries(),
        Vec::<String>::new(),
        "volume data left"
    );
    assert_eq!(
        driver.state_entries().await,
        Vec::<String>::new(),
        "records left"
    );
    assert_eq!(driver.mounts_left(), Vec::<std::path::PathBuf>::new());
    assert!(driver.loop_devices_left().is_empty(), "loop devices left");
    assert_eq!(
        dir_names(&driver.kubelet),
        Vec::<String>::new(),
        "directories left in the kubelet dir"
    );
}

async fn lifecycle_smoke(access_type: &str) {
    let mut driver = TestDriver::start().await;
    let mut args = vec!["lifecycle".to_string()];
    args.extend(target_flags(&driver));
    args.extend(
        [
            "--access-type",
            access_type,
            "--volumes",
            "20",
            "--concurrency",
            "4",
            "--preload",
            "5",
            "--size",
            "1048576",
            "--driver-pid",
        ]
        .map(String::from),
    );
    args.push(driver.pid().to_string());
    let output = bench(args).await;
    assert_exit(&output, 0);
    let report = report(&output);

    assert_eq!(report["access_type"], access_type);
    assert_eq!(report["cycles_completed"], 20);
    assert_eq!(report["cycles_failed"], 0);
    assert_eq!(report["errors_total"], 0);
    assert_eq!(report["driver"]["name"], DRIVER_NAME);
    assert_eq!(report["driver"]["node_id"], NODE_ID);
    // Image volumes stage; directory and block volumes stage nothing, but kubelet (and the
    // tool) call it for every volume of a driver that advertises it.
    assert_eq!(report["driver"]["stage_unstage"], true);
    let rpcs = &report["rpcs"];
    let sums = ["attach(stage+publish)", "detach(unpublish+unstage)"];
    for rpc in CYCLE_CALLS.iter().chain(&sums) {
        assert_eq!(calls(rpcs, rpc), (20, 0), "{rpc}");
        assert!(rpcs[rpc]["p50_us"].as_u64().unwrap() <= rpcs[rpc]["max_us"].as_u64().unwrap());
    }
    assert_eq!(
        calls(&report["preload_phase"]["rpcs"], "CreateVolume"),
        (5, 0)
    );
    assert_eq!(
        calls(&report["cleanup_phase"]["rpcs"], "DeleteVolume"),
        (5, 0)
    );
    let memory = &report["memory"];
    assert_eq!(memory["pid"], driver.pid());
    for field in ["idle_rss_kib", "after_preload_rss_kib", "peak_rss_kib"] {
        assert!(memory[field].as_u64().unwrap() > 0, "{field}: {memory:#}");
    }
    assert_nothing_left(&mut driver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_of_filesystem_volumes_counts_every_call_and_leaves_nothing() {
    lifecycle_smoke("mount").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_of_block_volumes_counts_every_call_and_leaves_nothing() {
    lifecycle_smoke("block").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_is_measured_per_run_with_preloaded_volumes() {
    // Not started: the tool starts (and stops) the driver itself.
    let mut driver = TestDriver::prepare(Options::default());
    let mut args = vec!["startup".to_string()];
    args.extend(target_flags(&driver));
    args.extend(
        [
            "--preload",
            "10",
            "--runs",
            "2",
            "--size",
            "1048576",
            "--driver-cmd",
        ]
        .map(String::from),
    );
    args.push(driver.shell_command());
    let output = bench(args).await;
    assert_exit(&output, 0);
    let report = report(&output);

    assert_eq!(report["errors_total"], 0);
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{report:#}");
    for run in runs {
        assert!(run["ready_us"].as_u64().unwrap() > 0, "{run}");
        assert!(run["rss_kib"].as_u64().unwrap() > 0, "{run}");
    }
    assert!(report["median_ready_us"].as_u64().unwrap() > 0);
    assert_eq!(
        calls(&report["preload_phase"]["rpcs"], "CreateVolume"),
        (10, 0)
    );
    assert_eq!(
        calls(&report["cleanup_phase"]["rpcs"], "DeleteVolume"),
        (10, 0)
    );
    // Every start logged its recovery of the preloaded volumes: preload, 2 runs, cleanup.
    assert_eq!(
        driver.log_text().matches("volume state loaded").count(),
        4,
        "{}",
        driver.log_text()
    );
    assert!(
        !driver.socket.exists(),
        "the last driver did not stop cleanly"
    );
    assert_nothing_left(&mut driver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_errors_are_counted_reported_and_fail_the_run() {
    let mut driver = TestDriver::start().await;
    // More than the data dir's filesystem holds: CreateVolume is RESOURCE_EXHAUSTED.
    let too_big = (filesystem_bytes(&driver.data) * 2).to_string();
    let mut args = vec!["lifecycle".to_string()];
    args.extend(target_flags(&driver));
    args.extend(["--volumes", "3", "--concurrency", "2", "--size"].map(String::from));
    args.push(too_big);
    let output = bench(args).await;
    assert_exit(&output, 1);
    let report = report(&output);

    assert_eq!(report["cycles_completed"], 0);
    assert_eq!(report["cycles_failed"], 3);
    assert_eq!(report["errors_total"], 3);
    let create = &report["rpcs"]["CreateVolume"];
    assert_eq!(calls(&report["rpcs"], "CreateVolume"), (3, 3));
    let samples = create["error_samples"].as_array().unwrap();
    assert_eq!(samples.len(), 3);
    for sample in samples {
        assert_eq!(sample["code"], "ResourceExhausted", "{sample}");
        assert!(!sample["message"].as_str().unwrap().is_empty());
    }
    // Nothing to publish or delete after a failed create.
    assert!(report["rpcs"]["NodePublishVolume"].is_null());
    assert!(report["rpcs"]["DeleteVolume"].is_null());
    assert_nothing_left(&mut driver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_cannot_create_volumes_is_refused() {
    // Node mode serves no Controller service.
    let mut driver = TestDriver::start_with(Options {
        mode: Some("node"),
        ..Default::default()
    })
    .await;
    let mut args = vec!["lifecycle".to_string()];
    args.extend(target_flags(&driver));
    let output = bench(args).await;
    assert_exit(&output, 2);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("CREATE_DELETE_VOLUME"), "{stderr}");
    assert!(output.stdout.is_empty());
    assert_nothing_left(&mut driver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_io_reports_every_case_for_device_and_plain_file_and_leaves_nothing() {
    // Not started: the tool starts (and stops) the driver itself.
    let mut driver = TestDriver::prepare(Options::default());
    // The plain file goes next to the data dir by default (its parent, on the same filesystem).
    let root = driver.data.parent().unwrap().to_path_buf();
    let mut args = vec!["block-io".to_string()];
    args.extend(target_flags(&driver));
    args.extend(["--size", "33554432", "--runtime", "300ms", "--driver-cmd"].map(String::from));
    args.push(driver.shell_command());
    let output = bench(args).await;
    assert_exit(&output, 0);
    let report = report(&output);

    assert_eq!(report["workload"], "block-io");
    assert_eq!(report["errors_total"], 0, "{report:#}");
    assert_eq!(report["size_bytes"], 33554432);
    let device = &report["device"];
    assert!(
        device["device"].as_str().unwrap().starts_with("/dev/loop"),
        "{device:#}"
    );
    assert!(device["size_bytes"].as_u64().unwrap() >= 33554432);
    let plain = report["plain_file"].as_str().unwrap();
    assert!(plain.starts_with(&path_str(&root)), "{plain}");
    let cases = report["cases"].as_array().unwrap();
    let mut names: Vec<&str> = cases.iter().map(|c| c["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "randread-4k-qd1",
            "randread-4k-qd32",
            "randwrite-4k-qd1",
            "randwrite-4k-qd32",
            "seqread-1m-qd1",
            "seqread-1m-qd32",
            "seqwrite-1m-qd1",
            "seqwrite-1m-qd32",
        ]
    );
    for case in cases {
        for side in ["device", "plain_file"] {
            let s = &case[side];
            for field in ["ops", "bytes"] {
                assert!(s[field].as_u64().unwrap() > 0, "{side} {field}: {case:#}");
            }
            for field in ["iops", "mib_per_s", "p50_us", "p99_us", "seconds"] {
                assert!(s[field].as_f64().unwrap() > 0.0, "{side} {field}: {case:#}");
            }
            assert!(s["p50_us"].as_f64().unwrap() <= s["p99_us"].as_f64().unwrap());
            assert_eq!(s["errors"], 0);
        }
        assert!(case["ratio"].as_f64().unwrap() > 0.0, "{case:#}");
    }
    for rpc in [
        "CreateVolume",
        "NodePublishVolume",
        "NodeUnpublishVolume",
        "DeleteVolume",
    ] {
        assert_eq!(calls(&report["rpcs"], rpc), (1, 0), "{rpc}");
    }
    assert!(!driver.socket.exists(), "the driver did not stop cleanly");
    let plain_left: Vec<String> = dir_names(&root)
        .into_iter()
        .filter(|n| n.contains("stickyvol-bench-plain"))
        .collect();
    assert_eq!(
        plain_left,
        Vec::<String>::new(),
        "the plain file was left behind"
    );
    assert_nothing_left(&mut driver).await;
}

#[tokio::test]
async fn fs_io_compares_an_image_volume_with_a_directory_volume_and_leaves_nothing() {
    let mut driver = TestDriver::prepare(Options::default());
    let mut args = vec!["fs-io".to_string()];
    args.extend(target_flags(&driver));
    args.extend(
        [
            "--size",
            "16777216",
            "--fs-type",
            "ext4",
            "--runtime",
            "200ms",
            "--driver-cmd",
        ]
        .map(String::from),
    );
    args.push(driver.shell_command());
    let output = bench(args).await;
    assert_exit(&output, 0);
    let report = report(&output);
    assert_eq!(report["workload"], "fs-io");
    assert_eq!(report["errors_total"], 0, "{report:#}");
    let cases = report["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 8);
    for case in cases {
        for side in ["image", "directory"] {
            assert!(case[side]["ops"].as_u64().unwrap() > 0, "{side}: {case:#}");
            assert_eq!(case[side]["errors"], 0);
        }
    }
    // Both volumes were staged (the image's filesystem mounted) and published, once each.
    for rpc in [
        "CreateVolume",
        "NodeStageVolume",
        "NodePublishVolume",
        "NodeUnstageVolume",
        "DeleteVolume",
    ] {
        assert_eq!(calls(&report["rpcs"], rpc), (2, 0), "{rpc}");
    }
    assert!(!driver.socket.exists(), "the driver did not stop cleanly");
    assert_nothing_left(&mut driver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_flood_times_probe_and_a_bystander_publish_and_leaves_nothing() {
    let mut driver = TestDriver::start().await;
    let mut args = vec!["stats-flood".to_string()];
    args.extend(target_flags(&driver));
    args.extend(
        [
            "--files",
            "1500",
            "--callers",
            "4",
            "--runtime",
            "1200ms",
            "--probe-interval",
            "50ms",
            "--size",
            "16777216",
        ]
        .map(String::from),
    );
    let output = bench(args).await;
    assert_exit(&output, 0);
    let report = report(&output);

    assert_eq!(report["workload"], "stats-flood");
    assert_eq!(report["errors_total"], 0, "{report:#}");
    assert_eq!(report["files"], 1500);
    assert!(report["fill_s"].as_f64().unwrap() > 0.0);
    assert_eq!(calls(&report["idle"], "Probe"), (20, 0));
    let flood = &report["flood"];
    let (stats, _) = calls(flood, "NodeGetVolumeStats");
    assert!(stats >= 4, "{flood:#}");
    let (probes, _) = calls(flood, "Probe");
    assert!(probes >= 2, "{flood:#}");
    // The second volume is published at the start of the flood and then every second.
    let (publishes, _) = calls(flood, "NodePublishVolume");
    assert!(publishes >= 1, "{flood:#}");
    assert_eq!(calls(flood, "NodeUnpublishVolume"), (publishes, 0));
    assert_eq!(calls(&report["setup"], "CreateVolume"), (2, 0));
    assert_eq!(calls(&report["setup"], "DeleteVolume"), (2, 0));
    assert_eq!(report["leftovers"], serde_json::json!([]));
    assert_nothing_left(&mut driver).await;
}

/// `housekeeping` for `runtime` against `driver`, scraping `metrics_address`.
async fn housekeeping(driver: &TestDriver, metrics_address: &str, runtime: &str) -> Output {
    let mut args = vec!["housekeeping".to_string()];
    args.extend(target_flags(driver));
    args.extend(["--metrics-address", metrics_address, "--runtime", runtime].map(String::from));
    bench(args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn housekeeping_makes_each_sidecars_call_and_a_scrape_every_round_and_leaves_nothing() {
    let mut driver = TestDriver::start_with_metrics(Options::default()).await;
    let address = driver.metrics_address().to_string();
    let output = housekeeping(&driver, &address, "600ms").await;
    assert_exit(&output, 0);
    let report = report(&output);

    assert_eq!(report["workload"], "housekeeping");
    assert_eq!(report["errors_total"], 0, "{report:#}");
    assert_eq!(report["metrics_address"], address.as_str());
    let rounds = report["rounds"].as_u64().unwrap();
    assert!(rounds >= 2, "{report:#}");
    let made = &report["calls"];
    // A capacity poll for filesystem volumes and one for block volumes each round.
    assert_eq!(calls(made, "GetCapacity"), (2 * rounds, 0));
    for rpc in [
        "NodeGetCapabilities",
        "NodeGetInfo",
        "Probe",
        "GET /metrics",
    ] {
        assert_eq!(calls(made, rpc), (rounds, 0), "{rpc}");
    }
    assert_eq!(report["leftovers"], serde_json::json!([]));
    assert_nothing_left(&mut driver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn housekeeping_counts_a_failed_scrape_and_fails_the_run() {
    let mut driver = TestDriver::start().await;
    // Nothing serves metrics there: the driver runs without them.
    let nobody = free_local_address().to_string();
    let output = housekeeping(&driver, &nobody, "200ms").await;
    assert_exit(&output, 1);
    let report = report(&output);
    let rounds = report["rounds"].as_u64().unwrap();
    assert_eq!(calls(&report["calls"], "GET /metrics"), (rounds, rounds));
    assert_eq!(calls(&report["calls"], "Probe"), (rounds, 0));
    assert_eq!(report["errors_total"].as_u64(), Some(rounds), "{report:#}");
    assert_nothing_left(&mut driver).await;
}

/// `guard` with `driver`'s flags: `rounds` rounds of 8 cycles of each build, the reference
/// started by `reference`, the candidate by `candidate`; a figure may be 90% behind (the same
/// debug build's p50s over 8 cycles differ by tens of percent between runs).
fn guard_args(driver: &TestDriver, reference: &str, candidate: &str, rounds: &str) -> Vec<String> {
    let mut args = vec!["guard".to_string()];
    args.extend(target_flags(driver));
    args.extend(["--volumes", "8", "--tolerance", "0.9", "--rounds", rounds].map(String::from));
    args.push("--floor-dir".into());
    args.push(path_str(&driver.root));
    args.extend(["--reference-cmd".into(), reference.to_string()]);
    args.extend(["--driver-cmd".into(), candidate.to_string()]);
    args
}

/// A busy loop at normal priority pinned to CPU 0, stopped when dropped.
struct BusyCpu(std::process::Child);

impl BusyCpu {
    fn start() -> BusyCpu {
        let child = Command::new("taskset")
            .args(["-c", "0", "sh", "-c", "while :; do :; done"])
            .spawn()
            .expect("taskset (util-linux) runs");
        BusyCpu(child)
    }
}

impl Drop for BusyCpu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_passes_a_build_against_itself_and_fails_a_slowed_one() {
    // Not started: each round starts (and stops) both builds itself.
    let mut driver = TestDriver::prepare(Options::default());
    let build = driver.shell_command();
    let output = bench(guard_args(&driver, &build, &build, "2")).await;
    assert_exit(&output, 0);
    let same = report(&output);
    assert!(
        same["failed_figures"].as_array().unwrap().is_empty(),
        "{same:#}"
    );
    let rounds = same["rounds"].as_array().unwrap();
    let firsts: Vec<_> = rounds
        .iter()
        .map(|r| r["reference_first"].clone())
        .collect();
    assert_eq!(firsts, [Value::from(true), Value::from(false)], "{same:#}");
    let comparisons = same["comparisons"].as_array().unwrap();
    for figure in CYCLE_CALLS.iter().chain(&["cycle", "peak_rss_mib"]) {
        let compared = comparisons.iter().find(|c| c["figure"] == *figure);
        let ratio = compared.and_then(|c| c["ratio"].as_f64());
        assert!(ratio.is_some_and(|r| r > 0.0), "{figure} in {same:#}");
    }

    // The same build slowed, as a slower change would be: the candidate pinned to CPU 0 at
    // nice 10 beside a busy loop there, so that its wakeups often wait for the loop's time
    // slice (5-9 times slower calls on this 2-core VM; SCHED_IDLE made them 300 times slower,
    // minutes for 8 cycles). Its calls fall far behind; its memory does not.
    let busy = BusyCpu::start();
    let slowed = build.replacen("exec ", "exec taskset -c 0 nice -n 10 ", 1);
    let output = bench(guard_args(&driver, &build, &slowed, "1")).await;
    drop(busy);
    assert_exit(&output, 1);
    let behind = report(&output);
    let failed = behind["failed_figures"].as_array().unwrap();
    for figure in ["NodePublishVolume", "cycle"] {
        assert!(
            failed.contains(&Value::from(figure)),
            "{figure}: {behind:#}"
        );
    }
    assert!(!failed.contains(&Value::from("peak_rss_mib")), "{behind:#}");
    // Behind after the first round, so measured over a second before failing.
    assert_eq!(behind["rounds"].as_array().unwrap().len(), 2, "{behind:#}");
    assert_nothing_left(&mut driver).await;
}

/// The committed figures change only with a CHANGELOG line saying why (`guard
/// --write-baseline WHY` writes WHY into the baseline; this holds the two together).
#[test]
fn the_committed_speed_baseline_says_why_in_the_changelog() {
    let baseline: Value = serde_json::from_str(include_str!("../.ci/bench-baseline.json")).unwrap();
    let why = baseline["why"].as_str().unwrap();
    let reference = baseline["reference"].as_str().unwrap();
    assert!(
        reference.len() == 40 && reference.bytes().all(|b| b.is_ascii_hexdigit()),
        "the reference is a whole commit id, not {reference:?}"
    );
    assert!(
        why.split_whitespace().count() >= 5,
        "a sentence, not {why:?}"
    );
    let changelog = include_str!("../CHANGELOG.md").replace('\n', " ");
    let changelog = changelog.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        changelog.contains(why),
        "CHANGELOG.md does not say why the speed baseline is what it is: {why:?}"
    );
}

/// link/hot-functions.txt, which link/refresh writes and build.rs hands to the linker: one symbol
/// per line, each once, and the code of each of its steps among them (a list of some other binary's, or a
/// probe that ran nothing, would link without a word and cost the memory it is there to save).
#[test]
fn the_hot_function_list_names_each_function_of_a_cycle_once() {
    let list = include_str!("../link/hot-functions.txt");
    let names: Vec<&str> = list.lines().collect();
    assert!(
        names.len() >= 1000,
        "{} names: a cycle runs thousands of functions",
        names.len()
    );
    let mut seen = std::collections::HashSet::new();
    for name in &names {
        assert!(
            !name.is_empty() && !name.contains(char::is_whitespace),
            "not a symbol: {name:?}"
        );
        assert!(seen.insert(*name), "named twice: {name}");
    }
    // A volume's cycle and the gRPC server, the metrics page (housekeeping's scrapes) and the
    // Kubernetes watchers (the cluster step).
    for code in [
        "9stickyvol6volume",
        "5tokio",
        "2h2",
        "5tonic",
        "17prometheus_client",
        "12kube_runtime",
    ] {
        assert!(
            names.iter().any(|name| name.contains(code)),
            "no function of {code} in the list"
        );
    }
}

/// `.ci/speed-guard.sh` in a clone of this repository whose reference is its own HEAD, with a
/// `cargo` on PATH that only says it was asked (so that nothing is built): it builds nothing
/// while the driver's sources are the reference's, and starts building when they differ.
struct GuardClone {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    fake_bin: std::path::PathBuf,
}

impl GuardClone {
    fn new() -> GuardClone {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("clone");
        let git = |args: &[&str], cwd: &std::path::Path| {
            let out = Command::new("git")
                .args(args)
                .current_dir(cwd)
                .output()
                .unwrap();
            assert!(out.status.success(), "git {args:?}: {out:?}");
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        git(
            &["clone", "--quiet", "--shared", ".", root.to_str().unwrap()],
            repo,
        );
        let head = git(&["rev-parse", "HEAD"], &root);
        std::fs::write(
            root.join(".ci/bench-baseline.json"),
            format!("{{\n  \"why\": \"a test\",\n  \"reference\": \"{head}\"\n}}\n"),
        )
        .unwrap();
        let fake_bin = dir.path().join("bin");
        std::fs::create_dir(&fake_bin).unwrap();
        let cargo = fake_bin.join("cargo");
        std::fs::write(&cargo, "#!/bin/sh\necho \"fake cargo $*\"\nexit 3\n").unwrap();
        std::fs::set_permissions(&cargo, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        GuardClone {
            _dir: dir,
            root,
            fake_bin,
        }
    }

    /// Runs the guard; true when it went on to build (the fake cargo's exit status 3).
    fn builds(&self, always: bool) -> bool {
        let path = format!(
            "{}:{}",
            self.fake_bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = Command::new("bash");
        command
            .arg(".ci/speed-guard.sh")
            .current_dir(&self.root)
            .env("PATH", path)
            .env_remove("SPEED_GUARD_ALWAYS");
        if always {
            command.env("SPEED_GUARD_ALWAYS", "1");
        }
        let out = command.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        match out.status.code() {
            Some(0) => {
                assert!(stdout.contains("nothing to compare"), "{out:?}");
                false
            }
            Some(3) => {
                assert!(stdout.contains("fake cargo build --release"), "{out:?}");
                true
            }
            _ => panic!("the guard failed otherwise: {out:?}"),
        }
    }

    fn edit(&self, path: &str, text: &str) {
        std::fs::write(self.root.join(path), text).unwrap();
    }

    /// Runs the guard with a `cargo` whose "builds" are copies of `driver` (a real binary, for
    /// `nm`) and a `stickyvol-bench` that fails at once: the guard's path from its builds to a
    /// failed comparison, in seconds.
    fn fail_after_building(&self, driver: &std::path::Path) -> Output {
        let fake_bin = self.root.join("../building-bin");
        std::fs::create_dir_all(&fake_bin).unwrap();
        let cargo = fake_bin.join("cargo");
        let script = format!(
            "#!/bin/sh\necho \"fake cargo $*\"\nrelease=$CARGO_TARGET_DIR/release\n\
             mkdir -p \"$release\"\ncase \"$*\" in *--lib*) exit 0 ;; esac\n\
             cp {driver} \"$release/stickyvol\"\n\
             printf '#!/bin/sh\\nexit 1\\n' >\"$release/stickyvol-bench\"\n\
             chmod +x \"$release/stickyvol-bench\"\n",
            driver = driver.display()
        );
        std::fs::write(&cargo, script).unwrap();
        std::fs::set_permissions(&cargo, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let path = format!(
            "{}:{}",
            fake_bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Command::new("bash")
            .arg(".ci/speed-guard.sh")
            .current_dir(&self.root)
            .env("PATH", path)
            .env("CARGO_TARGET_DIR", self.root.join("../target"))
            .env_remove("SPEED_GUARD_ALWAYS")
            .output()
            .unwrap()
    }
}

/// A failed guard names the hot-function list's names its build lacks, with the fix, since a
/// few percent of them lost cost megabytes of peak RSS (docs/performance.md); and says nothing
/// of the list when the build has every name.
#[test]
fn a_failed_guard_says_how_many_hot_functions_the_build_lacks() {
    let clone = GuardClone::new();
    let driver = std::env::current_exe().unwrap();
    let nm = Command::new("nm")
        .args(["--defined-only"])
        .arg(&driver)
        .output()
        .unwrap();
    assert!(nm.status.success(), "{nm:?}");
    let mut present: Vec<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2).map(str::to_string))
        .collect();
    present.sort();
    present.dedup();
    present.truncate(4);
    assert_eq!(present.len(), 4, "the test binary has symbols");

    // The guard fails (the bench exits 1) with `list` as link/hot-functions.txt: what it said.
    let failed_with = |list: String| {
        clone.edit("link/hot-functions.txt", &list);
        let out = clone.fail_after_building(&driver);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    // Four of five found: above the 80% the guard refuses outright, so it runs and fails.
    let absent = "_ZN8stickyvol6absent17h0000000000000000E";
    let said = failed_with(format!("{}\n{absent}\n", present.join("\n")));
    assert!(
        said.contains("this build has 4 of the 5 functions"),
        "{said}"
    );
    assert!(
        said.contains("this build lacks 1 of the 5 functions") && said.contains("link/refresh"),
        "{said}"
    );

    let said = failed_with(format!("{}\n", present.join("\n")));
    assert!(
        said.contains("this build has 4 of the 4 functions"),
        "{said}"
    );
    assert!(!said.contains("lacks"), "{said}");
}

#[test]
fn the_guard_builds_nothing_only_while_the_drivers_sources_are_the_references() {
    let clone = GuardClone::new();
    assert!(!clone.builds(false), "same sources: nothing to build");
    assert!(clone.builds(true), "SPEED_GUARD_ALWAYS=1 compares anyway");

    // The bench tool and the docs are not the driver.
    clone.edit("src/bench/extra_note.txt", "not the driver\n");
    clone.edit("docs/extra_note.txt", "not the driver\n");
    assert!(
        !clone.builds(false),
        "a change outside the driver's sources"
    );

    // A new file in the driver's sources, even one git does not track yet.
    clone.edit("src/extra.rs", "// new\n");
    assert!(clone.builds(false), "an untracked source file");
    std::fs::remove_file(clone.root.join("src/extra.rs")).unwrap();

    // A changed tracked source, and the list of hot functions.
    let lib = std::fs::read_to_string(clone.root.join("src/lib.rs")).unwrap();
    clone.edit("src/lib.rs", &format!("{lib}// changed\n"));
    assert!(clone.builds(false), "a changed source");
    clone.edit("src/lib.rs", &lib);
    assert!(!clone.builds(false), "the change undone");
    let hot = std::fs::read_to_string(clone.root.join("link/hot-functions.txt")).unwrap();
    clone.edit("link/hot-functions.txt", &format!("{hot}_ZN5extra\n"));
    assert!(clone.builds(false), "a changed hot-function list");
}
