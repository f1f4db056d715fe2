//! Pools on XFS and ext4: project quotas where the kernel has them, and clear refusals where it
//! does not. On a kernel without XFS/ext4 quota support the tests that need it record a skip of
//! "project-quota" (tests/common/skip.rs); tests/vm/run-quota-tests runs them in a VM whose
//! kernel has it, where such a skip fails.

mod common;

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::scratchfs::ScratchFs;
use common::*;
use csi::volume_usage::Unit;
use stickyvol::host::projquota;
use tonic::Code;

const FS_SIZE: u64 = 512 << 20;

fn snw_mount() -> csi::VolumeCapability {
    mount_cap(Mode::SingleNodeWriter)
}

fn in_pool(parameters: &[(&str, &str)], bytes: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        parameters: params(parameters),
        ..create_request(&new_name(), snw_mount(), bytes)
    }
}

/// A stopped driver whose pool "disk" lives on `fs`.
fn driver_on(fs: &ScratchFs, enforcement: Option<&str>) -> TestDriver {
    let mut driver = TestDriver::prepare(Options::default());
    let pool = fs.mount_point.join("pool");
    driver.add_args(["--pool".to_string(), format!("disk={}", pool.display())]);
    if let Some(choice) = enforcement {
        driver.add_args(["--enforcement".to_string(), format!("disk={choice}")]);
    }
    driver
}

fn ext4() -> ScratchFs {
    ScratchFs::new("ext4", FS_SIZE, &["-q"], "")
}

#[tokio::test]
async fn a_class_requiring_enforcement_refuses_an_ext4_pool_without_project_quota() {
    let fs = ext4();
    let mut driver = driver_on(&fs, None);
    driver.start_again().await;
    assert!(
        driver.log_text().contains("no project quota"),
        "{}",
        driver.log_text()
    );
    let required = [("pool", "disk"), ("requireEnforcement", "true")];
    let status = expect_code(
        driver
            .controller()
            .create_volume(in_pool(&required, 16 * MIB))
            .await,
        Code::ResourceExhausted,
    );
    assert!(
        status.message().contains("\"disk\""),
        "{}",
        status.message()
    );
    assert_eq!(driver.available_capacity(&required, snw_mount()).await, 0);
    // Without the requirement the pool serves, sizes measured but not enforced.
    driver.create(in_pool(&[("pool", "disk")], 16 * MIB)).await;
}

#[tokio::test]
async fn project_enforcement_on_a_filesystem_without_quota_stops_the_driver() {
    let fs = ext4();
    let mut driver = driver_on(&fs, Some("project"));
    let status = driver.try_start_again().await.unwrap_err();
    assert!(!status.success());
    assert!(
        driver.log_text().contains("prjquota"),
        "{}",
        driver.log_text()
    );
}

/// A fresh filesystem with project quota enforced: XFS mounted with prjquota, or ext4 with the
/// project and quota features (the quota feature turns accounting on at mount; prjquota turns
/// on enforcement). None, after recording a skip, where the kernel has no quota support.
fn with_project_quota(fs_type: &str) -> Option<ScratchFs> {
    let mkfs: &[&str] = match fs_type {
        "xfs" => &["-q"],
        _ => &["-q", "-F", "-O", "quota,project"],
    };
    ScratchFs::new_with_project_quota(fs_type, FS_SIZE, mkfs, "prjquota")
}

/// The project id of a volume's directory, which must be its own (non-zero, inherited).
fn project_of_volume(volume: &csi::Volume) -> u32 {
    let (id, inherit) = projquota::project_of(&host_path(volume)).unwrap();
    assert!(
        id != 0 && inherit,
        "{}: ({id}, {inherit})",
        volume.volume_id
    );
    id
}

/// Writes 1 MiB chunks, each synced, as a pod (without CAP_SYS_RESOURCE), until an error:
/// (bytes written, the error). Panics past `at_most` bytes.
fn write_until_error(file: &mut File, at_most: u64) -> (u64, std::io::Error) {
    let chunk = pattern(MIB as usize, 3);
    caps::without_sys_resource(|| {
        let mut written = 0;
        loop {
            match file.write_all(&chunk).and_then(|()| file.sync_data()) {
                Ok(()) => written += MIB as u64,
                Err(err) => return (written, err),
            }
            assert!(written <= at_most, "{written} bytes fit");
        }
    })
}

/// The whole life of two volumes on a pool with project quotas: each gets its own project id
/// with its size as hard limit; a write stops at the size, the neighbour unaffected; stats come
/// from the quota; expansion raises the limit online; deletion clears the limit and frees the
/// id for the next volume.
async fn sizes_are_enforced(fs_type: &str) {
    let Some(fs) = with_project_quota(fs_type) else {
        return;
    };
    let root = fs.mount_point.clone();
    let mut driver = driver_on(&fs, Some("project"));
    driver.start_again().await;
    assert!(
        driver.log_text().contains("enforcement=\"project quotas\""),
        "{}",
        driver.log_text()
    );
    let full = driver.create(in_pool(&[("pool", "disk")], 16 * MIB)).await;
    let neighbour = driver.create(in_pool(&[("pool", "disk")], 16 * MIB)).await;
    let (full_id, neighbour_id) = (project_of_volume(&full), project_of_volume(&neighbour));
    assert_ne!(full_id, neighbour_id, "two volumes share a project id");
    for id in [full_id, neighbour_id] {
        let usage = projquota::project_usage(&root, id).unwrap();
        assert_eq!(
            usage.hard_limit_bytes,
            Some(16 * MIB as u64),
            "{id}: {usage:?}"
        );
    }
    let target = driver.publish_at_new_target(&full, snw_mount()).await;
    let other = driver.publish_at_new_target(&neighbour, snw_mount()).await;
    assert_eq!(projquota::project_of(&target).unwrap(), (full_id, true));

    let mut file = File::create(target.join("big")).unwrap();
    let (written, err) = write_until_error(&mut file, 32 * MIB as u64);
    eprintln!("measured ({fs_type}): a 16 MiB volume took {written} bytes, then: {err}");
    assert_eq!(
        err.raw_os_error(),
        Some(over_project_limit_errno(fs_type)),
        "{err}"
    );
    assert!(
        (12 * MIB as u64..=16 * MIB as u64).contains(&written),
        "{written}"
    );
    // The neighbour still takes its own 16 MiB.
    let mut small = File::create(other.join("small")).unwrap();
    caps::without_sys_resource(|| {
        for _ in 0..8 {
            small.write_all(&pattern(MIB as usize, 4)).unwrap();
        }
        small.sync_data().unwrap();
    });
    // Closed, so XFS trims its speculative preallocation past the end of the file (charged to
    // the project while the file is open).
    drop(small);
    let neighbour_usage = projquota::project_usage(&root, neighbour_id).unwrap();
    assert!(
        (8 * MIB as u64..9 * MIB as u64).contains(&neighbour_usage.used_bytes),
        "{neighbour_usage:?}"
    );

    let stats = driver
        .stats(&full.volume_id, &path_str(&target))
        .await
        .unwrap();
    let bytes = usage_of(&stats, Unit::Bytes).unwrap();
    let quota = projquota::project_usage(&root, full_id).unwrap();
    assert_eq!(bytes.total, 16 * MIB);
    assert_eq!(bytes.used as u64, quota.used_bytes, "{bytes:?} {quota:?}");
    assert!(bytes.used as u64 >= written, "{bytes:?}");
    let inodes = usage_of(&stats, Unit::Inodes).unwrap();
    assert_eq!(inodes.used as u64, quota.inodes, "{inodes:?} {quota:?}");

    let grown = driver
        .expand(expand_request(&full.volume_id, &target, 32 * MIB, 0))
        .await
        .unwrap();
    assert_eq!(grown, 32 * MIB);
    assert_eq!(
        projquota::project_usage(&root, full_id)
            .unwrap()
            .hard_limit_bytes,
        Some(32 * MIB as u64)
    );
    let (more, err) = write_until_error(&mut file, 32 * MIB as u64);
    assert!(
        (12 * MIB as u64..=16 * MIB as u64).contains(&more),
        "{more} {err}"
    );
    drop(file);

    driver.unpublish_ok(&full, &target).await;
    driver.unpublish_ok(&neighbour, &other).await;
    driver.delete(&full.volume_id).await.unwrap();
    let gone = projquota::project_usage(&root, full_id).unwrap();
    assert_eq!(
        (gone.used_bytes, gone.inodes, gone.hard_limit_bytes),
        (0, 0, None),
        "project {full_id} after DeleteVolume"
    );
    assert!(!after_release(&root, || projquota::project_in_use(
        &root, full_id
    )
    .unwrap()));
    // Ids are drawn at random from the range: the next volume gets one of its own.
    let next = driver.create(in_pool(&[("pool", "disk")], 8 * MIB)).await;
    let next_id = project_of_volume(&next);
    assert!(projquota::DEFAULT_PROJECT_ID_RANGE.contains(&next_id));
    assert_ne!(next_id, neighbour_id);
    driver.delete(&next.volume_id).await.unwrap();
    driver.delete(&neighbour.volume_id).await.unwrap();
    for id in [full_id, neighbour_id] {
        let in_use = after_release(&root, || projquota::project_in_use(&root, id).unwrap());
        assert!(!in_use, "{id}");
    }
}

#[tokio::test]
async fn project_quotas_enforce_sizes_where_the_kernel_supports_them() {
    sizes_are_enforced("xfs").await;
}

#[tokio::test]
async fn ext4_project_quotas_enforce_sizes_where_the_kernel_supports_them() {
    sizes_are_enforced("ext4").await;
}

/// ext4 with the quota and project features turns project accounting on at every mount, but
/// enforces limits only when mounted with prjquota: without it a limit is stored and never
/// enforced, so the driver must not count on it.
#[tokio::test]
async fn ext4_with_quota_accounting_but_no_enforcement_is_not_taken_for_enforcement() {
    let mkfs = ["-q", "-F", "-O", "quota,project"];
    let Some(fs) = ScratchFs::new_with_project_quota("ext4", FS_SIZE, &mkfs, "") else {
        return;
    };
    let mut driver = driver_on(&fs, Some("project"));
    let status = driver.try_start_again().await;
    assert!(
        status.is_err(),
        "--enforcement project started on ext4 without prjquota; log:\n{}",
        driver.log_text()
    );
    assert!(
        driver.log_text().contains("prjquota"),
        "{}",
        driver.log_text()
    );
}

/// Directories under `pool` (a few levels down) that carry a project id of their own: the top
/// of each volume's tree, with its id. The driver may be making or removing them meanwhile (a
/// create renames its directory into place; a start removes leftovers on a thread of its own):
/// one gone between listing and opening is not counted.
fn project_dirs(pool: &Path) -> Vec<(PathBuf, u32)> {
    fn walk(dir: &Path, parent_id: u32, depth: u32, found: &mut Vec<(PathBuf, u32)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let id = match projquota::project_of(&path) {
                Ok((id, _)) => id,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => panic!("{}: {e}", path.display()),
            };
            if id != 0 && id != parent_id {
                found.push((path, id));
            } else if depth > 0 {
                walk(&path, id, depth - 1, found);
            }
        }
    }
    let mut found = Vec::new();
    walk(pool, 0, 3, &mut found);
    found
}

/// The ids of `range` that quota says are in use (usage or a limit), by Q_GETNEXTQUOTA.
fn ids_in_use(root: &Path, range: std::ops::Range<u32>) -> BTreeSet<u32> {
    let found = projquota::projects_in_use(root, range, 10_000).unwrap();
    assert!(
        found.len() < 10_000,
        "more projects in use than a test makes"
    );
    found.into_iter().collect()
}

/// `still()` once the filesystem has let go of what was deleted, 30 s at most. XFS frees an
/// unlinked inode, and its charge to its project, in the background (inodegc) a moment after
/// the unlink: in the VM under TCG beside a build, a look right after DeleteVolume found the
/// project still charged. statfs flushes that work.
fn after_release(root: &Path, still: impl Fn() -> bool) -> bool {
    let started = std::time::Instant::now();
    loop {
        let _ = nix::sys::statvfs::statvfs(root);
        let waited = started.elapsed();
        if !still() || waited >= Duration::from_secs(30) {
            if waited >= Duration::from_millis(100) {
                eprintln!("waited {waited:?} for the filesystem to release deleted volumes");
            }
            return still();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The ids of `range` in use once deleted volumes' charges are released (see `after_release`).
fn ids_in_use_after_release(root: &Path, range: std::ops::Range<u32>) -> BTreeSet<u32> {
    after_release(root, || !ids_in_use(root, range.clone()).is_empty());
    ids_in_use(root, range)
}

/// SIGKILL in the middle of concurrent CreateVolumes: at the next start the uncommitted ones
/// are removed ("remove_leftovers") with their limits, and every project id still in use
/// belongs to exactly one volume that ListVolumes shows.
#[tokio::test]
async fn creates_interrupted_by_a_kill_leave_no_project_id_behind() {
    const ROUNDS: u64 = 6;
    let Some(fs) = with_project_quota("xfs") else {
        return;
    };
    let root = fs.mount_point.clone();
    let pool = root.join("pool");
    let range = projquota::DEFAULT_PROJECT_ID_RANGE;
    let mut driver = driver_on(&fs, Some("project"));
    driver.start_again().await;
    let mut rounds_with_leftovers = 0;
    for round in 0..ROUNDS {
        let done_before = project_dirs(&pool).len();
        let controller = driver.controller();
        let creates: Vec<_> = (0..12)
            .map(|_| {
                let mut controller = controller.clone();
                tokio::spawn(async move {
                    controller
                        .create_volume(in_pool(&[("pool", "disk")], 8 * MIB))
                        .await
                })
            })
            .collect();
        // Kill as soon as a few volumes' directories have their project id (the newest
        // probably still uncommitted): watched without yielding, so the kill comes at once.
        tokio::time::sleep(Duration::from_millis(1)).await;
        let wanted = done_before + 1 + round as usize;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while project_dirs(&pool).len() < wanted && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        driver.kill9();
        let mut answered = 0;
        for create in creates {
            if create.await.unwrap().is_ok() {
                answered += 1;
            }
        }
        let before = project_dirs(&pool);
        driver.start_again().await;
        let listed = driver.listed_ids().await;
        assert!(listed.len() >= answered, "{listed:?}, {answered} answered");
        if before.len() > listed.len() {
            rounds_with_leftovers += 1;
        }
        // The leftovers go on a thread of their own after the start.
        let mut settled = false;
        for _ in 0..100 {
            let dirs = project_dirs(&pool);
            let in_use = ids_in_use(&root, range.clone());
            let ids: BTreeSet<u32> = dirs.iter().map(|(_, id)| *id).collect();
            if dirs.len() == listed.len() && ids.len() == dirs.len() && in_use == ids {
                settled = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let dirs = project_dirs(&pool);
        assert!(
            settled,
            "round {round}: {} volumes listed, {answered} creates answered; project dirs {dirs:?}; ids in use {:?}; log:\n{}",
            listed.len(),
            ids_in_use(&root, range.clone()),
            driver.log_text()
        );
        eprintln!(
            "round {round}: {answered} creates answered before the kill, {} committed, {} project dirs before the restart",
            listed.len(),
            before.len()
        );
    }
    eprintln!("{rounds_with_leftovers} of {ROUNDS} rounds left uncommitted creates behind");
    // Otherwise the test proved nothing about leftovers.
    assert!(rounds_with_leftovers > 0, "no round was killed mid-create");
    // New volumes still get ids of their own, and deleting everything frees every id.
    let fresh = driver.create(in_pool(&[("pool", "disk")], 8 * MIB)).await;
    let fresh_id = project_of_volume(&fresh);
    assert_eq!(
        project_dirs(&pool)
            .iter()
            .filter(|(_, id)| *id == fresh_id)
            .count(),
        1
    );
    for id in driver.listed_ids().await {
        driver.delete(&id).await.unwrap();
    }
    assert_eq!(
        ids_in_use_after_release(&root, range.clone()),
        BTreeSet::new()
    );
}

/// A clone whose copy fails leaves no project id in use: a tenant can make copies fail (here a
/// file with more xattrs than a copy takes, 40 × 60 KiB on XFS), and the failed clone's limit
/// was once left set, its id in use for good.
#[tokio::test]
async fn a_failed_clone_leaves_no_project_id_behind() {
    let Some(fs) = with_project_quota("xfs") else {
        return;
    };
    let root = fs.mount_point.clone();
    let range = projquota::DEFAULT_PROJECT_ID_RANGE;
    let mut driver = driver_on(&fs, Some("project"));
    driver.start_again().await;
    let source = driver.create(in_pool(&[("pool", "disk")], 8 * MIB)).await;
    let source_project = project_of_volume(&source);
    let heavy = host_path(&source).join("heavy");
    File::create(&heavy).unwrap();
    let value = vec![b'x'; 60 << 10];
    for i in 0..40 {
        common::fidelity::set_xattr(&heavy, &format!("user.tenant{i}"), &value);
    }
    let mut clone = in_pool(&[("pool", "disk")], 8 * MIB);
    clone.volume_content_source = Some(from_volume(&source.volume_id));
    let refused = driver
        .controller()
        .create_volume(clone)
        .await
        .expect_err("a clone of a file with 2.4 MB of xattrs");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(
        ids_in_use(&root, range.clone()),
        BTreeSet::from([source_project]),
        "project ids in use after the failed clone"
    );
    driver.delete(&source.volume_id).await.unwrap();
    assert_eq!(ids_in_use_after_release(&root, range), BTreeSet::new());
}

/// The entry point of the tenant's runs (tests/common/tenant.rs); does nothing in a test run.
#[test]
fn tenant_act() {
    common::tenant::act_if_asked();
}

/// The driver's next start runs the project-id audit every `seconds` (0: never).
fn audit_every(driver: &mut TestDriver, seconds: u64) {
    let args = &mut driver.options_mut().extra_args;
    if let Some(at) = args.iter().position(|a| a == "--project-audit-interval") {
        args.drain(at..at + 2);
    }
    driver.add_args(["--project-audit-interval".to_string(), seconds.to_string()]);
}

/// The project id of a regular file or directory, not followed.
fn project_of_path(path: &Path) -> u32 {
    use std::os::fd::AsFd;
    let file = File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    projquota::project_of_fd(file.as_fd()).unwrap().0
}

/// What NodeGetVolumeStats, as kubelet calls it, says of the volume's condition.
async fn stats_condition(
    driver: &TestDriver,
    volume: &csi::Volume,
    target: &Path,
) -> csi::VolumeCondition {
    driver
        .stats(&volume.volume_id, &path_str(target))
        .await
        .unwrap()
        .volume_condition
        .expect("volume_condition")
}

/// A stub API server for the audit's Events: GET of the claim `shop/data-0` (uid "uid-claim")
/// and POST of Events in `shop`, whose bodies it keeps. Serves on a free port of 127.0.0.1
/// for the rest of the test; returns its kubeconfig.
async fn events_stub(events: Arc<Mutex<Vec<serde_json::Value>>>, dir: &Path) -> PathBuf {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let serve = move |req: hyper::Request<hyper::body::Incoming>| {
        let events = events.clone();
        async move {
            let (method, path) = (req.method().to_string(), req.uri().path().to_string());
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let (code, answer) = match (method.as_str(), path.as_str()) {
                ("GET", "/api/v1/namespaces/shop/persistentvolumeclaims/data-0") => (
                    200,
                    serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "metadata": {"name": "data-0", "namespace": "shop", "uid": "uid-claim"}}),
                ),
                ("POST", "/apis/events.k8s.io/v1/namespaces/shop/events") => {
                    let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    events.lock().unwrap().push(event.clone());
                    (201, event)
                }
                _ => (
                    404,
                    serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "NotFound", "code": 404}),
                ),
            };
            let response = hyper::Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(answer.to_string())))
                .unwrap();
            Ok::<_, std::convert::Infallible>(response)
        }
    };
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let serve = serve.clone();
            tokio::spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                let service = hyper::service::service_fn(serve);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: stub\n  cluster: {{server: \"http://{address}\"}}\n\
             users:\n- name: stub\n  user: {{}}\ncontexts:\n- name: stub\n  context: {{cluster: stub, user: stub}}\n\
             current-context: stub\n"
        ),
    )
    .unwrap();
    kubeconfig
}

/// A tenant (uid 1000, no capabilities, writing through its publish target) moves a directory
/// of its volume into project 0 and writes past its size, and another into its neighbour's
/// project and fills that quota: both work while no audit runs (the hole). With the audit on,
/// its next round puts every inode back, the usage counts against the tenant's volume, the
/// neighbour's quota is freed, the volume is abnormal in NodeGetVolumeStats and counted in the
/// metrics, and a clean round clears the report.
async fn a_tenant_leaving_its_project_is_caught(fs_type: &str) {
    use common::tenant::{Action, act};
    let Some(fs) = with_project_quota(fs_type) else {
        return;
    };
    let root = fs.mount_point.clone();
    let mut driver = driver_on(&fs, Some("project"));
    driver.options_mut().metrics_address = Some(free_local_address());
    let events = Arc::new(Mutex::new(Vec::new()));
    let kubeconfig = events_stub(events.clone(), &driver.root).await;
    driver.options_mut().kubeconfig = Some(kubeconfig);
    audit_every(&mut driver, 0);
    driver.start_again().await;
    // As csi-provisioner passes them with --extra-create-metadata.
    let claim = [
        ("pool", "disk"),
        ("csi.storage.k8s.io/pvc/namespace", "shop"),
        ("csi.storage.k8s.io/pvc/name", "data-0"),
    ];
    let tenant = driver.create(in_pool(&claim, 16 * MIB)).await;
    let neighbour = driver.create(in_pool(&[("pool", "disk")], 16 * MIB)).await;
    let (tenant_id, neighbour_id) = (project_of_volume(&tenant), project_of_volume(&neighbour));
    let target = driver.publish_at_new_target(&tenant, snw_mount()).await;
    for step in [
        Action::Mkdir("escape"),
        Action::SetProject("escape", 0),
        Action::Write("escape/big", 24 * MIB as u64),
        Action::Mkdir("theirs"),
        Action::SetProject("theirs", neighbour_id),
        Action::Write("theirs/fill", 8 * MIB as u64),
    ] {
        act(&target, step).unwrap_or_else(|e| panic!("{fs_type}: {step:?} failed: {e}"));
    }
    // The hole: 32 MiB written into a 16 MiB volume, 8 MiB of it charged to the neighbour.
    let charged = |id| projquota::project_usage(&root, id).unwrap().used_bytes;
    assert!(charged(tenant_id) < MIB as u64, "{}", charged(tenant_id));
    assert!(
        charged(neighbour_id) >= 8 * MIB as u64,
        "{}",
        charged(neighbour_id)
    );
    assert!(!stats_condition(&driver, &tenant, &target).await.abnormal);

    // Rounds 8 s apart: the first finds the tampering, the second (clean) clears the report,
    // so the checks below have about 8 s. (Mid-walk, the volume may already be abnormal for
    // its usage: what is put back counts against it at once.)
    driver.stop().await;
    audit_every(&mut driver, 8);
    driver.start_again().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let condition = loop {
        let condition = stats_condition(&driver, &tenant, &target).await;
        let audited = condition.message.contains("had left its project");
        if audited || std::time::Instant::now() > deadline {
            break condition;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("{fs_type}: tampered volume's condition: {condition:?}");
    assert!(condition.abnormal, "{condition:?}");
    assert!(
        condition.message.contains("had left its project"),
        "no audit report within 60 s: {condition:?}; log:\n{}",
        driver.log_text()
    );
    assert!(
        condition.message.contains("in project 0"),
        "{}",
        condition.message
    );
    assert!(
        condition
            .message
            .contains(&format!("in project {neighbour_id}")),
        "{}",
        condition.message
    );
    for dir in ["escape", "theirs"] {
        assert_eq!(
            projquota::project_of(&target.join(dir)).unwrap(),
            (tenant_id, true)
        );
    }
    for file in ["escape/big", "theirs/fill"] {
        assert_eq!(project_of_path(&target.join(file)), tenant_id, "{file}");
    }
    assert!(
        charged(tenant_id) >= 32 * MIB as u64,
        "{}",
        charged(tenant_id)
    );
    assert!(
        charged(neighbour_id) < MIB as u64,
        "{}",
        charged(neighbour_id)
    );
    let stats = driver
        .stats(&tenant.volume_id, &path_str(&target))
        .await
        .unwrap();
    let bytes = usage_of(&stats, Unit::Bytes).unwrap();
    assert!(bytes.used >= 32 * MIB, "{bytes:?}");
    assert!(!driver.condition_of(&neighbour.volume_id).await.abnormal);
    assert!(
        driver.log_text().contains("had left its project"),
        "{}",
        driver.log_text()
    );
    let metrics = driver.scrape();
    assert!(metrics.value("stickyvol_project_audit_repaired_inodes_total", &[]) >= 4.0);
    assert_eq!(
        metrics.value("stickyvol_project_audit_tampered_volumes", &[]),
        1.0
    );
    let audits = |result| metrics.value("stickyvol_project_audits_total", &[("result", result)]);
    assert!(audits("tampered") >= 1.0);
    // An Event on the tenant's claim, none for the neighbour (it has no claim either).
    for _ in 0..100 {
        if !events.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let posted = events.lock().unwrap().clone();
    assert_eq!(posted.len(), 1, "{posted:?}");
    let claim_ref = &posted[0]["regarding"];
    assert_eq!(claim_ref["kind"], "PersistentVolumeClaim");
    assert_eq!(
        (&claim_ref["name"], &claim_ref["uid"]),
        (&"data-0".into(), &"uid-claim".into())
    );
    assert_eq!(posted[0]["type"], "Warning");
    assert!(
        posted[0]["note"]
            .as_str()
            .unwrap()
            .contains("had left its project")
    );
    // Now over its size: the tenant's next write is refused (XFS: already the new file).
    let refused = act(&target, Action::Write("more", MIB as u64)).unwrap_err();
    let errno = over_project_limit_errno(fs_type);
    assert!(
        refused.contains(&format!("code: {errno},"))
            || refused.contains(&format!("os error {errno})")),
        "{refused}"
    );

    // The tenant removes what it wrote: the next clean round clears the report.
    std::fs::remove_dir_all(target.join("escape")).unwrap();
    std::fs::remove_dir_all(target.join("theirs")).unwrap();
    std::fs::remove_file(target.join("more")).ok();
    let mut cleared = false;
    for _ in 0..300 {
        let metrics = driver.scrape();
        let condition = stats_condition(&driver, &tenant, &target).await;
        if !condition.abnormal
            && metrics.value("stickyvol_project_audit_tampered_volumes", &[]) == 0.0
        {
            cleared = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        cleared,
        "still reported after 60 s; log:\n{}",
        driver.log_text()
    );
    assert!(
        driver
            .scrape()
            .value("stickyvol_project_audits_total", &[("result", "clean")])
            >= 1.0
    );
    driver.unpublish_ok(&tenant, &target).await;
    driver.delete(&tenant.volume_id).await.unwrap();
    driver.delete(&neighbour.volume_id).await.unwrap();
}

#[tokio::test]
async fn xfs_a_tenant_leaving_its_project_is_caught_by_the_audit() {
    a_tenant_leaving_its_project_is_caught("xfs").await;
}

#[tokio::test]
async fn ext4_a_tenant_leaving_its_project_is_caught_by_the_audit() {
    a_tenant_leaving_its_project_is_caught("ext4").await;
}

/// Project ids are drawn at random, and a tenant tagging files with the ids around its own (the
/// next 1,100 and the previous 1,100: what lowest-first allocation would have handed out next,
/// and made CreateVolume fail after 1,024) cannot make CreateVolume fail.
#[tokio::test]
async fn ids_are_unguessable_and_tagging_cannot_exhaust_them() {
    use common::tenant::{Action, act};
    let Some(fs) = with_project_quota("xfs") else {
        return;
    };
    let root = fs.mount_point.clone();
    let mut driver = driver_on(&fs, Some("project"));
    audit_every(&mut driver, 0);
    driver.start_again().await;
    let tenant = driver.create(in_pool(&[("pool", "disk")], 16 * MIB)).await;
    let tenant_id = project_of_volume(&tenant);
    let target = driver.publish_at_new_target(&tenant, snw_mount()).await;
    let started = std::time::Instant::now();
    act(&target, Action::TagMany("up", tenant_id + 1, 1100)).unwrap();
    act(&target, Action::TagMany("down", tenant_id - 1100, 1100)).unwrap();
    eprintln!("the tenant tagged 2,200 ids in {:?}", started.elapsed());
    for id in [tenant_id + 1, tenant_id + 1100, tenant_id - 1100] {
        assert_eq!(
            projquota::project_use(&root, id).unwrap(),
            projquota::IdUse::Charged,
            "{id}"
        );
    }
    let mut ids = vec![tenant_id];
    for _ in 0..10 {
        let volume = driver.create(in_pool(&[("pool", "disk")], 8 * MIB)).await;
        ids.push(project_of_volume(&volume));
    }
    eprintln!("project ids handed out: {ids:?}");
    let tagged = tenant_id - 1100..=tenant_id + 1100;
    assert!(ids[1..].iter().all(|id| !tagged.contains(id)), "{ids:?}");
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), ids.len(), "an id handed out twice: {ids:?}");
    assert!(
        sorted.windows(2).all(|w| w[1] - w[0] > 1),
        "neighbouring ids: {sorted:?}"
    );
    let range = projquota::DEFAULT_PROJECT_ID_RANGE;
    assert!(
        sorted[sorted.len() - 1] - sorted[0] > (range.end - range.start) / 4,
        "{sorted:?}"
    );
    assert!(sorted.iter().all(|id| range.contains(id)));
    driver.unpublish_ok(&tenant, &target).await;
    for id in driver.listed_ids().await {
        driver.delete(&id).await.unwrap();
    }
    assert_eq!(ids_in_use_after_release(&root, range), BTreeSet::new());
}

/// A tree deeper than the project-id audit walks keeps it from ever finishing: the volume is
/// fenced read-only (kubelet's target and the pod's own mount in its namespace), with an Event
/// on its claim and the reason in its condition, until an audit finishes again (here: the chain
/// removed from the host, as an admin would after `stickyvol volume unfence` let the pod do it).
async fn a_volume_whose_audit_cannot_finish_is_fenced_until_one_does(fs_type: &str) {
    let Some(fs) = with_project_quota(fs_type) else {
        return;
    };
    let mut driver = driver_on(&fs, Some("project"));
    let events = Arc::new(Mutex::new(Vec::new()));
    let kubeconfig = events_stub(events.clone(), &driver.root).await;
    driver.options_mut().kubeconfig = Some(kubeconfig);
    audit_every(&mut driver, 1);
    driver.start_again().await;
    let claim = [
        ("pool", "disk"),
        ("csi.storage.k8s.io/pvc/namespace", "shop"),
        ("csi.storage.k8s.io/pvc/name", "data-0"),
    ];
    let tenant = driver.create(in_pool(&claim, 64 * MIB)).await;
    let target = driver.publish_at_new_target(&tenant, snw_mount()).await;
    let pod = common::namespace::OtherNode::private_copy();
    let in_pod = target.join("note");
    let pod_write = move || {
        let file = in_pod.clone();
        pod.run(move || {
            std::fs::write(&file, b"x")
                .err()
                .and_then(|e| e.raw_os_error())
        })
    };
    assert_eq!(pod_write(), None);
    let chain =
        common::chain::Chain::make(&host_path(&tenant), stickyvol::host::tree::MAX_DEPTH + 4);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while pod_write() != Some(libc::EROFS) {
        assert!(
            std::time::Instant::now() < deadline,
            "{fs_type}: never fenced"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let condition = stats_condition(&driver, &tenant, &target).await;
    assert!(
        condition.abnormal
            && condition.message.contains("fenced read-only")
            && condition.message.contains("did not finish"),
        "{fs_type}: {condition:?}"
    );
    let reasons = || -> Vec<String> {
        let events = events.lock().unwrap();
        events.iter().map(|e| e["reason"].to_string()).collect()
    };
    // The Event is written by a task of its own, after the fence.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !reasons().iter().any(|r| r.contains("AuditFenced")) {
        assert!(
            std::time::Instant::now() < deadline,
            "{fs_type}: no AuditFenced Event: {:?}",
            reasons()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    drop(chain);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while pod_write().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "{fs_type}: fence never lifted"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let condition = stats_condition(&driver, &tenant, &target).await;
    assert!(!condition.abnormal, "{fs_type}: unfenced but {condition:?}");
    driver.unpublish_ok(&tenant, &target).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn xfs_a_volume_whose_audit_cannot_finish_is_fenced_until_one_does() {
    a_volume_whose_audit_cannot_finish_is_fenced_until_one_does("xfs").await;
}
