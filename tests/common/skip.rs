//! Skips that CI can count. A test may skip only because this machine's kernel lacks a feature
//! (e.g. XFS/ext4 project quota); anything else that stops a test from running (a missing mkfs,
//! a losetup or mount failure) is a failure. [`skip`] says so loudly on stderr and appends a
//! line to the skip log, which `.ci/run` reads after `cargo test` and checks against
//! `.ci/allowed-skips`.
//!
//! The log is `$STICKYVOL_SKIP_LOG`, or `skips.log` in cargo's CARGO_TARGET_TMPDIR
//! (target/tmp) when that is unset. `$STICKYVOL_REQUIRE_FEATURES` (comma-separated feature
//! names, or `all`) turns a skip for those features into a failure: the VM run of the quota
//! tests (tests/vm/run-quota-tests) sets it to `project-quota`.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;

/// The kernel feature XFS `-o prjquota` and ext4 `-O quota,project` need (CONFIG_XFS_QUOTA,
/// CONFIG_QUOTA, CONFIG_QFMT_V2).
pub const PROJECT_QUOTA: &str = "project-quota";

/// Where skips are recorded.
pub fn log_path() -> PathBuf {
    std::env::var_os("STICKYVOL_SKIP_LOG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("skips.log"))
}

/// Whether the environment says `feature` must be there (then a skip for it is a failure).
pub fn required(feature: &str) -> bool {
    std::env::var("STICKYVOL_REQUIRE_FEATURES").is_ok_and(|list| {
        list.split(',')
            .map(str::trim)
            .any(|f| f == feature || f == "all")
    })
}

/// Records that the current test does not run because this kernel lacks `feature` (`reason`:
/// what the kernel said), or panics when `feature` is required. The caller returns after it.
pub fn skip(feature: &str, reason: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_string();
    let binary = std::env::args()
        .next()
        .and_then(|arg0| {
            let name = PathBuf::from(arg0).file_name()?.to_str()?.to_string();
            // Cargo names test binaries NAME-HASH.
            Some(
                name.rsplit_once('-')
                    .map_or(name.clone(), |(n, _)| n.to_string()),
            )
        })
        .unwrap_or_default();
    assert!(
        !required(feature),
        "{binary}::{test} needs {feature}, which STICKYVOL_REQUIRE_FEATURES requires: {reason}"
    );
    eprintln!("SKIPPED ({feature}): {binary}::{test}: {reason}");
    let path = log_path();
    let line = format!(
        "{feature}\t{binary}::{test}\t{}\n",
        reason.replace(['\n', '\t'], " ")
    );
    let written = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(err) = written {
        panic!("recording the skip in {}: {err}", path.display());
    }
}
