//! What `io-limits` measured, the thresholds it is held to, and its table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::blockio::{Side, push_errors};
use crate::client::DriverInfo;
use crate::report::RpcSummary;

/// The limited volume and its neighbour writing at once, under one class.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// Whether the class was changed on the running pod (ControllerModifyVolume) before.
    pub changed: bool,
    /// The class's `writeIOPS`.
    pub write_iops: u64,
    /// The `writeIOPS` found in the limited writer's cgroup before the run (v1: its container's,
    /// v2: its pod's); None when there was none.
    pub write_iops_in_cgroup: Option<u64>,
    /// The neighbour writing alone (the limited volume published, idle), right before and
    /// right after both write at once.
    pub neighbour_alone_before: Side,
    pub neighbour_alone_after: Side,
    /// Their mean IOPS: the neighbour's unlimited rate.
    pub neighbour_alone_iops: f64,
    pub limited: Side,
    pub neighbour: Side,
    /// The most IOPS the limited volume may do: `write_iops` × (1 + the slack).
    pub limited_bound: f64,
    /// The neighbour's IOPS beside the limited volume over `neighbour_alone_iops`.
    pub neighbour_share: f64,
}

/// One kind of volume (block or image): its phases.
#[derive(Debug, Clone, Serialize)]
pub struct KindReport {
    /// `block` or `image`.
    pub kind: &'static str,
    /// `major:minor` of the device the limit is on, and of the neighbour's.
    pub limited_device: String,
    pub neighbour_device: String,
    pub phases: Vec<Phase>,
}

#[derive(Debug, Serialize)]
pub struct IoLimitsReport {
    pub workload: &'static str,
    pub driver: DriverInfo,
    /// `v1` or `v2`: the hierarchy with the IO controller.
    pub cgroup: &'static str,
    /// Bytes each writer writes over (the block volume, or the file in the image volume).
    pub size_bytes: u64,
    pub runtime_s: f64,
    pub limit_slack: f64,
    pub min_neighbour_share: f64,
    pub kinds: Vec<KindReport>,
    pub rpcs: BTreeMap<&'static str, RpcSummary>,
    pub discovery: BTreeMap<&'static str, RpcSummary>,
    /// Failed calls and failed writes.
    pub errors_total: u64,
    pub io_errors: Vec<String>,
    /// The thresholds missed (exit status 1).
    pub failed_checks: Vec<String>,
    pub leftovers: Vec<String>,
}

/// The thresholds `kinds` miss: a limited volume above its bound (or idle), a neighbour below
/// its share of its rate alone, a limit not found in the writer's cgroup.
pub fn failed_checks(kinds: &[KindReport], min_share: f64) -> Vec<String> {
    let mut failed = Vec::new();
    for kind in kinds {
        for phase in &kind.phases {
            failed.extend(phase_failures(kind.kind, phase, min_share));
        }
    }
    failed
}

/// The thresholds one phase misses.
fn phase_failures(kind: &str, phase: &Phase, min_share: f64) -> Vec<String> {
    let what = format!("{kind} {}", class_label(phase));
    let mut failed = Vec::new();
    if phase.write_iops_in_cgroup != Some(phase.write_iops) {
        failed.push(format!(
            "{what}: the writer's cgroup has writeIOPS {:?}",
            phase.write_iops_in_cgroup
        ));
    }
    if phase.limited.ops == 0 || phase.limited.iops > phase.limited_bound {
        failed.push(format!(
            "{what}: the limited volume did {:.1} IOPS, bound {:.1}",
            phase.limited.iops, phase.limited_bound
        ));
    }
    let idle_alone = phase.neighbour_alone_before.ops == 0 || phase.neighbour_alone_after.ops == 0;
    if idle_alone || phase.neighbour_share < min_share {
        failed.push(format!(
            "{what}: the neighbour kept {:.1}% of its rate alone, less than {:.0}%",
            phase.neighbour_share * 100.0,
            min_share * 100.0
        ));
    }
    failed
}

fn class_label(phase: &Phase) -> String {
    match phase.changed {
        false => format!("writeIOPS={}", phase.write_iops),
        true => format!("→ writeIOPS={}", phase.write_iops),
    }
}

/// The table: one line per kind and phase.
pub fn text(r: &IoLimitsReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "io-limits: cgroup {}, 4 KiB random direct writes at QD1 over {} MiB, {:.1} s a run; \
         bound = limit × {:.2}, neighbour kept ≥ {:.0}% of its rate alone",
        r.cgroup,
        r.size_bytes >> 20,
        r.runtime_s,
        1.0 + r.limit_slack,
        r.min_neighbour_share * 100.0
    );
    let _ = writeln!(
        out,
        "{:<6} {:<16} {:>9} {:>9} {:>9} {:>11} {:>11} {:>7} {:>5}",
        "kind",
        "class",
        "in cgroup",
        "limited",
        "bound",
        "nbr alone",
        "nbr beside",
        "share",
        "pass"
    );
    for kind in &r.kinds {
        for phase in &kind.phases {
            let pass = phase_failures(kind.kind, phase, r.min_neighbour_share).is_empty();
            let _ = writeln!(
                out,
                "{:<6} {:<16} {:>9} {:>9.1} {:>9.1} {:>11.1} {:>11.1} {:>6.1}% {:>5}",
                kind.kind,
                class_label(phase),
                phase
                    .write_iops_in_cgroup
                    .map_or_else(|| "-".into(), |v| v.to_string()),
                phase.limited.iops,
                phase.limited_bound,
                phase.neighbour_alone_iops,
                phase.neighbour.iops,
                phase.neighbour_share * 100.0,
                if pass { "yes" } else { "NO" }
            );
        }
    }
    let _ = writeln!(out, "(IOPS; devices: limited / neighbour)");
    for kind in &r.kinds {
        let _ = writeln!(
            out,
            "  {}: {} / {}",
            kind.kind, kind.limited_device, kind.neighbour_device
        );
    }
    for failed in &r.failed_checks {
        let _ = writeln!(out, "FAILED: {failed}");
    }
    push_errors(&mut out, &r.io_errors, &r.rpcs);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(iops: f64) -> Side {
        Side {
            ops: (iops * 10.0) as u64,
            seconds: 10.0,
            iops,
            ..Side::default()
        }
    }

    fn phase(limited: f64, in_cgroup: Option<u64>, beside: f64) -> Phase {
        Phase {
            changed: false,
            write_iops: 200,
            write_iops_in_cgroup: in_cgroup,
            neighbour_alone_before: side(1000.0),
            neighbour_alone_after: side(1200.0),
            neighbour_alone_iops: 1100.0,
            limited: side(limited),
            neighbour: side(beside),
            limited_bound: 210.0,
            neighbour_share: beside / 1100.0,
        }
    }

    fn kind(phases: Vec<Phase>) -> KindReport {
        KindReport {
            kind: "block",
            limited_device: "7:0".into(),
            neighbour_device: "7:1".into(),
            phases,
        }
    }

    #[test]
    fn each_threshold_fails_on_its_own() {
        let good = phase(205.0, Some(200), 1000.0);
        assert_eq!(
            failed_checks(&[kind(vec![good])], 0.9),
            Vec::<String>::new()
        );
        let cases = [
            (phase(211.0, Some(200), 1000.0), "211.0 IOPS, bound 210.0"),
            (phase(0.0, Some(200), 1000.0), "0.0 IOPS"),
            (phase(200.0, None, 1000.0), "writeIOPS None"),
            (phase(200.0, Some(400), 1000.0), "writeIOPS Some(400)"),
            (phase(200.0, Some(200), 980.0), "89.1% of its rate alone"),
        ];
        for (bad, says) in cases {
            let failed = failed_checks(&[kind(vec![bad])], 0.9);
            assert_eq!(failed.len(), 1, "{failed:?}");
            assert!(failed[0].contains(says), "{failed:?} should say {says}");
        }
    }
}
