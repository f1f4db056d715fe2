//! Latency samples per RPC, their summary (exact percentiles from the full sorted sample), and
//! the report as a table or as JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;
use tonic::Status;

/// How many error messages are kept per RPC (the count covers all of them).
const ERROR_SAMPLES: usize = 5;

/// The calls we make, plus the derived per-cycle sums `Attach` (stage + publish) and `Detach`
/// (unpublish + unstage).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rpc {
    GetPluginInfo,
    GetPluginCapabilities,
    ControllerGetCapabilities,
    NodeGetCapabilities,
    NodeGetInfo,
    Probe,
    GetCapacity,
    /// GET /metrics (not gRPC).
    MetricsScrape,
    CreateVolume,
    ControllerPublishVolume,
    NodeStageVolume,
    NodePublishVolume,
    NodeGetVolumeStats,
    NodeUnpublishVolume,
    NodeUnstageVolume,
    ControllerUnpublishVolume,
    ControllerModifyVolume,
    DeleteVolume,
    CreateVolumeGroupSnapshot,
    DeleteVolumeGroupSnapshot,
    Attach,
    Detach,
}

impl Rpc {
    pub fn name(self) -> &'static str {
        match self {
            Rpc::GetPluginInfo => "GetPluginInfo",
            Rpc::GetPluginCapabilities => "GetPluginCapabilities",
            Rpc::ControllerGetCapabilities => "ControllerGetCapabilities",
            Rpc::NodeGetCapabilities => "NodeGetCapabilities",
            Rpc::NodeGetInfo => "NodeGetInfo",
            Rpc::Probe => "Probe",
            Rpc::GetCapacity => "GetCapacity",
            Rpc::MetricsScrape => "GET /metrics",
            Rpc::CreateVolume => "CreateVolume",
            Rpc::ControllerPublishVolume => "ControllerPublishVolume",
            Rpc::NodeStageVolume => "NodeStageVolume",
            Rpc::NodePublishVolume => "NodePublishVolume",
            Rpc::NodeGetVolumeStats => "NodeGetVolumeStats",
            Rpc::NodeUnpublishVolume => "NodeUnpublishVolume",
            Rpc::NodeUnstageVolume => "NodeUnstageVolume",
            Rpc::ControllerUnpublishVolume => "ControllerUnpublishVolume",
            Rpc::ControllerModifyVolume => "ControllerModifyVolume",
            Rpc::DeleteVolume => "DeleteVolume",
            Rpc::CreateVolumeGroupSnapshot => "CreateVolumeGroupSnapshot",
            Rpc::DeleteVolumeGroupSnapshot => "DeleteVolumeGroupSnapshot",
            Rpc::Attach => "attach(stage+publish)",
            Rpc::Detach => "detach(unpublish+unstage)",
        }
    }

    fn is_derived(self) -> bool {
        matches!(self, Rpc::Attach | Rpc::Detach)
    }
}

/// One failed call, as the driver answered it.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorSample {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Default, Clone)]
struct Samples {
    /// Latencies of successful calls, µs.
    ok_micros: Vec<u64>,
    errors: u64,
    error_samples: Vec<ErrorSample>,
}

/// Latencies and errors per RPC. Each task keeps its own; they are merged at the end, so
/// recording never takes a lock.
#[derive(Debug, Default, Clone)]
pub struct Recorder {
    by_rpc: BTreeMap<Rpc, Samples>,
}

impl Recorder {
    pub fn record(&mut self, rpc: Rpc, elapsed: Duration, error: Option<&Status>) {
        let samples = self.by_rpc.entry(rpc).or_default();
        match error {
            None => samples.ok_micros.push(elapsed.as_micros() as u64),
            Some(status) => {
                samples.errors += 1;
                if samples.error_samples.len() < ERROR_SAMPLES {
                    samples.error_samples.push(ErrorSample {
                        code: format!("{:?}", status.code()),
                        message: status.message().to_string(),
                    });
                }
            }
        }
    }

    /// A derived per-cycle figure (e.g. attach = stage + publish), only for complete successes.
    pub fn record_derived(&mut self, rpc: Rpc, total: Duration) {
        self.record(rpc, total, None);
    }

    pub fn merge(&mut self, other: Recorder) {
        for (rpc, theirs) in other.by_rpc {
            let ours = self.by_rpc.entry(rpc).or_default();
            ours.ok_micros.extend(theirs.ok_micros);
            ours.errors += theirs.errors;
            for sample in theirs.error_samples {
                if ours.error_samples.len() < ERROR_SAMPLES {
                    ours.error_samples.push(sample);
                }
            }
        }
    }

    /// Failed calls (derived figures never fail).
    pub fn errors(&self) -> u64 {
        self.by_rpc.values().map(|s| s.errors).sum()
    }

    pub fn summary(&self) -> BTreeMap<&'static str, RpcSummary> {
        self.by_rpc
            .iter()
            .map(|(rpc, samples)| (rpc.name(), RpcSummary::of(*rpc, samples)))
            .collect()
    }

    /// The summaries in call order, for the table.
    fn ordered(&self) -> Vec<(Rpc, RpcSummary)> {
        self.by_rpc
            .iter()
            .map(|(rpc, samples)| (*rpc, RpcSummary::of(*rpc, samples)))
            .collect()
    }
}

/// Per RPC: calls, failures, and latency of the successful calls from the full sorted sample.
#[derive(Debug, Clone, Serialize)]
pub struct RpcSummary {
    /// Calls made (successful + failed).
    pub count: u64,
    pub errors: u64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    pub mean_us: u64,
    /// True for figures summed per cycle rather than measured as one call.
    pub derived: bool,
    pub error_samples: Vec<ErrorSample>,
}

impl RpcSummary {
    fn of(rpc: Rpc, samples: &Samples) -> RpcSummary {
        let mut sorted = samples.ok_micros.clone();
        sorted.sort_unstable();
        let mean = if sorted.is_empty() {
            0
        } else {
            sorted.iter().sum::<u64>() / sorted.len() as u64
        };
        RpcSummary {
            count: sorted.len() as u64 + samples.errors,
            errors: samples.errors,
            p50_us: percentile(&sorted, 50.0),
            p90_us: percentile(&sorted, 90.0),
            p99_us: percentile(&sorted, 99.0),
            max_us: sorted.last().copied().unwrap_or(0),
            mean_us: mean,
            derived: rpc.is_derived(),
            error_samples: samples.error_samples.clone(),
        }
    }
}

/// Nearest-rank percentile of a sorted sample (0 for an empty one).
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Median of an unsorted sample (lower middle for an even count).
pub fn median(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    percentile(&sorted, 50.0)
}

/// The driver's memory, from /proc/<pid>/status, KiB.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Memory {
    pub pid: Option<u32>,
    /// VmRSS just after the driver was ready, before any work.
    pub idle_rss_kib: Option<u64>,
    /// VmRSS after the preload.
    pub after_preload_rss_kib: Option<u64>,
    /// VmRSS after the measurement.
    pub end_rss_kib: Option<u64>,
    /// VmHWM (peak RSS) at the end of the measurement.
    pub peak_rss_kib: Option<u64>,
}

/// A phase's calls: the preload or the final cleanup.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub volumes: usize,
    pub wall_time_s: f64,
    pub rpcs: BTreeMap<&'static str, RpcSummary>,
}

impl Phase {
    pub fn new(volumes: usize, wall: Duration, recorder: &Recorder) -> Phase {
        Phase {
            volumes,
            wall_time_s: wall.as_secs_f64(),
            rpcs: recorder.summary(),
        }
    }
}

/// One line per RPC.
pub fn table(recorder: &Recorder) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<28} {:>7} {:>6} {:>9} {:>9} {:>9} {:>9}",
        "rpc", "count", "errors", "p50 µs", "p90 µs", "p99 µs", "max µs"
    );
    for (rpc, s) in recorder.ordered() {
        let _ = writeln!(
            out,
            "{:<28} {:>7} {:>6} {:>9} {:>9} {:>9} {:>9}",
            rpc.name(),
            s.count,
            s.errors,
            s.p50_us,
            s.p90_us,
            s.p99_us,
            s.max_us
        );
    }
    out
}

/// The first error messages of every RPC that failed, for the human report.
/// A report's last part: "errors:" and `lines` beneath it, or nothing when there are none.
pub fn errors_section(lines: &str) -> String {
    match lines.is_empty() {
        true => String::new(),
        false => format!("errors:\n{lines}"),
    }
}

pub fn error_lines(recorder: &Recorder) -> String {
    let mut out = String::new();
    for (rpc, s) in recorder.ordered() {
        for sample in &s.error_samples {
            let _ = writeln!(out, "  {}: {}: {}", rpc.name(), sample.code, sample.message);
        }
        if s.errors > s.error_samples.len() as u64 {
            let _ = writeln!(
                out,
                "  {}: … and {} more",
                rpc.name(),
                s.errors - s.error_samples.len() as u64
            );
        }
    }
    out
}

/// The same lines from summaries (a report's `rpcs`).
pub fn error_lines_of(summaries: &BTreeMap<&'static str, RpcSummary>) -> String {
    let mut out = String::new();
    for (rpc, s) in summaries {
        for sample in &s.error_samples {
            let _ = writeln!(out, "  {rpc}: {}: {}", sample.code, sample.message);
        }
    }
    out
}

pub fn kib(value: Option<u64>) -> String {
    value.map_or_else(|| "-".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let sorted: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&sorted, 50.0), 50);
        assert_eq!(percentile(&sorted, 90.0), 90);
        assert_eq!(percentile(&sorted, 99.0), 99);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
        assert_eq!(median(&[3, 1, 2]), 2);
    }

    #[test]
    fn merged_recorders_count_calls_and_errors() {
        let mut a = Recorder::default();
        a.record(Rpc::CreateVolume, Duration::from_micros(10), None);
        let mut b = Recorder::default();
        b.record(Rpc::CreateVolume, Duration::from_micros(30), None);
        b.record(
            Rpc::CreateVolume,
            Duration::from_micros(5),
            Some(&Status::resource_exhausted("full")),
        );
        a.merge(b);
        let summary = &a.summary()["CreateVolume"];
        assert_eq!((summary.count, summary.errors), (3, 1));
        assert_eq!((summary.p50_us, summary.max_us), (10, 30));
        assert_eq!(summary.error_samples[0].code, "ResourceExhausted");
        assert_eq!(a.errors(), 1);
    }
}
