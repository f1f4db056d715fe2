//! The committed figures and the comparison with a run's.
//!
//! A figure is a time divided by what its call cannot avoid on the machine (`super::floor_of`),
//! which a slower machine moves together with the figure, or the driver's peak RSS in MiB,
//! which no speed moves. Lower is better for every figure.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// `.ci/bench-baseline.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Baseline {
    /// Why the figures are what they are: the same sentence is a line of CHANGELOG.md.
    pub why: String,
    /// The floor of the run that wrote them, µs, for a reader: fdatasync, bind mount, unmount,
    /// round trip.
    pub floor_us: BTreeMap<String, u64>,
    /// Figure name → value (see the module comment).
    pub figures: BTreeMap<String, f64>,
}

impl Baseline {
    pub fn read(path: &Path) -> Result<Baseline, String> {
        let text = fs::read_to_string(path)
            .map_err(|err| format!("reading the baseline {}: {err}", path.display()))?;
        serde_json::from_str(&text)
            .map_err(|err| format!("the baseline {} is not valid: {err}", path.display()))
    }

    pub fn write(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(self).expect("baselines serialize") + "\n";
        fs::write(path, text)
            .map_err(|err| format!("writing the baseline {}: {err}", path.display()))
    }
}

/// One figure of a run against its baseline.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Comparison {
    pub figure: String,
    pub baseline: Option<f64>,
    pub measured: f64,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Within,
    /// Slower than the baseline by more than the tolerance: the guard fails.
    Behind,
    /// Faster by more than the tolerance: worth a new baseline, not a failure.
    Ahead,
    /// Measured, but not in the baseline: a failure, so that no figure goes unguarded.
    NotInBaseline,
    /// In the baseline, but not measured this time: a failure too.
    NotMeasured,
}

impl Verdict {
    pub fn fails(self) -> bool {
        matches!(
            self,
            Verdict::Behind | Verdict::NotInBaseline | Verdict::NotMeasured
        )
    }
}

/// Every figure of either side, in name order.
pub fn compare(
    baseline: &BTreeMap<String, f64>,
    measured: &BTreeMap<String, f64>,
    tolerance: f64,
) -> Vec<Comparison> {
    let mut names: Vec<&String> = baseline.keys().chain(measured.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let (base, now) = (baseline.get(name).copied(), measured.get(name).copied());
            let verdict = match (base, now) {
                (None, _) => Verdict::NotInBaseline,
                (Some(_), None) => Verdict::NotMeasured,
                (Some(base), Some(now)) if now > base * (1.0 + tolerance) => Verdict::Behind,
                (Some(base), Some(now)) if now < base * (1.0 - tolerance) => Verdict::Ahead,
                _ => Verdict::Within,
            };
            Comparison {
                figure: name.clone(),
                baseline: base,
                measured: now.unwrap_or(f64::NAN),
                verdict,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn a_figure_more_than_the_tolerance_behind_fails_and_one_ahead_does_not() {
        let base = figures(&[("a", 1.0), ("b", 1.0), ("c", 1.0), ("d", 1.0)]);
        let now = figures(&[("a", 1.2), ("b", 1.3), ("c", 0.7), ("d", 0.8)]);
        let verdicts: Vec<_> = compare(&base, &now, 0.25)
            .into_iter()
            .map(|c| (c.figure, c.verdict))
            .collect();
        assert_eq!(
            verdicts,
            [
                ("a".into(), Verdict::Within),
                ("b".into(), Verdict::Behind),
                ("c".into(), Verdict::Ahead),
                ("d".into(), Verdict::Within),
            ]
        );
        assert!(Verdict::Behind.fails() && !Verdict::Ahead.fails() && !Verdict::Within.fails());
    }

    #[test]
    fn a_figure_on_one_side_only_fails() {
        let verdicts: Vec<_> = compare(&figures(&[("gone", 1.0)]), &figures(&[("new", 1.0)]), 0.25)
            .into_iter()
            .map(|c| c.verdict)
            .collect();
        assert_eq!(verdicts, [Verdict::NotMeasured, Verdict::NotInBaseline]);
        assert!(verdicts.iter().all(|v| v.fails()));
    }

    #[test]
    fn a_baseline_written_reads_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("baseline.json");
        let baseline = Baseline {
            why: "because".into(),
            floor_us: [("fdatasync".to_string(), 200)].into(),
            figures: figures(&[("cycle", 3.5)]),
        };
        baseline.write(&path).unwrap();
        assert_eq!(Baseline::read(&path).unwrap(), baseline);
        fs::write(&path, "{").unwrap();
        assert!(Baseline::read(&path).unwrap_err().contains("not valid"));
    }
}
