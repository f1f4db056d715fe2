//! `stickyvol-bench guard`: the speed guard CI runs (docs/performance.md, "The guard in CI").
//!
//! Each round times the floor (`floor`) on the driver's filesystem, then runs `lifecycle` with
//! the driver started afresh; each figure is the median over rounds of a p50 divided by what
//! that call cannot avoid on this machine (`floor_of`). Rounds alternate floor and driver so
//! that a slow spell of the disk touches both. A figure behind its baseline is measured again
//! over as many rounds more, and judged on all of them: a real slowdown shows in both halves,
//! a noisy spell of a shared machine seldom does.

mod baseline;
mod floor;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::cli::GuardArgs;
use crate::report::median;
use crate::workload::{self, Fatal, LifecycleReport};
use baseline::{Baseline, Comparison};
use floor::Floor;

/// Samples of each floor measurement per round.
const FLOOR_SAMPLES: usize = 200;
/// The calls whose p50 is guarded, when the driver makes them.
const GUARDED_CALLS: [&str; 6] = [
    "CreateVolume",
    "NodeStageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeUnstageVolume",
    "DeleteVolume",
];

#[derive(Debug, Serialize)]
pub struct Round {
    pub floor: Floor,
    pub figures: BTreeMap<String, f64>,
}

#[derive(Debug, Serialize)]
pub struct GuardReport {
    pub workload: &'static str,
    pub rounds: Vec<Round>,
    /// Per figure, the median over rounds.
    pub figures: BTreeMap<String, f64>,
    pub tolerance: f64,
    /// Empty when the baseline was written instead.
    pub comparisons: Vec<Comparison>,
    pub baseline_written: bool,
    /// Figures that failed the comparison.
    pub failed_figures: Vec<String>,
    pub errors_total: u64,
    pub leftovers: Vec<String>,
}

pub async fn guard(args: &GuardArgs) -> Result<GuardReport, Fatal> {
    if !(0.0..1.0).contains(&args.tolerance) {
        return Err(format!("--tolerance {} is not in [0, 1)", args.tolerance));
    }
    let committed = match args.write_baseline {
        Some(_) => None,
        None => Some(Baseline::read(&args.baseline)?),
    };
    let mut report = GuardReport {
        workload: "guard",
        rounds: Vec::new(),
        figures: BTreeMap::new(),
        tolerance: args.tolerance,
        comparisons: Vec::new(),
        baseline_written: false,
        failed_figures: Vec::new(),
        errors_total: 0,
        leftovers: Vec::new(),
    };
    run_rounds(args, &mut report).await?;
    let Some(committed) = committed else {
        let why = args.write_baseline.as_deref().unwrap_or_default();
        new_baseline(why, &report).write(&args.baseline)?;
        report.baseline_written = true;
        return Ok(report);
    };
    judge(&committed, &mut report);
    if !report.failed_figures.is_empty() {
        eprintln!(
            "guard: {} behind; measuring {} rounds more to tell a slowdown from noise",
            report.failed_figures.join(", "),
            args.rounds
        );
        run_rounds(args, &mut report).await?;
        judge(&committed, &mut report);
    }
    Ok(report)
}

/// `--rounds` more rounds, and the figures again over every round so far.
async fn run_rounds(args: &GuardArgs, report: &mut GuardReport) -> Result<(), Fatal> {
    for _ in 0..args.rounds {
        eprintln!("guard: round {}", report.rounds.len() + 1);
        let floor = floor::measure(&args.floor_dir, FLOOR_SAMPLES)
            .map_err(|err| format!("timing the floor in {}: {err}", args.floor_dir.display()))?;
        let run = workload::lifecycle(&args.lifecycle()).await?;
        report.errors_total += run.errors_total;
        report.leftovers.extend(run.leftovers.iter().cloned());
        report.rounds.push(Round {
            figures: figures_of(&run, &floor),
            floor,
        });
    }
    report.figures = medians(&report.rounds);
    Ok(())
}

fn judge(committed: &Baseline, report: &mut GuardReport) {
    report.comparisons = baseline::compare(&committed.figures, &report.figures, report.tolerance);
    report.failed_figures = report
        .comparisons
        .iter()
        .filter(|c| c.verdict.fails())
        .map(|c| c.figure.clone())
        .collect();
}

/// What `figure` is divided by, µs: the flushes, mounts and round trips its call cannot avoid
/// (a whole cycle: two flushes, two mount operations, a round trip per call). Never 0. An
/// unmount counts as a mount: its own time is bimodal here (5 µs, or 30–60 µs while the other
/// core is busy: the kernel waits for an RCU grace period), which would move the unit of a
/// call that spends a fraction of its time unmounting.
fn floor_of(figure: &str, f: &Floor) -> u64 {
    let wake = f.round_trip_us;
    let mount = f.bind_mount_us;
    let floor = match figure {
        "CreateVolume" | "DeleteVolume" => f.fdatasync_us + wake,
        "NodePublishVolume" | "NodeUnpublishVolume" => mount + wake,
        "cycle" => 2 * f.fdatasync_us + 2 * mount + 6 * wake,
        _ => wake,
    };
    floor.max(1)
}

/// A round's figures: each guarded call's p50 and a whole cycle's time over its floor, and
/// the driver's peak RSS in MiB.
fn figures_of(run: &LifecycleReport, floor: &Floor) -> BTreeMap<String, f64> {
    let over_floor = |figure: &str, us: f64| us / floor_of(figure, floor) as f64;
    let mut figures = BTreeMap::new();
    for call in GUARDED_CALLS {
        if let Some(calls) = run.rpcs.get(call).filter(|s| s.count > s.errors) {
            figures.insert(call.to_string(), over_floor(call, calls.p50_us as f64));
        }
    }
    if run.cycles_per_s > 0.0 {
        figures.insert("cycle".into(), over_floor("cycle", 1e6 / run.cycles_per_s));
    }
    if let Some(peak) = run.memory.peak_rss_kib {
        figures.insert("peak_rss_mib".into(), peak as f64 / 1024.0);
    }
    figures
}

fn medians(rounds: &[Round]) -> BTreeMap<String, f64> {
    let mut values: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for round in rounds {
        for (name, value) in &round.figures {
            values.entry(name.clone()).or_default().push(*value);
        }
    }
    values
        .into_iter()
        .map(|(name, mut v)| {
            v.sort_by(f64::total_cmp);
            (name, v[(v.len() - 1) / 2])
        })
        .collect()
}

fn new_baseline(why: &str, report: &GuardReport) -> Baseline {
    let floors = |pick: fn(&Floor) -> u64| {
        median(
            &report
                .rounds
                .iter()
                .map(|r| pick(&r.floor))
                .collect::<Vec<_>>(),
        )
    };
    Baseline {
        why: why.to_string(),
        floor_us: [
            ("fdatasync".to_string(), floors(|f| f.fdatasync_us)),
            ("bind_mount".to_string(), floors(|f| f.bind_mount_us)),
            ("unmount".to_string(), floors(|f| f.unmount_us)),
            ("round_trip".to_string(), floors(|f| f.round_trip_us)),
        ]
        .into(),
        figures: report
            .figures
            .iter()
            .map(|(k, v)| (k.clone(), (v * 1000.0).round() / 1000.0))
            .collect(),
    }
}

pub fn text(r: &GuardReport) -> String {
    let mut out = String::new();
    for (i, round) in r.rounds.iter().enumerate() {
        let f = &round.floor;
        let _ = writeln!(
            out,
            "round {}: fdatasync {} µs, bind mount {} µs, unmount {} µs, round trip {} µs",
            i + 1,
            f.fdatasync_us,
            f.bind_mount_us,
            f.unmount_us,
            f.round_trip_us
        );
    }
    if r.baseline_written {
        out += "baseline written:\n";
        for (name, value) in &r.figures {
            let _ = writeln!(out, "  {name:<22} {value:>8.3}");
        }
        return out;
    }
    let _ = writeln!(
        out,
        "{:<22} {:>9} {:>9}  verdict (tolerance {:.0}%)",
        "figure",
        "baseline",
        "measured",
        r.tolerance * 100.0
    );
    for c in &r.comparisons {
        let base = c.baseline.map_or_else(|| "-".into(), |b| format!("{b:.3}"));
        let _ = writeln!(
            out,
            "{:<22} {base:>9} {:>9.3}  {:?}",
            c.figure, c.measured, c.verdict
        );
    }
    if r.failed_figures.is_empty() {
        out += "guard: every figure within its baseline\n";
    } else {
        let _ = writeln!(
            out,
            "guard: FAILED: {} (a real gain or a deliberate cost: run again with \
             --write-baseline WHY and add WHY to CHANGELOG.md)",
            r.failed_figures.join(", ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(figures: &[(&str, f64)]) -> Round {
        Round {
            floor: Floor {
                fdatasync_us: 1,
                bind_mount_us: 1,
                unmount_us: 1,
                round_trip_us: 1,
            },
            figures: figures.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    #[test]
    fn a_figure_is_the_median_of_its_rounds() {
        let rounds = [
            round(&[("a", 3.0), ("b", 1.0)]),
            round(&[("a", 1.0)]),
            round(&[("a", 9.0), ("b", 2.0)]),
        ];
        let m = medians(&rounds);
        assert_eq!(m["a"], 3.0);
        assert_eq!(m["b"], 1.0);
    }
}
