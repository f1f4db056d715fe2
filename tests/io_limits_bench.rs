//! `stickyvol-bench io-limits` against the real driver, with real cgroups (v1's blkio here,
//! v2's io.max in the project's VM) and real loop devices: its report is whole and it leaves
//! nothing behind (volumes, records, mounts, loop devices, kubelet directories, cgroups).
//!
//! The smoke test runs short and holds the limit loosely (the throttle lets a short burst
//! through, which weighs on a 1 s run). The measurement itself (issue 45: 200 write IOPS held
//! to 210, the neighbour keeping 90% of its rate, before and after a change of class) is
//! `#[ignore]`d, as it takes minutes and wants a quiet machine:
//!   cargo test --release --locked --test io_limits_bench -- --ignored --nocapture
//!   tests/vm/run-tests io_limits_bench -- --ignored --nocapture     (cgroup v2)

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;
use serde_json::Value;
use stickyvol::host::blkio;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Runs `io-limits` with `flags` against a driver it starts itself; its output.
async fn bench(driver: &TestDriver, flags: &[&str]) -> Output {
    let mut args: Vec<String> = [
        "io-limits",
        "--endpoint",
        &format!("unix://{}", driver.socket.display()),
        "--kubelet-dir",
        &path_str(&driver.kubelet),
        "--cgroup-root",
        CGROUP_ROOT,
        "--json",
    ]
    .map(String::from)
    .to_vec();
    args.extend(flags.iter().map(|f| f.to_string()));
    args.extend(["--driver-cmd".to_string(), driver.shell_command()]);
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_stickyvol-bench"))
            .args(&args)
            .output()
            .expect("running stickyvol-bench")
    })
    .await
    .expect("bench task")
}

/// The JSON report; the tool's stderr in the panic message when there is none.
fn report(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}); status {}; stderr:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// None (the test skipped) when this kernel has no IO controller.
fn io_hierarchy() -> Option<std::path::PathBuf> {
    match blkio::io_hierarchy(Path::new(CGROUP_ROOT)) {
        Some((_, base)) => Some(base),
        None => {
            skip::skip("cgroup-io", "no cgroup hierarchy with the IO controller");
            None
        }
    }
}

/// The run's cgroups (`stickyvol-bench-*` below the hierarchy) still there.
fn bench_cgroups(base: &Path) -> Vec<String> {
    (dir_names(base).into_iter())
        .filter(|name| name.starts_with("stickyvol-bench-"))
        .collect()
}

async fn assert_nothing_left(driver: &mut TestDriver, base: &Path, before: &[String]) {
    assert_eq!(driver.data_entries(), Vec::<String>::new(), "volume data");
    assert_eq!(
        driver.state_entries().await,
        Vec::<String>::new(),
        "records"
    );
    assert_eq!(driver.mounts_left(), Vec::<std::path::PathBuf>::new());
    assert!(driver.loop_devices_left().is_empty(), "loop devices left");
    assert_eq!(dir_names(&driver.kubelet), Vec::<String>::new(), "kubelet");
    assert_eq!(bench_cgroups(base), before, "cgroups left");
}

/// Every phase of every kind, as one line for the test's output.
fn phase_lines(report: &Value) -> Vec<String> {
    let mut lines = Vec::new();
    for kind in report["kinds"].as_array().expect("kinds") {
        for phase in kind["phases"].as_array().expect("phases") {
            lines.push(format!(
                "{} {} writeIOPS={} (cgroup {}): limited {:.1} IOPS (bound {:.1}); neighbour alone {:.1} (before {:.1}, after {:.1}), beside {:.1}: {:.1}%",
                kind["kind"].as_str().unwrap(),
                if phase["changed"] == true { "changed to" } else { "created with" },
                phase["write_iops"],
                phase["write_iops_in_cgroup"],
                phase["limited"]["iops"].as_f64().unwrap(),
                phase["limited_bound"].as_f64().unwrap(),
                phase["neighbour_alone_iops"].as_f64().unwrap(),
                phase["neighbour_alone_before"]["iops"].as_f64().unwrap(),
                phase["neighbour_alone_after"]["iops"].as_f64().unwrap(),
                phase["neighbour"]["iops"].as_f64().unwrap(),
                phase["neighbour_share"].as_f64().unwrap() * 100.0,
            ));
        }
    }
    lines
}

/// Both kinds were measured in both classes, each limit was found in the writer's cgroup, and
/// every call was made once per volume (twice for CreateVolume and the rest: two volumes).
fn assert_whole(report: &Value, limits: [u64; 2]) {
    assert_eq!(report["workload"], "io-limits");
    assert_eq!(report["errors_total"], 0, "{report:#}");
    let kinds = report["kinds"].as_array().unwrap();
    let names: Vec<&str> = kinds.iter().map(|k| k["kind"].as_str().unwrap()).collect();
    assert_eq!(names, ["block", "image"]);
    for kind in kinds {
        let phases = kind["phases"].as_array().unwrap();
        let seen: Vec<u64> = (phases.iter())
            .map(|p| {
                p["write_iops_in_cgroup"]
                    .as_u64()
                    .expect("a limit in the cgroup")
            })
            .collect();
        assert_eq!(seen, limits, "{kind:#}");
        for phase in phases {
            for side in ["limited", "neighbour", "neighbour_alone_before"] {
                assert!(
                    phase[side]["ops"].as_u64().unwrap() > 0,
                    "{side}: {phase:#}"
                );
            }
        }
    }
    let rpcs = &report["rpcs"];
    for (rpc, count) in [
        ("CreateVolume", 4),
        ("NodePublishVolume", 4),
        ("NodeUnpublishVolume", 4),
        ("DeleteVolume", 4),
        ("ControllerModifyVolume", 2),
    ] {
        assert_eq!(rpcs[rpc]["count"], count, "{rpc}: {rpcs:#}");
        assert_eq!(rpcs[rpc]["errors"], 0, "{rpc}: {rpcs:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_limits_measures_both_kinds_before_and_after_a_change_and_leaves_nothing() {
    let Some(base) = io_hierarchy() else {
        return;
    };
    let before = bench_cgroups(&base);
    let mut driver = TestDriver::prepare(Options::default());
    let flags = [
        "--size",
        "16777216",
        "--runtime",
        "1s",
        "--write-iops",
        "100",
        "--changed-write-iops",
        "150",
        // Loose: a 1 s run lets the throttle's first burst weigh, and the neighbour's rate on
        // a busy test machine is not what this test is about.
        "--limit-slack",
        "0.5",
        "--neighbour-share",
        "0.05",
    ];
    let output = bench(&driver, &flags).await;
    let report = report(&output);
    for line in phase_lines(&report) {
        eprintln!("{line}");
    }
    assert_eq!(
        output.status.code(),
        Some(0),
        "{report:#}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(report["failed_checks"], serde_json::json!([]));
    assert_whole(&report, [100, 150]);
    assert!(!driver.socket.exists(), "the driver did not stop cleanly");
    assert_nothing_left(&mut driver, &base, &before).await;
}

/// Issue 45's measurement, with the tool's defaults (200 write IOPS, then a change to 400;
/// 10 s runs; the limited volume at most 5% above its limit, the neighbour keeping 90%).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes of IO: run with --ignored on a quiet machine"]
async fn a_limited_volume_holds_its_limit_and_its_neighbour_keeps_its_rate() {
    let Some(base) = io_hierarchy() else {
        return;
    };
    let before = bench_cgroups(&base);
    let mut driver = TestDriver::prepare(Options::default());
    let output = bench(&driver, &[]).await;
    let report = report(&output);
    eprintln!("io-limits, cgroup {}:", report["cgroup"]);
    for line in phase_lines(&report) {
        eprintln!("  {line}");
    }
    assert_eq!(report["failed_checks"], serde_json::json!([]), "{report:#}");
    assert_eq!(output.status.code(), Some(0), "{report:#}");
    assert_whole(&report, [200, 400]);
    assert_nothing_left(&mut driver, &base, &before).await;
}
