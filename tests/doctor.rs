//! `stickyvol doctor`: one report line per check, and a non-zero exit status exactly when a
//! check failed. Scratch tmpfs mounts give the checks deterministic answers: shared or private
//! propagation, a read-only or a full data directory.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::doctor::{DoctorReport, run_doctor, run_doctor_with};
use common::mounts::TmpfsMount;
use common::*;
use nix::mount::MsFlags;
use stickyvol::doctor::Outcome;

/// Needles naming each check, in report order.
const ROOT: &str = "running as root";
const STATX: &str = "statx";
const KERNEL: &str = "or newer is needed)";
const LOOP_CONTROL: &str = "/dev/loop-control";
const WRITABLE: &str = "is writable";
const FILESYSTEM: &str = "data directory filesystem:";
const COPY_ON_WRITE: &str = "copy-on-write on the data directory:";
const PUBLICATIONS: &str = "no --run-dir: publications are kept beside the records";
const PROPAGATION: &str = "kubelet directory";
const IMAGE_EXT4: &str = "image volumes of ext4";
const IMAGE_XFS: &str = "image volumes of xfs";
const ENCRYPTION: &str = "encrypted volumes";

/// A scratch directory (the harness's test directory, no driver started) that unmounts
/// everything beneath it when dropped.
fn scratch() -> TestDriver {
    TestDriver::prepare(Options::default())
}

/// A kubelet dir on a fresh tmpfs made shared, so the propagation check passes.
fn shared_kubelet(root: &Path) -> (TmpfsMount, PathBuf) {
    let mount = TmpfsMount::new(&root.join("shared"), "1m", MsFlags::empty());
    mount.set_propagation(MsFlags::MS_SHARED);
    let kubelet = mount.path().join("kubelet");
    (mount, kubelet)
}

/// The invariant of every report: exit status 0 and "can run" exactly when nothing failed.
#[track_caller]
fn assert_consistent(report: &DoctorReport) {
    let fit = report.failures() == 0;
    assert_eq!(
        report.status.success(),
        fit,
        "exit status {} with {} failures:\n{}",
        report.status,
        report.failures(),
        report.stdout
    );
    if fit {
        assert_eq!(report.result, "this node can run stickyvol");
    } else {
        let plural = if report.failures() == 1 { "" } else { "s" };
        assert_eq!(
            report.result,
            format!(
                "this node cannot run stickyvol ({} failed check{plural})",
                report.failures()
            )
        );
    }
}

/// The checks that depend on the machine rather than the directories: the test suite runs
/// as root on Linux 5.8+ with loop devices, so they pass.
#[track_caller]
fn assert_host_checks_pass(report: &DoctorReport) {
    for needle in [ROOT, KERNEL, STATX, LOOP_CONTROL] {
        assert_eq!(
            report.check(needle).outcome,
            Outcome::Ok,
            "{needle}:\n{}",
            report.stdout
        );
    }
}

/// The propagation check's verdict, naming the kubelet dir, whether the mount holding it is
/// "shared" or "private", and that mount.
#[track_caller]
fn assert_propagation(
    report: &DoctorReport,
    outcome: Outcome,
    kubelet: &Path,
    kind: &str,
    mount: &Path,
) {
    let propagation = report.check(PROPAGATION);
    assert_eq!(propagation.outcome, outcome, "{}", report.stdout);
    assert!(
        propagation.what.contains(&format!(
            "{} is on a {kind} mount ({})",
            kubelet.display(),
            mount.display()
        )),
        "{}",
        propagation.what
    );
}

#[test]
fn the_report_names_every_check_and_the_exit_status_follows_failures() {
    let dir = scratch();
    let report = run_doctor(&dir.kubelet, &dir.data);
    assert_consistent(&report);
    assert_host_checks_pass(&report);
    // No in-cluster check outside a pod (KUBERNETES_SERVICE_HOST unset).
    assert_eq!(report.checks.len(), 12, "{}", report.stdout);
    let position = |needle: &str| {
        let check = report.check(needle);
        report
            .checks
            .iter()
            .position(|c| std::ptr::eq(c, check))
            .unwrap()
    };
    let order: Vec<usize> = [
        ROOT,
        KERNEL,
        STATX,
        LOOP_CONTROL,
        WRITABLE,
        FILESYSTEM,
        COPY_ON_WRITE,
        PUBLICATIONS,
        IMAGE_EXT4,
        IMAGE_XFS,
        ENCRYPTION,
        PROPAGATION,
    ]
    .iter()
    .map(|needle| position(needle))
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{}", report.stdout);

    // Encryption is a warning where the node cannot (no device mapper here), never a failure.
    let encryption = report.check(ENCRYPTION);
    let can = Path::new("/dev/mapper/control").exists()
        && ["/usr/sbin/cryptsetup", "/sbin/cryptsetup"]
            .iter()
            .any(|tool| Path::new(tool).exists());
    let expected = if can { Outcome::Ok } else { Outcome::Warn };
    assert_eq!(encryption.outcome, expected, "{}", report.stdout);

    // The tools are installed here (.ci/run installs them); only ext4's growth may warn, where
    // root lacks CAP_SYS_RESOURCE.
    assert_eq!(
        report.check(IMAGE_XFS).outcome,
        Outcome::Ok,
        "{}",
        report.stdout
    );
    assert_ne!(
        report.check(IMAGE_EXT4).outcome,
        Outcome::Fail,
        "{}",
        report.stdout
    );

    let writable = report.check(WRITABLE);
    assert_eq!(writable.outcome, Outcome::Ok);
    // The data dir does not exist yet: its nearest existing ancestor is judged, and named.
    assert!(
        writable.what.contains(&format!(
            "{} (not created yet; checked {})",
            dir.data.display(),
            dir.root.display()
        )),
        "{}",
        writable.what
    );
    let filesystem = report.check(FILESYSTEM);
    assert_eq!(filesystem.outcome, Outcome::Ok);
    assert!(
        filesystem.what.contains("; size enforcement it offers: "),
        "{}",
        filesystem.what
    );
    let cow = report.check(COPY_ON_WRITE);
    assert_eq!(cow.outcome, Outcome::Ok);
    // It names what `serve` would use for snapshots (this data dir's ext4: full copies).
    assert!(
        cow.what
            .contains("snapshots, restores and clones use full copies"),
        "{}",
        cow.what
    );
    // Without --run-dir, serve keeps publications in the state directory: nothing to check.
    let publications = report.check(PUBLICATIONS);
    assert_eq!(publications.outcome, Outcome::Ok);
    assert!(
        publications
            .what
            .contains(&dir.data.join("state").display().to_string()),
        "{}",
        publications.what
    );
    // Whether this machine's kubelet dir propagates is not ours to assume; the outcome must
    // be a verdict either way, naming the directory.
    let propagation = report.check(PROPAGATION);
    assert_ne!(propagation.outcome, Outcome::Warn);
    assert!(
        propagation
            .what
            .contains(&dir.kubelet.display().to_string())
    );

    // Nothing was created or left behind: no data dir, no reflink probe files.
    assert!(!exists_no_follow(&dir.data));
    let entries: Vec<_> = fs::read_dir(&dir.root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries, vec!["kubelet"]);
}

#[test]
fn a_kubelet_dir_on_a_shared_mount_passes_and_on_a_private_one_fails() {
    let dir = scratch();
    let (shared, kubelet) = shared_kubelet(&dir.root);
    // The data dir on tmpfs as well: deterministic filesystem lines.
    let data = shared.path().join("data");
    let report = run_doctor(&kubelet, &data);
    assert_consistent(&report);
    assert_host_checks_pass(&report);
    assert_eq!(report.failures(), 0, "{}", report.stdout);
    assert!(report.status.success());
    assert_propagation(&report, Outcome::Ok, &kubelet, "shared", shared.path());
    let filesystem = report.check(FILESYSTEM);
    assert!(
        filesystem
            .what
            .contains("data directory filesystem: tmpfs; size enforcement it offers: none"),
        "{}",
        filesystem.what
    );
    assert_eq!(report.check("on tmpfs").outcome, Outcome::Warn);

    // A private mount: mounts made beneath it would never reach kubelet.
    let private = TmpfsMount::new(&dir.root.join("private"), "1m", MsFlags::empty());
    private.set_propagation(MsFlags::MS_PRIVATE);
    let kubelet = private.path().join("kubelet");
    fs::create_dir(&kubelet).unwrap();
    let report = run_doctor(&kubelet, &private.path().join("data"));
    assert_consistent(&report);
    assert_host_checks_pass(&report);
    assert_propagation(&report, Outcome::Fail, &kubelet, "private", private.path());
    assert_eq!(
        report.failures(),
        1,
        "only propagation fails:\n{}",
        report.stdout
    );
    assert!(!report.status.success());

    // The deepest mount decides: a private mount inside the shared one fails.
    let inner = TmpfsMount::new(&shared.path().join("inner"), "1m", MsFlags::empty());
    inner.set_propagation(MsFlags::MS_PRIVATE);
    let report = run_doctor(&inner.path().join("kubelet"), &data);
    assert_consistent(&report);
    assert_eq!(report.check(PROPAGATION).outcome, Outcome::Fail);
    drop(inner);
    let report = run_doctor(&shared.path().join("kubelet"), &data);
    assert_eq!(report.check(PROPAGATION).outcome, Outcome::Ok);
}

#[test]
fn a_read_only_data_directory_fails() {
    let dir = scratch();
    let (_shared, kubelet) = shared_kubelet(&dir.root);
    let read_only = TmpfsMount::new(&dir.root.join("ro"), "1m", MsFlags::MS_RDONLY);
    // Not created yet, beneath a read-only mount; and the read-only mount point itself.
    for data in [
        read_only.path().join("data"),
        read_only.path().to_path_buf(),
    ] {
        let report = run_doctor(&kubelet, &data);
        assert_consistent(&report);
        assert_host_checks_pass(&report);
        let data_check = report.check("is not writable");
        assert_eq!(data_check.outcome, Outcome::Fail, "{}", report.stdout);
        assert!(
            data_check
                .what
                .starts_with(&format!("data directory {}", data.display())),
            "{}",
            data_check.what
        );
        assert_eq!(report.failures(), 1, "{}", report.stdout);
        assert!(!report.status.success());
        assert!(!exists_no_follow(&read_only.path().join("data")));
    }
}

/// A warning, not a failure: the driver must start on a full data dir to free it.
#[test]
fn a_full_data_directory_warns() {
    let dir = scratch();
    let (_shared, kubelet) = shared_kubelet(&dir.root);
    let full = TmpfsMount::new(&dir.root.join("full"), "256k", MsFlags::empty());
    full.fill();
    assert_eq!(available_bytes(full.path()), 0);
    let report = run_doctor(&kubelet, full.path());
    assert_consistent(&report);
    let data_check = report.check("is full");
    assert_eq!(data_check.outcome, Outcome::Warn, "{}", report.stdout);
    assert_eq!(report.failures(), 0, "{}", report.stdout);
    assert!(report.status.success());
}

#[test]
fn extra_pools_are_checked_and_their_enforcement_reported() {
    let dir = scratch();
    let fs = common::scratchfs::ScratchFs::new("btrfs", 1 << 30, &["-q"], "");
    let pool = fs.mount_point.join("pool");
    let flag = ["--pool".to_string(), format!("fast={}", pool.display())];
    let report = run_doctor_with(&dir.kubelet, &dir.data, &flag);
    assert_consistent(&report);
    let filesystem = report.check("pool fast filesystem:");
    assert!(
        filesystem.what.contains("btrfs") && filesystem.what.contains("--enforcement"),
        "{}",
        filesystem.what
    );
    assert!(
        report
            .check(&format!("pool fast {}", fs.mount_point.display()))
            .outcome
            == Outcome::Ok
    );

    stickyvol::host::btrfs::enable_quota(&fs.mount_point).unwrap();
    let report = run_doctor_with(&dir.kubelet, &dir.data, &flag);
    assert!(
        report
            .check("pool fast filesystem:")
            .what
            .contains("qgroups"),
        "{}",
        report.stdout
    );

    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_stickyvol"))
        .args(["doctor", "--pool", "fast"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("NAME=VALUE"));
}

/// `--run-dir`, where serve keeps publications: it must take writes, and should be a tmpfs,
/// which a reboot empties as it removes the mounts the publications describe.
#[test]
fn the_run_directory_is_checked_where_serve_will_keep_publications() {
    let dir = scratch();
    let (shared, kubelet) = shared_kubelet(&dir.root);
    let data = shared.path().join("data");
    let run_flag = |run: &Path| ["--run-dir".to_string(), run.display().to_string()];

    // On a tmpfs, not created yet (serve creates it): its mount point is judged.
    let tmpfs = TmpfsMount::new(&dir.root.join("run"), "1m", MsFlags::empty());
    let run = tmpfs.path().join("stickyvol");
    let report = run_doctor_with(&kubelet, &data, &run_flag(&run));
    assert_consistent(&report);
    assert_eq!(report.failures(), 0, "{}", report.stdout);
    let writable = report.check(&format!("run directory {}", run.display()));
    assert_eq!(writable.outcome, Outcome::Ok, "{}", report.stdout);
    assert!(
        writable.what.starts_with(&format!(
            "run directory {} (not created yet; checked {}) is writable",
            run.display(),
            tmpfs.path().display()
        )),
        "{}",
        writable.what
    );
    assert_eq!(
        report.check("run directory on tmpfs").outcome,
        Outcome::Ok,
        "{}",
        report.stdout
    );
    assert!(!exists_no_follow(&run), "doctor created the run directory");

    // On the scratch directory's disk (ext4): works, but a reboot does not empty it.
    let report = run_doctor_with(&kubelet, &data, &run_flag(&dir.root.join("run-on-disk")));
    assert_consistent(&report);
    assert_eq!(report.failures(), 0, "{}", report.stdout);
    let filesystem = report.check("run directory on ");
    assert_eq!(filesystem.outcome, Outcome::Warn, "{}", report.stdout);
    assert!(
        filesystem.what.contains("which a reboot does not empty"),
        "{}",
        filesystem.what
    );

    // Beneath a read-only mount (a container's read-only root without the hostPath): fails.
    let read_only = TmpfsMount::new(&dir.root.join("ro"), "1m", MsFlags::MS_RDONLY);
    let report = run_doctor_with(
        &kubelet,
        &data,
        &run_flag(&read_only.path().join("stickyvol")),
    );
    assert_consistent(&report);
    assert_eq!(
        report.check("is not writable").outcome,
        Outcome::Fail,
        "{}",
        report.stdout
    );
    assert!(
        report
            .check("is not writable")
            .what
            .starts_with("run directory "),
        "{}",
        report.stdout
    );
    assert_eq!(report.failures(), 1, "{}", report.stdout);

    // A file where the directory should be: fails.
    let file = dir.root.join("a-file");
    fs::write(&file, b"").unwrap();
    let report = run_doctor_with(&kubelet, &data, &run_flag(&file));
    assert_consistent(&report);
    assert_eq!(
        report.check("is not a directory").outcome,
        Outcome::Fail,
        "{}",
        report.stdout
    );

    // A relative path is refused before any check, as serve refuses it.
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_stickyvol"))
        .args(["doctor", "--run-dir", "run"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--run-dir must be an absolute path"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}
