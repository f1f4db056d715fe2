//! `stickyvol-bench`: a benchmark for any CSI driver, spoken to over its unix socket.
//!
//! Modules: `cli` (flags), `client` (channel, deadlines, capability discovery), `paths`
//! (kubelet's directory layout), `driver_process` (starting, probing, measuring and stopping a
//! driver), `workload` (the lifecycle and startup runs), `blockio` (direct I/O through a
//! published block volume against a plain file), `fsio` (the same in a file on an image
//! volume against one on a directory volume), `statsflood` (NodeGetVolumeStats callers on
//! a volume of many files, with Probe timed), `housekeeping` (the calls of a node's sidecars
//! and of Prometheus while no volume changes, and what they cost in memory), `guard` (CI's speed guard: lifecycle rounds
//! of a reference build and the candidate, in turns), `iolimits` (a VolumeAttributesClass's write IOPS limit on a
//! block and an image volume in pods' cgroups, beside an unlimited neighbour), `groupsnap`
//! (how long a group snapshot holds its members' writers), `report`
//! (samples, percentiles, output);
//! `cluster` is no CSI benchmark: stickyvol's controller and a node plugin against a simulated
//! API server of a big cluster.

mod blockio;
mod cli;
mod client;
mod cluster;
mod driver_process;
mod fsio;
mod groupsnap;
mod guard;
mod housekeeping;
mod iolimits;
mod paths;
mod report;
mod statsflood;
mod workload;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Workload};
use report::kib;

/// Some call failed, or something of ours was left behind.
const EXIT_FAILED_CALLS: u8 = 1;
/// The benchmark could not run (bad flags, no driver, a driver that cannot create volumes).
const EXIT_CANNOT_RUN: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // One client thread by default: the driver under test should get the other cores.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    match cli.workload {
        Workload::Lifecycle(args) => finish(
            runtime.block_on(workload::lifecycle(&args)),
            args.common.json,
        ),
        Workload::Startup(args) => {
            finish(runtime.block_on(workload::startup(&args)), args.common.json)
        }
        Workload::BlockIo(args) => finish(runtime.block_on(blockio::block_io(&args)), args.json),
        Workload::FsIo(args) => finish(runtime.block_on(fsio::fs_io(&args)), args.json),
        Workload::Cluster(args) => finish(runtime.block_on(cluster::cluster(&args)), args.json),
        Workload::Housekeeping(args) => finish(
            runtime.block_on(housekeeping::housekeeping(&args)),
            args.json,
        ),
        Workload::StatsFlood(args) => {
            finish(runtime.block_on(statsflood::stats_flood(&args)), args.json)
        }
        Workload::Guard(args) => {
            finish_checked(runtime.block_on(guard::guard(&args)), args.json, |report| {
                !report.failed_figures.is_empty()
            })
        }
        Workload::IoLimits(args) => finish_checked(
            runtime.block_on(iolimits::io_limits(&args)),
            args.json,
            |report| !report.failed_checks.is_empty(),
        ),
        Workload::GroupSnapshot(args) => finish(
            runtime.block_on(groupsnap::group_snapshot(&args)),
            args.json,
        ),
        Workload::IoWriter(args) => io_writer(&args),
    }
}

/// What every workload's report offers: its text form and what went wrong.
trait Outcome: serde::Serialize {
    fn text(&self) -> String;
    fn errors_total(&self) -> u64;
    fn leftovers(&self) -> &[String];
}

macro_rules! outcome {
    ($report:ty, $text:path) => {
        impl Outcome for $report {
            fn text(&self) -> String {
                $text(self)
            }
            fn errors_total(&self) -> u64 {
                self.errors_total
            }
            fn leftovers(&self) -> &[String] {
                &self.leftovers
            }
        }
    };
}

outcome!(workload::LifecycleReport, lifecycle_text);
outcome!(workload::StartupReport, startup_text);
outcome!(blockio::BlockIoReport, blockio::text);
outcome!(statsflood::StatsFloodReport, statsflood::text);
outcome!(fsio::FsIoReport, fsio::text);
outcome!(housekeeping::HousekeepingReport, housekeeping::text);
outcome!(cluster::ClusterReport, cluster::text);
outcome!(guard::GuardReport, guard::text);
outcome!(iolimits::report::IoLimitsReport, iolimits::report::text);
outcome!(groupsnap::GroupSnapshotReport, groupsnap::text);

/// Prints the report (JSON or text) and turns it into the exit status.
fn finish<R: Outcome>(result: Result<R, workload::Fatal>, json: bool) -> ExitCode {
    let report = match result {
        Ok(report) => report,
        Err(err) => return cannot_run(&err),
    };
    if json {
        print_json(&report);
    } else {
        print!("{}", report.text());
    }
    exit_status(report.errors_total(), report.leftovers())
}

/// As `finish`, and a check the report failed (a figure behind the reference's, a threshold
/// missed) fails too.
fn finish_checked<R: Outcome>(
    result: Result<R, workload::Fatal>,
    json: bool,
    failed: impl Fn(&R) -> bool,
) -> ExitCode {
    let failed = matches!(&result, Ok(report) if failed(report));
    let status = finish(result, json);
    if failed && status == ExitCode::SUCCESS {
        ExitCode::from(EXIT_FAILED_CALLS)
    } else {
        status
    }
}

/// One writer of `io-limits` (a process of its own in a pod's cgroup): its figures as JSON.
fn io_writer(args: &cli::IoWriterArgs) -> ExitCode {
    match iolimits::writer::run(args) {
        Ok(output) => {
            print_json(&output);
            ExitCode::SUCCESS
        }
        Err(err) => cannot_run(&err),
    }
}

fn cannot_run(err: &str) -> ExitCode {
    eprintln!("stickyvol-bench: {err}");
    ExitCode::from(EXIT_CANNOT_RUN)
}

fn exit_status(errors: u64, leftovers: &[String]) -> ExitCode {
    for leftover in leftovers {
        eprintln!("stickyvol-bench: {leftover}");
    }
    if errors > 0 || !leftovers.is_empty() {
        eprintln!(
            "stickyvol-bench: {errors} call(s) failed, {} leftover(s)",
            leftovers.len()
        );
        ExitCode::from(EXIT_FAILED_CALLS)
    } else {
        ExitCode::SUCCESS
    }
}

fn print_json(report: &impl serde::Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(report).expect("reports serialize")
    );
}

fn driver_line(info: &client::DriverInfo) -> String {
    format!(
        "driver {} {} on node {:?}; staging: {}, controller publish: {}, topology: {}\n",
        info.name,
        info.vendor_version,
        info.node_id,
        info.stage_unstage,
        info.controller_publish,
        info.topology
            .as_ref()
            .map_or_else(|| "none".into(), |t| format!("{t:?}")),
    )
}

fn phase_line(label: &str, phase: &Option<report::Phase>) -> String {
    let Some(phase) = phase else {
        return String::new();
    };
    let errors: u64 = phase.rpcs.values().map(|s| s.errors).sum();
    let latencies: Vec<String> = phase
        .rpcs
        .iter()
        .map(|(rpc, s)| format!("{rpc} p50 {} µs", s.p50_us))
        .collect();
    format!(
        "{label}: {} volumes in {:.2} s, {errors} errors ({})\n",
        phase.volumes,
        phase.wall_time_s,
        latencies.join(", "),
    )
}

fn lifecycle_text(r: &workload::LifecycleReport) -> String {
    let mut out = driver_line(&r.driver);
    out += &format!(
        "lifecycle: {} {} volumes of {} bytes, concurrency {}, preload {}\n",
        r.volumes, r.access_type, r.size_bytes, r.concurrency, r.preload
    );
    out += &phase_line("preload", &r.preload_phase);
    out += &report::table(&r.recorder);
    out += &format!(
        "cycles: {} completed, {} failed in {:.3} s: {:.1} cycles/s\n",
        r.cycles_completed, r.cycles_failed, r.wall_time_s, r.cycles_per_s
    );
    out += &phase_line("cleanup", &r.cleanup_phase);
    let m = &r.memory;
    out += &format!(
        "driver RSS (pid {}): idle {}, after preload {}, end {}, peak {}\n",
        m.pid.map_or_else(|| "unknown".into(), |p| p.to_string()),
        kib(m.idle_rss_kib),
        kib(m.after_preload_rss_kib),
        kib(m.end_rss_kib),
        kib(m.peak_rss_kib),
    );
    out += &report::errors_section(&report::error_lines(&r.recorder));
    out
}

fn startup_text(r: &workload::StartupReport) -> String {
    let mut out = driver_line(&r.driver);
    out += &phase_line("preload", &r.preload_phase);
    out += &format!("startup with {} volumes on disk:\n", r.preload);
    for (i, run) in r.runs.iter().enumerate() {
        out += &format!(
            "  run {}: ready after {:.1} ms, RSS {}\n",
            i + 1,
            run.ready_us as f64 / 1e3,
            kib(run.rss_kib)
        );
    }
    out += &format!(
        "median: ready after {:.1} ms, RSS {}\n",
        r.median_ready_us as f64 / 1e3,
        kib(r.median_rss_kib)
    );
    out += &phase_line("cleanup", &r.cleanup_phase);
    out
}
