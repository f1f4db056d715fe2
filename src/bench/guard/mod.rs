//! `stickyvol-bench guard`: the speed guard CI runs (docs/performance.md, "The guard in CI").
//!
//! Two builds on one machine: each round runs `lifecycle` against the reference build (the
//! commit `.ci/bench-baseline.json` names) and against the candidate, each started afresh, in
//! an order that alternates from round to round, and times the floor (`floor`) for the reader.
//! Each figure is the median over rounds of the candidate's p50 over the reference's of the
//! same round: a slower disk, kernel or CPU moves both builds alike. (Dividing by a flush and
//! a round trip instead did not hold: the same code measured 40% behind on another machine
//! type, because CPU-bound calls and syscalls do not scale together.) A figure behind is
//! measured again over as many rounds more, and judged on all of them: a real slowdown shows in
//! both halves, a noisy spell of a shared machine seldom does.

mod compare;
mod floor;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::cli::GuardArgs;
use crate::workload::{self, Fatal, LifecycleReport};
use compare::Comparison;
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

/// Figure name → value: a call's p50 or a cycle's time in µs, or the peak RSS in MiB.
type Figures = BTreeMap<String, f64>;

#[derive(Debug, Serialize)]
pub struct Round {
    pub floor: Floor,
    pub reference_first: bool,
    pub reference: Figures,
    pub candidate: Figures,
    /// Candidate over reference, for the figures both measured.
    pub ratios: Figures,
}

#[derive(Debug, Serialize)]
pub struct GuardReport {
    pub workload: &'static str,
    pub rounds: Vec<Round>,
    pub tolerance: f64,
    /// Per figure: both builds' medians over rounds, and the median of the rounds' ratios.
    pub comparisons: Vec<Comparison>,
    /// Figures that failed the comparison.
    pub failed_figures: Vec<String>,
    pub errors_total: u64,
    pub leftovers: Vec<String>,
}

pub async fn guard(args: &GuardArgs) -> Result<GuardReport, Fatal> {
    if !(0.0..1.0).contains(&args.tolerance) {
        return Err(format!("--tolerance {} is not in [0, 1)", args.tolerance));
    }
    if args.driver.driver_cmd.is_none() {
        return Err("--driver-cmd is required: the guard starts the candidate itself".into());
    }
    let mut report = GuardReport {
        workload: "guard",
        rounds: Vec::new(),
        tolerance: args.tolerance,
        comparisons: Vec::new(),
        failed_figures: Vec::new(),
        errors_total: 0,
        leftovers: Vec::new(),
    };
    run_rounds(args, &mut report).await?;
    judge(&mut report);
    if !report.failed_figures.is_empty() {
        eprintln!(
            "guard: {} behind; measuring {} rounds more to tell a slowdown from noise",
            report.failed_figures.join(", "),
            args.rounds
        );
        run_rounds(args, &mut report).await?;
        judge(&mut report);
    }
    Ok(report)
}

/// `--rounds` more rounds; the reference goes first in every other one.
async fn run_rounds(args: &GuardArgs, report: &mut GuardReport) -> Result<(), Fatal> {
    let candidate_cmd = args.driver.driver_cmd.as_deref().unwrap_or_default();
    for _ in 0..args.rounds {
        let number = report.rounds.len() + 1;
        let reference_first = number % 2 == 1;
        eprintln!("guard: round {number}");
        let floor = floor::measure(&args.floor_dir, FLOOR_SAMPLES)
            .map_err(|err| format!("timing the floor in {}: {err}", args.floor_dir.display()))?;
        let (mut reference, mut candidate) = (Figures::new(), Figures::new());
        let mut turns = [
            (args.reference_cmd.as_str(), &mut reference),
            (candidate_cmd, &mut candidate),
        ];
        if !reference_first {
            turns.reverse();
        }
        for (command, figures) in turns {
            let run = workload::lifecycle(&args.lifecycle(command)).await?;
            report.errors_total += run.errors_total;
            report.leftovers.extend(run.leftovers.iter().cloned());
            *figures = figures_of(&run);
        }
        report.rounds.push(Round {
            floor,
            reference_first,
            ratios: ratios_of(&reference, &candidate),
            reference,
            candidate,
        });
    }
    Ok(())
}

fn judge(report: &mut GuardReport) {
    let rounds = &report.rounds;
    report.comparisons = compare::compare(
        &medians(rounds.iter().map(|r| &r.reference)),
        &medians(rounds.iter().map(|r| &r.candidate)),
        &medians(rounds.iter().map(|r| &r.ratios)),
        report.tolerance,
    );
    report.failed_figures = report
        .comparisons
        .iter()
        .filter(|c| c.verdict.fails())
        .map(|c| c.figure.clone())
        .collect();
}

/// A run's figures: each guarded call's p50 and a whole cycle's time, µs, and the driver's
/// peak RSS in MiB.
fn figures_of(run: &LifecycleReport) -> Figures {
    let mut figures = Figures::new();
    for call in GUARDED_CALLS {
        if let Some(calls) = run.rpcs.get(call).filter(|s| s.count > s.errors) {
            figures.insert(call.to_string(), calls.p50_us as f64);
        }
    }
    if run.cycles_per_s > 0.0 {
        figures.insert("cycle".into(), 1e6 / run.cycles_per_s);
    }
    if let Some(peak) = run.memory.peak_rss_kib {
        figures.insert("peak_rss_mib".into(), peak as f64 / 1024.0);
    }
    figures
}

/// Candidate over reference for the figures both have (a 0 counts as a thousandth, so that no
/// ratio divides by zero).
fn ratios_of(reference: &Figures, candidate: &Figures) -> Figures {
    candidate
        .iter()
        .filter_map(|(name, now)| {
            let base = reference.get(name)?;
            Some((name.clone(), now.max(1e-3) / base.max(1e-3)))
        })
        .collect()
}

/// Per figure, the median of the rounds that measured it.
fn medians<'a>(rounds: impl Iterator<Item = &'a Figures>) -> Figures {
    let mut values: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for round in rounds {
        for (name, value) in round {
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

pub fn text(r: &GuardReport) -> String {
    let mut out = String::new();
    for (i, round) in r.rounds.iter().enumerate() {
        let f = &round.floor;
        let _ = writeln!(
            out,
            "round {} ({} first): fdatasync {} µs, bind mount {} µs, unmount {} µs, \
             round trip {} µs",
            i + 1,
            if round.reference_first {
                "reference"
            } else {
                "candidate"
            },
            f.fdatasync_us,
            f.bind_mount_us,
            f.unmount_us,
            f.round_trip_us
        );
    }
    let _ = writeln!(
        out,
        "{:<22} {:>10} {:>10} {:>6}  verdict (tolerance {:.0}%)",
        "figure (µs, MiB)",
        "reference",
        "candidate",
        "ratio",
        r.tolerance * 100.0
    );
    let cell = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.1}"));
    for c in &r.comparisons {
        let ratio = c.ratio.map_or_else(|| "-".into(), |v| format!("{v:.3}"));
        let _ = writeln!(
            out,
            "{:<22} {:>10} {:>10} {ratio:>6}  {:?}",
            c.figure,
            cell(c.reference),
            cell(c.candidate),
            c.verdict
        );
    }
    if r.failed_figures.is_empty() {
        out += "guard: every figure within the reference's\n";
    } else {
        let _ = writeln!(
            out,
            "guard: FAILED: {} (a deliberate cost: move the reference with \
             .ci/speed-guard.sh --write-baseline WHY and add WHY to CHANGELOG.md)",
            r.failed_figures.join(", ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(pairs: &[(&str, f64)]) -> Figures {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn a_figure_is_the_median_of_its_rounds() {
        let rounds = [
            figures(&[("a", 3.0), ("b", 1.0)]),
            figures(&[("a", 1.0)]),
            figures(&[("a", 9.0), ("b", 2.0)]),
        ];
        let m = medians(rounds.iter());
        assert_eq!(m["a"], 3.0);
        assert_eq!(m["b"], 1.0);
    }

    #[test]
    fn a_ratio_is_the_candidates_over_the_references_for_figures_both_measured() {
        let reference = figures(&[("a", 200.0), ("b", 100.0), ("gone", 5.0)]);
        let candidate = figures(&[("a", 300.0), ("b", 0.0), ("new", 7.0)]);
        let ratios = ratios_of(&reference, &candidate);
        assert_eq!(ratios.len(), 2);
        assert_eq!(ratios["a"], 1.5);
        assert!(ratios["b"] < 1e-4);
    }
}
