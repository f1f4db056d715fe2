//! A run's figures judged: the candidate's against the reference's of the same rounds.
//!
//! A figure is a call's p50 (µs), a whole cycle's time (µs) or the driver's peak RSS (MiB);
//! lower is better for every one. Its ratio is the median over rounds of the candidate's value
//! over the reference's in the same round, so 1.0 means "as fast as the reference".

use std::collections::BTreeMap;

use serde::Serialize;

/// One figure of a run: both builds' medians over rounds, and the median of their ratios.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Comparison {
    pub figure: String,
    pub reference: Option<f64>,
    pub candidate: Option<f64>,
    pub ratio: Option<f64>,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Within,
    /// Slower than the reference by more than the tolerance: the guard fails.
    Behind,
    /// Faster by more than the tolerance: worth moving the reference, not a failure.
    Ahead,
    /// Measured on the candidate only (a call the reference does not make): a failure, so that
    /// no figure goes unguarded until the reference makes it too.
    NotInReference,
    /// Measured on the reference only: a failure too.
    NotMeasured,
}

impl Verdict {
    pub fn fails(self) -> bool {
        matches!(
            self,
            Verdict::Behind | Verdict::NotInReference | Verdict::NotMeasured
        )
    }
}

/// Every figure of either build, in name order. `ratios` holds the figures both measured.
pub fn compare(
    reference: &BTreeMap<String, f64>,
    candidate: &BTreeMap<String, f64>,
    ratios: &BTreeMap<String, f64>,
    tolerance: f64,
) -> Vec<Comparison> {
    let mut names: Vec<&String> = reference.keys().chain(candidate.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let (base, now) = (reference.get(name).copied(), candidate.get(name).copied());
            let ratio = ratios.get(name).copied();
            let verdict = match (base, now, ratio) {
                (None, _, _) => Verdict::NotInReference,
                (Some(_), None, _) | (_, _, None) => Verdict::NotMeasured,
                (_, _, Some(r)) if r > 1.0 + tolerance => Verdict::Behind,
                (_, _, Some(r)) if r < 1.0 - tolerance => Verdict::Ahead,
                _ => Verdict::Within,
            };
            Comparison {
                figure: name.clone(),
                reference: base,
                candidate: now,
                ratio,
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
    fn a_ratio_more_than_the_tolerance_behind_fails_and_one_ahead_does_not() {
        let both = figures(&[("a", 1.0), ("b", 1.0), ("c", 1.0), ("d", 1.0)]);
        let ratios = figures(&[("a", 1.2), ("b", 1.3), ("c", 0.7), ("d", 0.8)]);
        let verdicts: Vec<_> = compare(&both, &both, &ratios, 0.25)
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
    fn a_figure_of_one_build_only_fails() {
        let verdicts: Vec<_> = compare(
            &figures(&[("gone", 1.0)]),
            &figures(&[("new", 1.0)]),
            &BTreeMap::new(),
            0.25,
        )
        .into_iter()
        .map(|c| c.verdict)
        .collect();
        assert_eq!(verdicts, [Verdict::NotMeasured, Verdict::NotInReference]);
        assert!(verdicts.iter().all(|v| v.fails()));
    }
}
