//! host::projquota against real, loop-backed XFS and ext4 filesystems.
//!
//! With project quota (XFS `-o prjquota`, ext4 `-O quota,project` + `-o prjquota`) the tests
//! assign a project, set a limit, write past it and check usage. A kernel without quota support
//! refuses those mounts; the tests then record a skip of "project-quota" (tests/common/skip.rs),
//! which CI allows only because tests/vm/run-quota-tests runs them in a VM whose kernel has
//! quota, where the skip is a failure. What works without quota (the project id in the inode,
//! the "quota is off" answers) is tested on every filesystem we can mount here: XFS and ext4
//! without quota, btrfs, tmpfs.

mod common;

use common::{fallocate, over_project_limit_errno};

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::symlink;
use std::path::Path;

use common::caps;
use common::mounts::TmpfsMount;
use common::scratchfs::ScratchFs;
use nix::mount::MsFlags;
use stickyvol::host::projquota::{self, ProjectIds};

const MIB: u64 = 1 << 20;
const PROJECT: u32 = 1_000_000_007;

/// Appends 1 MiB chunks, each made durable, until `total` or an error: (bytes written, error).
/// fsync makes delayed allocation (ext4, XFS) charge the blocks now rather than at writeback.
fn write_until_error(file: &mut File, total: u64) -> (u64, Option<io::Error>) {
    let chunk = vec![0xa5_u8; MIB as usize];
    let mut written = 0;
    while written < total {
        let result = file
            .write(&chunk)
            .and_then(|n| file.sync_data().map(|()| n));
        match result {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(err) => return (written, Some(err)),
        }
    }
    (written, None)
}

/// The whole cycle on a filesystem mounted with project quota.
fn limits_are_enforced_and_usage_is_exact(fs: &ScratchFs) {
    let root = &fs.mount_point;
    assert!(projquota::project_quota_enabled(root).unwrap());

    // Allocation probes the filesystem: an id charged with usage (files tagged with it, no
    // limit) is avoided while an unused one is found.
    fs::create_dir(fs.path("other")).unwrap();
    projquota::assign_project(&fs.path("other"), PROJECT).unwrap();
    fs::write(fs.path("other/file"), b"someone else's").unwrap();
    assert!(projquota::project_in_use(root, PROJECT).unwrap());
    assert_eq!(
        projquota::project_use(root, PROJECT).unwrap(),
        projquota::IdUse::Charged
    );
    let ids = ProjectIds::new(PROJECT..PROJECT + 2, []);
    let lease = ids.allocate(|id| projquota::project_use(root, id)).unwrap();
    assert_eq!(lease.id(), PROJECT + 1);
    let id = lease.commit();

    let vol = fs.path("vol");
    fs::create_dir(&vol).unwrap();
    projquota::assign_project(&vol, id).unwrap();
    assert_eq!(projquota::project_of(&vol).unwrap(), (id, true));
    projquota::set_project_limit(root, id, 10 * MIB).unwrap();
    let usage = projquota::project_usage(root, id).unwrap();
    assert_eq!(usage.hard_limit_bytes, Some(10 * MIB), "{usage:?}");
    assert_eq!(
        projquota::project_use(root, id).unwrap(),
        projquota::IdUse::Limited
    );
    // Q_GETNEXTQUOTA finds both, and nothing else in the range; `at_most` bounds the answer.
    let found = projquota::projects_in_use(root, PROJECT - 5..PROJECT + 1000, 10).unwrap();
    assert_eq!(found, vec![PROJECT, id]);
    let first = projquota::projects_in_use(root, PROJECT - 5..PROJECT + 1000, 1).unwrap();
    assert_eq!(first, vec![PROJECT]);

    // Everything created below inherits the project.
    fs::create_dir(vol.join("sub")).unwrap();
    assert_eq!(projquota::project_of(&vol.join("sub")).unwrap(), (id, true));

    let mut file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(vol.join("sub/data"))
        .unwrap();
    // As a pod writes: without CAP_SYS_RESOURCE, which lets root past ext4's limits.
    let expected = over_project_limit_errno(&fs.fs_type);
    let (written, err) = caps::without_sys_resource(|| write_until_error(&mut file, 20 * MIB));
    let err = err.expect("20 MiB fit under a 10 MiB project limit");
    eprintln!(
        "measured ({}): write(2) past a 10 MiB project limit failed after {written} bytes: {err}",
        fs.fs_type
    );
    assert_eq!(err.raw_os_error(), Some(expected), "{err}");
    assert!((8 * MIB..=10 * MIB).contains(&written), "{written}");
    let err = caps::without_sys_resource(|| fallocate(&file, written, 4 * MIB))
        .expect_err("fallocate past the limit");
    eprintln!("measured ({}): fallocate past the limit: {err}", fs.fs_type);
    assert_eq!(err.raw_os_error(), Some(expected), "{err}");

    let usage = projquota::project_usage(root, id).unwrap();
    assert!(
        (written..=written + MIB).contains(&usage.used_bytes),
        "{usage:?} after {written} bytes"
    );
    assert!(usage.inodes >= 3, "vol, sub, data: {usage:?}");

    // Raising the limit (expansion) lets more in; clearing it removes it.
    projquota::set_project_limit(root, id, 30 * MIB).unwrap();
    let (more, err) = caps::without_sys_resource(|| write_until_error(&mut file, 10 * MIB));
    assert!(err.is_none() && more == 10 * MIB, "{more} {err:?}");
    projquota::clear_project_limit(root, id).unwrap();
    assert_eq!(
        projquota::project_usage(root, id).unwrap().hard_limit_bytes,
        None
    );

    // Limits are rounded up, never down: to whole KiB (the quota block), and XFS keeps them in
    // filesystem blocks (4 KiB here).
    projquota::set_project_limit(root, id, 10 * MIB + 1).unwrap();
    let limit = projquota::project_usage(root, id).unwrap().hard_limit_bytes;
    let expected = match fs.fs_type.as_str() {
        "xfs" => 10 * MIB + 4096,
        _ => 10 * MIB + 1024,
    };
    assert_eq!(limit, Some(expected), "{}", fs.fs_type);
}

#[test]
fn xfs_project_quota_limits_writes() {
    let mkfs = ["-q", "-f"];
    if let Some(fs) = ScratchFs::new_with_project_quota("xfs", 512 * MIB, &mkfs, "prjquota") {
        limits_are_enforced_and_usage_is_exact(&fs);
    }
}

/// ext4 with the quota feature turns accounting on by itself at mount; `-o prjquota` turns on
/// enforcement of project limits (without it, limits are stored but never enforced: tested in
/// tests/project_quota.rs).
#[test]
fn ext4_project_quota_limits_writes() {
    let mkfs = ["-q", "-F", "-O", "quota,project"];
    if let Some(fs) = ScratchFs::new_with_project_quota("ext4", 128 * MIB, &mkfs, "prjquota") {
        limits_are_enforced_and_usage_is_exact(&fs);
    }
}

/// Root keeps CAP_SYS_RESOURCE past ext4's limits (the VFS quota code ignores hard limits for
/// it), XFS stops it all the same: a privileged pod can fill an ext4 pool past its volume's size.
#[test]
fn root_with_cap_sys_resource_passes_ext4_limits_but_not_xfs_limits() {
    for (fs_type, mkfs, size) in [
        ("xfs", &["-q", "-f"][..], 512 * MIB),
        ("ext4", &["-q", "-F", "-O", "quota,project"][..], 128 * MIB),
    ] {
        let Some(fs) = ScratchFs::new_with_project_quota(fs_type, size, mkfs, "prjquota") else {
            return;
        };
        assert!(caps::has_sys_resource(), "the tests run as root");
        let vol = fs.path("vol");
        fs::create_dir(&vol).unwrap();
        projquota::assign_project(&vol, PROJECT).unwrap();
        projquota::set_project_limit(&fs.mount_point, PROJECT, 4 * MIB).unwrap();
        let mut file = File::create(vol.join("data")).unwrap();
        let (written, err) = write_until_error(&mut file, 8 * MIB);
        eprintln!(
            "measured ({fs_type}): root with CAP_SYS_RESOURCE wrote {written} bytes under a 4 MiB limit: {err:?}"
        );
        if fs_type == "xfs" {
            let err = err.expect("XFS enforces project limits on root too");
            assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        } else {
            assert!(err.is_none() && written == 8 * MIB, "{written} {err:?}");
        }
    }
}

/// Project ids in the inode, with quota off: `settable` says whether a non-zero id sticks.
fn project_ids_without_quota(root: &Path, what: &str, settable: bool) {
    let quota = projquota::project_quota_enabled(root);
    eprintln!("measured ({what}): project_quota_enabled = {quota:?}");
    assert!(!quota.unwrap(), "{what}");
    // Without quota there is no usage to read, and the allocation probe fails rather than
    // guess.
    let err = projquota::project_in_use(root, PROJECT).unwrap_err();
    assert!(
        [libc::ESRCH, libc::ENOSYS].contains(&err.raw_os_error().unwrap_or(0)),
        "{what}: {err}"
    );

    let dir = root.join("vol");
    fs::create_dir(&dir).unwrap();
    let before = projquota::project_of(&dir).unwrap();
    eprintln!("measured ({what}): a fresh directory has (projid, inherit) = {before:?}");
    assert_eq!(before, (0, false), "{what}");

    let assigned = projquota::assign_project(&dir, PROJECT);
    eprintln!("measured ({what}): assign_project = {assigned:?}");
    if settable {
        assigned.unwrap();
        assert_eq!(projquota::project_of(&dir).unwrap(), (PROJECT, true));
        fs::create_dir(dir.join("child")).unwrap();
        assert_eq!(
            projquota::project_of(&dir.join("child")).unwrap(),
            (PROJECT, true)
        );
        // Back to project 0, the one every file starts in; the inherit flag stays.
        projquota::assign_project(&dir, 0).unwrap();
        assert_eq!(projquota::project_of(&dir).unwrap(), (0, true));
    } else {
        let err = assigned.unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EOPNOTSUPP), "{what}: {err}");
        // ext4 sets the inherit flag before it refuses the id; btrfs and tmpfs refuse both.
        let ext4 = stickyvol::host::fsstat::filesystem_kind(root).unwrap()
            == stickyvol::host::fsstat::FsKind::Ext4;
        let after = projquota::project_of(&dir).unwrap();
        eprintln!("measured ({what}): after the refused assignment (projid, inherit) = {after:?}");
        assert_eq!(after, (0, ext4), "{what}");
        // Project 0 plus the inherit flag: ext4 takes it, btrfs and tmpfs refuse the flag.
        let zero = projquota::assign_project(&dir, 0);
        eprintln!("measured ({what}): assign_project(0) = {zero:?}");
        if ext4 {
            zero.unwrap();
            assert_eq!(projquota::project_of(&dir).unwrap(), (0, true), "{what}");
        } else {
            let err = zero.unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EOPNOTSUPP), "{what}: {err}");
            assert_eq!(projquota::project_of(&dir).unwrap(), (0, false), "{what}");
        }
    }

    // Symlinks are not followed.
    symlink("vol", root.join("link")).unwrap();
    let err = projquota::assign_project(&root.join("link"), PROJECT).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR), "{what}: {err}");
    let err = projquota::project_of(&root.join("link")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR), "{what}: {err}");
}

#[test]
fn xfs_without_quota_keeps_project_ids() {
    let fs = ScratchFs::new("xfs", 512 * MIB, &["-q", "-f"], "");
    project_ids_without_quota(&fs.mount_point, "xfs, no quota", true);
}

#[test]
fn ext4_with_the_project_feature_keeps_project_ids_without_quota() {
    // A kernel without quota support refuses to mount the project feature as well.
    let mkfs = ["-q", "-F", "-O", "project"];
    if let Some(fs) = ScratchFs::new_with_project_quota("ext4", 64 * MIB, &mkfs, "") {
        project_ids_without_quota(&fs.mount_point, "ext4 -O project, no quota", true);
    }
}

#[test]
fn ext4_without_the_project_feature_refuses_project_ids() {
    let fs = ScratchFs::new("ext4", 64 * MIB, &["-q", "-F"], "");
    project_ids_without_quota(&fs.mount_point, "ext4", false);
}

#[test]
fn btrfs_reads_but_refuses_project_ids() {
    let fs = ScratchFs::new("btrfs", 256 * MIB, &["-q"], "");
    project_ids_without_quota(&fs.mount_point, "btrfs", false);
}

#[test]
fn tmpfs_project_ids() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let mount = TmpfsMount::new(dir.path(), "4m", MsFlags::empty());
    project_ids_without_quota(dir.path(), "tmpfs", false);
    drop(mount);
}

/// The entry point of the tenant's runs (tests/common/tenant.rs); does nothing in a test run.
#[test]
fn tenant_act() {
    common::tenant::act_if_asked();
}

/// `host::projtree` on XFS, where project ids stick without quota: a tenant (uid 1000, no
/// capabilities) moves a directory and a file out of the volume's project and another file into
/// a neighbour's; the repair puts back exactly those, with the inherit flag on the directory,
/// and leaves alone what it must not touch: a symlink's target outside the tree, a FIFO (never
/// opened: the walk would hang), a mount inside the tree.
#[test]
fn a_repair_puts_back_what_a_tenant_moved_out_of_the_project() {
    use common::tenant::{Action, act};
    use stickyvol::host::projtree;
    use stickyvol::host::tree::Budget;

    let fs = ScratchFs::new("xfs", 512 * MIB, &["-q", "-f"], "");
    let vol = fs.path("vol");
    let outside = fs.path("outside");
    for dir in [&vol, &outside] {
        fs::create_dir(dir).unwrap();
    }
    fs::set_permissions(&vol, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    projquota::assign_project(&vol, PROJECT).unwrap();
    let neighbour = PROJECT + 1;
    for step in [
        Action::Mkdir("escape"),
        Action::SetProject("escape", 0),
        Action::Write("escape/big", 3 * MIB),
        Action::Write("kept", MIB),
        Action::Write("theirs", MIB),
        Action::SetProject("theirs", neighbour),
        Action::Mkdir("flat"),
        Action::ClearInherit("flat"),
        Action::Write("flat/file", MIB),
    ] {
        act(&vol, step).unwrap_or_else(|e| panic!("{step:?}: {e}"));
    }
    // The tenant's own files, moved by itself, without privilege.
    assert_eq!(
        projquota::project_of(&vol.join("escape")).unwrap(),
        (0, true)
    );
    assert_eq!(
        projquota::project_of(&vol.join("flat")).unwrap(),
        (PROJECT, false)
    );
    assert_eq!(stickyvol_project_of_file(&vol.join("flat/file")), 0);
    symlink(&outside, vol.join("link")).unwrap();
    nix::unistd::mkfifo(
        &vol.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o666),
    )
    .unwrap();
    let mount = TmpfsMount::new(&vol.join("mnt"), "1m", MsFlags::empty());
    fs::write(vol.join("mnt/inside"), b"x").unwrap();

    let repairs = projtree::repair_tree(&vol, PROJECT, Budget::WHOLE_TREE, &|| false).unwrap();
    eprintln!("{repairs:?}");
    // escape (0, inherit kept), escape/big (0, inherited), theirs (neighbour), flat (ours but
    // without the inherit flag), flat/file (0, made below it).
    assert_eq!(repairs.repaired, 5, "{repairs:?}");
    assert_eq!(
        repairs.foreign,
        [(0, 3), (PROJECT, 1), (neighbour, 1)].into()
    );
    assert_eq!(repairs.unchecked, 0);
    let project = |p: &Path| stickyvol_project_of_file(p);
    for dir in ["escape", "flat"] {
        let found = projquota::project_of(&vol.join(dir)).unwrap();
        assert_eq!(found, (PROJECT, true), "{dir}");
    }
    for file in ["escape/big", "kept", "theirs", "flat/file"] {
        assert_eq!(project(&vol.join(file)), PROJECT, "{file}");
    }
    assert_eq!(
        projquota::project_of(&outside).unwrap(),
        (0, false),
        "followed a symlink"
    );
    assert_eq!(project(&vol.join("mnt/inside")), 0, "crossed a mount");

    // A clean tree: nothing to repair, and a stop request ends the walk.
    let again = projtree::repair_tree(&vol, PROJECT, Budget::WHOLE_TREE, &|| false).unwrap();
    assert_eq!((again.repaired, again.inodes), (0, repairs.inodes));
    let stopped = projtree::repair_tree(&vol, PROJECT, Budget::WHOLE_TREE, &|| true).unwrap_err();
    assert!(stopped.to_string().contains("cancel"), "{stopped}");
    drop(mount);
}

/// What an audit of an untouched tree costs: 20,000 files in 100 directories, walked twice.
#[test]
fn a_clean_repair_walk_is_cheap() {
    use stickyvol::host::projtree;
    use stickyvol::host::tree::Budget;

    let fs = ScratchFs::new("xfs", 512 * MIB, &["-q", "-f"], "");
    let vol = fs.path("vol");
    fs::create_dir(&vol).unwrap();
    projquota::assign_project(&vol, PROJECT).unwrap();
    for d in 0..100 {
        let dir = vol.join(format!("d{d}"));
        fs::create_dir(&dir).unwrap();
        for f in 0..200 {
            File::create(dir.join(format!("f{f}"))).unwrap();
        }
    }
    for round in 0..2 {
        let started = std::time::Instant::now();
        let repairs = projtree::repair_tree(&vol, PROJECT, Budget::WHOLE_TREE, &|| false).unwrap();
        let took = started.elapsed();
        eprintln!(
            "measured: audit of a clean tree of {} inodes (round {round}): {took:?}",
            repairs.inodes
        );
        assert_eq!((repairs.inodes, repairs.repaired), (20_101, 0));
    }
}

/// The project id of a regular file (project_of opens directories only).
fn stickyvol_project_of_file(path: &Path) -> u32 {
    use std::os::fd::AsFd;
    let file = File::open(path).unwrap();
    projquota::project_of_fd(file.as_fd()).unwrap().0
}
