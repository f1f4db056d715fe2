//! Running `stickyvol doctor` and reading its report.

use std::path::Path;
use std::process::{Command, ExitStatus};

use stickyvol::doctor::{Check, Outcome};

/// The report as printed; each check line (`[ok]`, `[warn]` or `[FAIL]` and what was found) read
/// back into the library's [`Check`].
#[derive(Debug)]
pub struct DoctorReport {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub checks: Vec<Check>,
    /// The final `result: …` line, without `result: `.
    pub result: String,
}

impl DoctorReport {
    /// The one check whose text contains `needle`.
    #[track_caller]
    pub fn check(&self, needle: &str) -> &Check {
        let mut found = self.checks.iter().filter(|c| c.what.contains(needle));
        match (found.next(), found.next()) {
            (Some(check), None) => check,
            (None, _) => panic!("no check mentions {needle:?}:\n{}", self.stdout),
            (Some(_), Some(_)) => panic!("several checks mention {needle:?}:\n{}", self.stdout),
        }
    }

    pub fn failures(&self) -> usize {
        self.checks
            .iter()
            .filter(|c| c.outcome == Outcome::Fail)
            .count()
    }
}

/// `stickyvol doctor --kubelet-dir <kubelet> --data-dir <data>`, with no flag defaults taken
/// from the environment; panics if the report does not have the expected shape (a title line,
/// one line per check, a final `result:` line).
pub fn run_doctor(kubelet: &Path, data: &Path) -> DoctorReport {
    run_doctor_with(kubelet, data, &[])
}

/// [`run_doctor`] with more flags, e.g. `--pool NAME=PATH`.
pub fn run_doctor_with(kubelet: &Path, data: &Path, extra: &[String]) -> DoctorReport {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stickyvol"));
    cmd.arg("doctor")
        .arg("--kubelet-dir")
        .arg(kubelet)
        .arg("--data-dir")
        .arg(data)
        .args(extra);
    for var in super::DRIVER_ENV {
        cmd.env_remove(var);
    }
    // Outside a pod: no check of the API server's version, whatever runs the tests.
    cmd.env_remove("KUBERNETES_SERVICE_HOST");
    let output = cmd.output().expect("running stickyvol doctor");
    let stdout = String::from_utf8(output.stdout).expect("doctor prints UTF-8");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let mut lines = stdout.lines();
    assert_eq!(
        lines.next(),
        Some("stickyvol doctor"),
        "report title:\n{stdout}\nstderr:\n{stderr}"
    );
    let mut checks = Vec::new();
    let mut result = None;
    for line in lines {
        assert!(
            result.is_none(),
            "a line after the result: {line:?}\n{stdout}"
        );
        if let Some(rest) = line.strip_prefix("result: ") {
            result = Some(rest.to_string());
            continue;
        }
        let line = line.trim_start();
        let (outcome, text) = [
            ("[ok]", Outcome::Ok),
            ("[warn]", Outcome::Warn),
            ("[FAIL]", Outcome::Fail),
        ]
        .into_iter()
        .find_map(|(tag, outcome)| line.strip_prefix(tag).map(|text| (outcome, text)))
        .unwrap_or_else(|| panic!("not a check line: {line:?}\n{stdout}"));
        checks.push(Check {
            outcome,
            what: text.trim().to_string(),
        });
    }
    DoctorReport {
        status: output.status,
        result: result.unwrap_or_else(|| panic!("no result line:\n{stdout}")),
        stdout,
        stderr,
        checks,
    }
}
