//! `stickyvol doctor`: checks that a node can run the driver and says why not.
//!
//! Run by hand or as the DaemonSet's init container, so a broken node explains itself in
//! `kubectl logs`. Each check is ok, a warning (something will be missing) or a failure (the
//! driver cannot work here); any failure makes the exit status non-zero.

pub mod versions;

use std::fmt;
use std::path::{Path, PathBuf};

use crate::config::DoctorConfig;
use crate::host::fsimage::{self, FsType};
use crate::host::fsstat::{self, FsKind};
use crate::host::mountinfo::{self, MountEntry};
use crate::host::{btrfs, projquota};
use crate::volume::space::full::FULL_BELOW_BYTES;
use crate::volume::space::mechanism::Mechanism;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Clone)]
pub struct Check {
    pub outcome: Outcome,
    pub what: String,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.outcome {
            Outcome::Ok => "[ok]  ",
            Outcome::Warn => "[warn]",
            Outcome::Fail => "[FAIL]",
        };
        write!(f, "{tag} {}", self.what)
    }
}

fn check(outcome: Outcome, what: impl Into<String>) -> Check {
    Check {
        outcome,
        what: what.into(),
    }
}

/// Runs every check; nothing is created or changed except two scratch files for the reflink probe.
/// The extra pools (`--pool NAME=PATH`, and `--optional-pool`s whose directory exists) are
/// checked like the data directory.
pub fn run(config: &DoctorConfig) -> Vec<Check> {
    let mounts = mountinfo::read_self();
    let mut checks = vec![
        privileges(),
        versions::kernel(),
        mount_roots(),
        loop_control(),
    ];
    checks.extend(versions::kubernetes());
    checks.extend(data_directory("data directory", config.data_dir()));
    for pool in &config.pools[1..] {
        let label = format!("pool {}", pool.name);
        if pool.present() {
            checks.extend(data_directory(&label, &pool.path));
        } else {
            checks.push(check(
                Outcome::Ok,
                format!(
                    "{label} (optional) is absent: {} does not exist, so this node gets no volumes of it",
                    pool.path.display()
                ),
            ));
        }
    }
    checks.extend(run_directory(config));
    checks.extend(FsType::ALL.map(image_tools));
    checks.push(encryption());
    checks.push(match &mounts {
        Ok(mounts) => propagation(&config.kubelet_dir, mounts),
        Err(err) => check(
            Outcome::Fail,
            format!("cannot read /proc/self/mountinfo: {err}"),
        ),
    });
    checks
}

/// Whether image volumes of `fs` can be made and grown here. A warning, not a failure: the
/// node still serves directory and block volumes, and offers no capacity for such a class.
fn image_tools(fs: FsType) -> Check {
    match fs.missing_tool() {
        None if fs == FsType::Ext4 && !fsimage::has_sys_resource() => check(
            Outcome::Warn,
            "image volumes of ext4: the tools are there, but without CAP_SYS_RESOURCE a mounted ext4 cannot grow (NodeExpandVolume fails); run the node plugin privileged",
        ),
        None => check(
            Outcome::Ok,
            format!(
                "image volumes of {0}: {1} found",
                fs.name(),
                fs.tools().join(" and ")
            ),
        ),
        Some(tool) => check(
            Outcome::Warn,
            format!(
                "image volumes of {0} (a StorageClass with csi.storage.k8s.io/fstype: {0}) cannot be made here: no {tool} on PATH; this node refuses them and offers no capacity for them",
                fs.name()
            ),
        ),
    }
}

/// Whether encrypted volumes (`encryption: luks2`) can be made here. A warning: the node
/// serves everything else, and refuses an encrypted class at CreateVolume with the same reason.
fn encryption() -> Check {
    match crate::host::crypt::unavailable() {
        None => check(
            Outcome::Ok,
            "encrypted volumes (encryption: luks2): device mapper and cryptsetup found",
        ),
        Some(why) => check(
            Outcome::Warn,
            format!(
                "encrypted volumes (a StorageClass with encryption: luks2) cannot be made here: {why}; this node refuses them"
            ),
        ),
    }
}

/// The report as printed, and whether the node is fit (no failure).
pub fn report(checks: &[Check]) -> (String, bool) {
    let failures = checks.iter().filter(|c| c.outcome == Outcome::Fail).count();
    let mut text = String::from("stickyvol doctor\n");
    for c in checks {
        text.push_str(&format!("  {c}\n"));
    }
    if failures == 0 {
        text.push_str("result: this node can run stickyvol\n");
    } else {
        text.push_str(&format!(
            "result: this node cannot run stickyvol ({failures} failed check{})\n",
            if failures == 1 { "" } else { "s" }
        ));
    }
    (text, failures == 0)
}

fn privileges() -> Check {
    if nix::unistd::geteuid().is_root() {
        check(
            Outcome::Ok,
            "running as root (mount(2) and loop devices need it)",
        )
    } else {
        check(
            Outcome::Fail,
            "not running as root: bind mounts and loop devices need root (a privileged container)",
        )
    }
}

fn mount_roots() -> Check {
    match fsstat::lstat(Path::new("/")) {
        Ok(_) => check(
            Outcome::Ok,
            "kernel reports mount points through statx (Linux 5.8+)",
        ),
        Err(err) => check(
            Outcome::Fail,
            format!("kernel cannot report mount points through statx: {err}"),
        ),
    }
}

fn loop_control() -> Check {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
    {
        Ok(_) => check(Outcome::Ok, "/dev/loop-control is usable (block volumes)"),
        Err(err) => check(
            Outcome::Warn,
            format!(
                "/dev/loop-control is not usable ({err}): block volumes will fail; mount /dev into the container and load the loop module"
            ),
        ),
    }
}

/// Checks a directory that holds volumes; `label` names it in the report ("data directory",
/// "pool fast").
fn data_directory(label: &str, data_dir: &Path) -> Vec<Check> {
    // The driver creates the data dir at start; before that, judge the nearest existing ancestor.
    let existing = nearest_existing(data_dir);
    let mut checks = vec![writable(label, data_dir, &existing, true)];
    let kind = match fsstat::filesystem_kind(&existing) {
        Ok(kind) => kind,
        Err(err) => {
            checks.push(check(
                Outcome::Warn,
                format!("cannot tell the filesystem of the {label}: {err}"),
            ));
            return checks;
        }
    };
    checks.push(check(
        Outcome::Ok,
        format!(
            "{label} filesystem: {}; size enforcement it offers: {}",
            kind.name(),
            size_enforcement(kind, quota_on(kind, &existing))
        ),
    ));
    match kind {
        FsKind::Tmpfs => checks.push(check(
            Outcome::Warn,
            format!("the {label} is on tmpfs: volumes do not survive a node reboot"),
        )),
        FsKind::Overlay => checks.push(check(
            Outcome::Warn,
            format!("the {label} is on overlayfs (a container's own layer?): mount a host directory there"),
        )),
        _ => {}
    }
    // What `serve` would use for snapshots, restores and clones (see volume::copies::cow).
    let subvolumes = kind == FsKind::Btrfs && quota_on(kind, &existing) == Some(true);
    let cow = match fsstat::supports_reflink(&existing) {
        Ok(reflink) => {
            let mechanism = Mechanism::choose(kind, subvolumes, reflink);
            format!(
                "{}; snapshots, restores and clones use {}",
                if reflink { "yes" } else { "no" },
                mechanism.describe()
            )
        }
        Err(err) => format!("unknown ({err}); snapshots would be full copies"),
    };
    checks.push(check(
        Outcome::Ok,
        format!("copy-on-write on the {label}: {cow}"),
    ));
    checks
}

/// Whether `wanted` takes writes and has room, judged by `existing`: itself, or before it is
/// created its nearest existing ancestor. A full `data` directory (or pool) is a warning.
fn writable(label: &str, wanted: &Path, existing: &Path, data: bool) -> Check {
    let writable = nix::unistd::access(existing, nix::unistd::AccessFlags::W_OK).is_ok();
    match (fsstat::space(existing), writable) {
        // A full run directory fails every publish. A full data directory only warns: the
        // driver starts and frees space on it (see `volume::space::full`), which a failure here, in
        // an init container, would prevent.
        (Ok(space), true) if !space.read_only && space.available_bytes == 0 && !data => check(
            Outcome::Fail,
            format!("{label} {} has no free space", shown(wanted, existing)),
        ),
        (Ok(space), true)
            if !space.read_only && space.available_bytes < FULL_BELOW_BYTES && data =>
        {
            check(
                Outcome::Warn,
                format!(
                    "{label} {} is full ({} bytes free): new volumes are refused until space is freed (delete volumes, or files a tenant wrote where sizes are not enforced)",
                    shown(wanted, existing),
                    space.available_bytes
                ),
            )
        }
        (Ok(space), true) if !space.read_only => check(
            Outcome::Ok,
            format!(
                "{label} {} is writable ({} of {} bytes free)",
                shown(wanted, existing),
                space.available_bytes,
                space.total_bytes
            ),
        ),
        (Ok(_), _) => check(
            Outcome::Fail,
            format!("{label} {} is not writable", shown(wanted, existing)),
        ),
        (Err(err), _) => check(
            Outcome::Fail,
            format!("{label} {}: {err}", shown(wanted, existing)),
        ),
    }
}

/// Where `serve` will keep publications (which targets each volume is published at). A run
/// directory must take writes (every publish and unpublish writes there) and should be one a
/// reboot empties, as a reboot removes the mounts and loop devices the publications describe.
fn run_directory(config: &DoctorConfig) -> Vec<Check> {
    let Some(run_dir) = &config.run_dir else {
        return vec![check(
            Outcome::Ok,
            format!(
                "no --run-dir: publications are kept beside the records in {}; after a reboot, the next start forgets them",
                config.data_dir().join("state").display()
            ),
        )];
    };
    let existing = nearest_existing(run_dir);
    if !existing.is_dir() {
        return vec![check(
            Outcome::Fail,
            format!(
                "run directory {}: {} is not a directory",
                run_dir.display(),
                existing.display()
            ),
        )];
    }
    let filesystem = match fsstat::filesystem_kind(&existing) {
        Ok(FsKind::Tmpfs) => check(
            Outcome::Ok,
            "run directory on tmpfs: a reboot empties it, as it removes the mounts its publications describe",
        ),
        Ok(FsKind::Overlay) => check(
            Outcome::Warn,
            "run directory on overlayfs (a container's own layer?): a restarted container would forget publications whose mounts remain; mount a host directory there (the DaemonSet: the host's /run/stickyvol)",
        ),
        Ok(kind) => check(
            Outcome::Warn,
            format!(
                "run directory on {}, which a reboot does not empty: publications outlive their mounts until the next start forgets them; a tmpfs such as the host's /run avoids that",
                kind.name()
            ),
        ),
        Err(err) => check(
            Outcome::Warn,
            format!("cannot tell the filesystem of the run directory: {err}"),
        ),
    };
    vec![
        writable("run directory", run_dir, &existing, false),
        filesystem,
    ]
}

/// Whether the quota the filesystem's enforcement needs is on, asked the way `serve` asks
/// (None: the filesystem has no such quota, or the kernel would not say).
fn quota_on(kind: FsKind, dir: &Path) -> Option<bool> {
    match kind {
        FsKind::Btrfs => btrfs::quota_enabled(dir).ok(),
        FsKind::Xfs | FsKind::Ext4 => projquota::project_quota_enabled(dir).ok(),
        _ => None,
    }
}

/// What `serve --enforcement NAME=auto` would use on this filesystem, and how to get more.
fn size_enforcement(kind: FsKind, quota_on: Option<bool>) -> String {
    let on = quota_on == Some(true);
    match kind {
        FsKind::Btrfs if on => "btrfs qgroups (a subvolume per volume)".into(),
        FsKind::Btrfs => {
            "none until btrfs quota is on (`serve --enforcement NAME=btrfs` turns it on)".into()
        }
        FsKind::Xfs | FsKind::Ext4 if on => format!("{} project quotas", kind.name()),
        FsKind::Xfs => "none (mount with prjquota for project quotas)".into(),
        FsKind::Ext4 => {
            "none (needs the project and quota features and the prjquota mount option)".into()
        }
        _ => "none (sizes are measured, not enforced)".into(),
    }
}

/// Bind mounts the driver makes under the kubelet dir must reach kubelet and the pods: the
/// kubelet dir's mount must be shared (in a container: mountPropagation Bidirectional).
fn propagation(kubelet_dir: &Path, mounts: &[MountEntry]) -> Check {
    let existing = nearest_existing(kubelet_dir);
    let Some(mount) = containing_mount(mounts, &existing) else {
        return check(
            Outcome::Fail,
            format!("no mount contains {}", existing.display()),
        );
    };
    if mount
        .optional_fields
        .iter()
        .any(|f| f.starts_with("shared:"))
    {
        check(
            Outcome::Ok,
            format!(
                "kubelet directory {} is on a shared mount ({}): mounts propagate to kubelet",
                kubelet_dir.display(),
                mount.mount_point.display()
            ),
        )
    } else {
        check(
            Outcome::Fail,
            format!(
                "kubelet directory {} is on a private mount ({}): volumes would not reach pods; \
                 mount it with mountPropagation: Bidirectional (and make it shared on the host)",
                kubelet_dir.display(),
                mount.mount_point.display()
            ),
        )
    }
}

/// The mount that holds `path`: the deepest mount point above it, the last mounted on ties.
fn containing_mount<'a>(mounts: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    mounts
        .iter()
        .filter(|m| path.starts_with(&m.mount_point))
        .fold(None, |best: Option<&MountEntry>, m| match best {
            Some(b) if b.mount_point.components().count() > m.mount_point.components().count() => {
                Some(b)
            }
            _ => Some(m),
        })
}

fn nearest_existing(path: &Path) -> PathBuf {
    path.ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"))
        .to_path_buf()
}

fn shown(wanted: &Path, existing: &Path) -> String {
    if wanted == existing {
        wanted.display().to_string()
    } else {
        format!(
            "{} (not created yet; checked {})",
            wanted.display(),
            existing.display()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(mount_point: &str, optional: &[&str]) -> MountEntry {
        MountEntry {
            mount_id: 1,
            parent_id: 0,
            major: 0,
            minor: 0,
            root: "/".into(),
            mount_point: mount_point.into(),
            mount_options: "rw".into(),
            optional_fields: optional.iter().map(|s| s.to_string()).collect(),
            fs_type: "ext4".into(),
            source: "/dev/x".into(),
            super_options: "rw".into(),
        }
    }

    #[test]
    fn the_deepest_latest_mount_contains_a_path() {
        let mounts = vec![
            entry("/", &["shared:1"]),
            entry("/var", &[]),
            entry("/var", &["shared:7"]),
        ];
        let found =
            containing_mount(&mounts, Path::new("/var/lib/kubelet-does-not-exist")).unwrap();
        assert_eq!(found.optional_fields, vec!["shared:7"]);
        assert_eq!(
            propagation(Path::new("/var/x"), &mounts).outcome,
            Outcome::Ok
        );
        let private = vec![entry("/", &[])];
        assert_eq!(
            propagation(Path::new("/var/x"), &private).outcome,
            Outcome::Fail
        );
    }

    #[test]
    fn size_enforcement_follows_filesystem_and_options() {
        assert!(size_enforcement(FsKind::Xfs, Some(true)).contains("project"));
        assert!(size_enforcement(FsKind::Xfs, Some(false)).starts_with("none"));
        assert!(size_enforcement(FsKind::Ext4, None).starts_with("none"));
        assert!(size_enforcement(FsKind::Btrfs, Some(true)).contains("qgroups"));
        assert!(size_enforcement(FsKind::Btrfs, Some(false)).contains("--enforcement"));
        assert!(size_enforcement(FsKind::Tmpfs, None).starts_with("none"));
    }

    #[test]
    fn an_absent_optional_pool_is_reported_and_left_uncreated() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        let config = crate::config::DoctorConfig {
            kubelet_dir: dir.path().to_path_buf(),
            pools: vec![
                pool("default", dir.path().join("data"), false),
                pool("gone", gone.clone(), true),
            ],
            run_dir: None,
        };
        let checks = run(&config);
        let about_gone: Vec<_> = checks
            .iter()
            .filter(|c| c.what.contains("pool gone"))
            .collect();
        assert_eq!(about_gone.len(), 1, "{checks:?}");
        assert_eq!(about_gone[0].outcome, Outcome::Ok);
        assert!(about_gone[0].what.contains("absent"), "{}", about_gone[0]);
        assert!(!gone.exists());

        // Once its directory exists, it is checked like any pool.
        std::fs::create_dir(&gone).unwrap();
        let checks = run(&config);
        assert!(
            checks
                .iter()
                .any(|c| c.what.contains("pool gone filesystem")),
            "{checks:?}"
        );
    }

    fn pool(name: &str, path: PathBuf, optional: bool) -> crate::config::PoolConfig {
        crate::config::PoolConfig {
            name: name.into(),
            path,
            optional,
            enforcement: crate::config::EnforcementChoice::Auto,
            overcommit: 1.0,
            kubelet_reserve: crate::config::KubeletReserve {
                kubelet_dir: "/var/lib/kubelet".into(),
                percent: 0,
            },
        }
    }

    #[test]
    fn failures_make_the_report_unfit() {
        let (_, fit) = report(&[check(Outcome::Ok, "a"), check(Outcome::Warn, "b")]);
        assert!(fit);
        let (text, fit) = report(&[check(Outcome::Fail, "c")]);
        assert!(!fit);
        assert!(text.contains("[FAIL] c"));
    }
}
