//! Enforced sizes on a real btrfs filesystem (loop-backed, made per test; `.ci/run` installs
//! btrfs-progs for mkfs.btrfs): every filesystem volume is a subvolume whose qgroup limit is
//! its size. Driven through the gRPC API the way kubelet and the provisioner call it.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::scratchfs::ScratchFs;
use common::*;
use csi::volume_usage::Unit;
use stickyvol::host::btrfs;
use tonic::Code;

const FS_SIZE: u64 = 1 << 30;

/// A driver whose pool "fast" lives on a fresh btrfs filesystem. Field order matters: the
/// driver (and its mounts) goes before the filesystem is unmounted.
struct BtrfsDriver {
    driver: TestDriver,
    pool: PathBuf,
    _fs: ScratchFs,
}

fn btrfs_fs() -> ScratchFs {
    // Not a skip: CI installs btrfs-progs, and a silently skipped test proves nothing.
    ScratchFs::new("btrfs", FS_SIZE, &["-q"], "")
}

async fn start_on_btrfs(enforcement: Option<&str>) -> BtrfsDriver {
    let fs = btrfs_fs();
    let pool = fs.mount_point.join("pool");
    let mut driver = TestDriver::prepare(Options::default());
    driver.add_args(["--pool".to_string(), format!("fast={}", pool.display())]);
    if let Some(choice) = enforcement {
        driver.add_args(["--enforcement".to_string(), format!("fast={choice}")]);
    }
    driver.start_again().await;
    BtrfsDriver {
        driver,
        pool,
        _fs: fs,
    }
}

const FAST: [(&str, &str); 1] = [("pool", "fast")];

fn snw_mount() -> csi::VolumeCapability {
    mount_cap(Mode::SingleNodeWriter)
}

fn fast_request(bytes: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        parameters: params(&FAST),
        ..create_request(&new_name(), snw_mount(), bytes)
    }
}

impl BtrfsDriver {
    async fn published(&self, bytes: i64) -> (csi::Volume, PathBuf) {
        let volume = self.driver.create(fast_request(bytes)).await;
        let target = self
            .driver
            .publish_at_new_target(&volume, snw_mount())
            .await;
        (volume, target)
    }

    /// Bytes used per NodeGetVolumeStats, after committing btrfs's transaction (qgroup numbers
    /// change at commit time).
    async fn used(&self, volume: &csi::Volume, target: &Path) -> (csi::VolumeUsage, String) {
        btrfs::sync(&self.pool).unwrap();
        let stats = self
            .driver
            .stats(&volume.volume_id, &path_str(target))
            .await
            .unwrap();
        let condition = stats.volume_condition.clone().unwrap();
        assert!(!condition.abnormal, "{condition:?}");
        (usage_of(&stats, Unit::Bytes).unwrap(), condition.message)
    }
}

#[tokio::test]
async fn writes_past_a_volume_size_fail_and_the_neighbour_is_unaffected() {
    let setup = start_on_btrfs(Some("btrfs")).await;
    let (full, full_target) = setup.published(16 * MIB).await;
    let (neighbour, neighbour_target) = setup.published(16 * MIB).await;
    assert!(btrfs::is_subvolume(&host_path(&full)).unwrap());

    let (written, err) = fill(&full_target.join("big"), 32 * MIB);
    assert_stopped_at_limit(err, written, 16 * MIB, 4 * MIB);
    let (written, err) = fill(&neighbour_target.join("small"), 8 * MIB);
    assert!(err.is_none(), "neighbour refused after {written}: {err:?}");

    let (usage, _) = setup.used(&full, &full_target).await;
    assert_eq!(usage.total, 16 * MIB);
    assert!(
        usage.used >= 12 * MIB && usage.used <= 16 * MIB,
        "{usage:?}"
    );
    assert_eq!(usage.available, usage.total - usage.used);
    let (usage, _) = setup.used(&neighbour, &neighbour_target).await;
    assert!(usage.used >= 8 * MIB && usage.used < 9 * MIB, "{usage:?}");
    assert_eq!(usage.available, 16 * MIB - usage.used);
}

#[tokio::test]
async fn expansion_lets_more_data_in_while_published_and_survives_a_restart() {
    let mut setup = start_on_btrfs(Some("btrfs")).await;
    let (volume, target) = setup.published(16 * MIB).await;
    let (written, err) = fill(&target.join("first"), 32 * MIB);
    assert_stopped_at_limit(err, written, 16 * MIB, 4 * MIB);

    let grown = setup
        .driver
        .expand(expand_request(&volume.volume_id, &target, 48 * MIB, 0))
        .await
        .unwrap();
    assert_eq!(grown, 48 * MIB);
    // Idempotent: kubelet retries the same expansion.
    let again = setup
        .driver
        .expand(expand_request(&volume.volume_id, &target, 48 * MIB, 0))
        .await
        .unwrap();
    assert_eq!(again, 48 * MIB);
    let (more, err) = fill(&target.join("second"), 16 * MIB);
    assert!(
        err.is_none(),
        "only {more} more bytes after growing: {err:?}"
    );
    expect_code(
        setup
            .driver
            .expand(expand_request(&volume.volume_id, &target, 0, 16 * MIB))
            .await,
        Code::OutOfRange,
    );

    setup.driver.restart().await;
    let (usage, _) = setup.used(&volume, &target).await;
    assert_eq!(usage.total, 48 * MIB);
    let (written, err) = fill(&target.join("third"), 32 * MIB);
    assert_stopped_at_limit(err, written + usage.used, 48 * MIB, 4 * MIB);
}

#[tokio::test]
async fn capacity_falls_as_volumes_are_created_and_rises_as_they_are_deleted() {
    let setup = start_on_btrfs(Some("btrfs")).await;
    let driver = &setup.driver;
    let before = driver.available_capacity(&FAST, snw_mount()).await;
    assert!(before > 512 * MIB && before <= FS_SIZE as i64, "{before}");
    let a = driver.create(fast_request(256 * MIB)).await;
    let b = driver.create(fast_request(128 * MIB)).await;
    let during = driver.available_capacity(&FAST, snw_mount()).await;
    let slack = 16 * MIB; // btrfs metadata of two subvolumes
    assert!(
        (before - 384 * MIB - during).abs() < slack,
        "before {before}, with 384 MiB promised {during}"
    );
    // More than is left is refused, so the provisioner tries another node.
    expect_code(
        driver
            .controller()
            .create_volume(fast_request(during + 64 * MIB))
            .await,
        Code::ResourceExhausted,
    );
    driver.delete(&a.volume_id).await.unwrap();
    driver.delete(&b.volume_id).await.unwrap();
    assert!(!host_path(&a).exists() && !host_path(&b).exists());
    let after = driver.available_capacity(&FAST, snw_mount()).await;
    assert!(
        (before - after).abs() < slack,
        "before {before}, after {after}"
    );
}

#[tokio::test]
async fn a_volume_with_nested_subvolumes_and_links_is_deleted_whole() {
    let setup = start_on_btrfs(Some("btrfs")).await;
    let (volume, target) = setup.published(16 * MIB).await;
    let outside = setup.driver.root.join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("keep"), b"x").unwrap();
    fs::write(target.join("file"), b"data").unwrap();
    std::os::unix::fs::symlink(&outside, target.join("link")).unwrap();
    // A pod running as root can make subvolumes inside its volume.
    btrfs::create_subvolume(&target, "nested").unwrap();
    fs::write(target.join("nested/inner"), b"data").unwrap();
    setup.driver.unpublish_ok(&volume, &target).await;
    setup.driver.delete(&volume.volume_id).await.unwrap();
    assert!(!host_path(&volume).exists());
    assert!(outside.join("keep").exists(), "deletion followed a symlink");
}

#[tokio::test]
async fn read_only_subvolumes_a_pod_made_are_deleted_too() {
    let setup = start_on_btrfs(Some("btrfs")).await;
    let (volume, target) = setup.published(16 * MIB).await;
    // A pod may make a subvolume read-only (its owner may); nothing in it can be unlinked then.
    btrfs::create_subvolume(&target, "frozen").unwrap();
    fs::write(target.join("frozen/inner"), b"data").unwrap();
    btrfs::create_subvolume(&target.join("frozen"), "deeper").unwrap();
    fs::write(target.join("frozen/deeper/inner"), b"data").unwrap();
    btrfs::set_read_only(&target.join("frozen/deeper"), true).unwrap();
    btrfs::set_read_only(&target.join("frozen"), true).unwrap();
    let refused = fs::remove_file(target.join("frozen/inner")).unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS));
    setup.driver.unpublish_ok(&volume, &target).await;
    setup.driver.delete(&volume.volume_id).await.unwrap();
    assert!(!host_path(&volume).exists());
}

#[tokio::test]
async fn a_volume_whose_limit_was_removed_is_reported_abnormal() {
    let setup = start_on_btrfs(Some("btrfs")).await;
    let (volume, target) = setup.published(16 * MIB).await;
    btrfs::clear_limit(&host_path(&volume)).unwrap();
    let stats = setup
        .driver
        .stats(&volume.volume_id, &path_str(&target))
        .await
        .unwrap();
    let condition = stats.volume_condition.unwrap();
    assert!(
        condition.abnormal && condition.message.contains("limit"),
        "{condition:?}"
    );
}

#[tokio::test]
async fn quota_is_enabled_only_when_asked_for_by_name() {
    // auto on a btrfs filesystem whose quota is off: sizes are not enforced, and a class
    // that requires enforcement is refused.
    let mut setup = start_on_btrfs(None).await;
    assert!(!btrfs::quota_enabled(&setup.pool).unwrap());
    assert!(setup.driver.log_text().contains("btrfs quota is off"));
    let required = [("pool", "fast"), ("requireEnforcement", "true")];
    let refused = csi::CreateVolumeRequest {
        parameters: params(&required),
        ..create_request(&new_name(), snw_mount(), 16 * MIB)
    };
    expect_code(
        setup
            .driver
            .controller()
            .create_volume(refused.clone())
            .await,
        Code::ResourceExhausted,
    );
    let plain = setup.driver.create(fast_request(16 * MIB)).await;
    assert!(!btrfs::is_subvolume(&host_path(&plain)).unwrap());

    // Named: quota is enabled and new volumes are limited subvolumes.
    setup.driver.stop().await;
    setup.driver.add_args(["--enforcement", "fast=btrfs"]);
    setup.driver.start_again().await;
    assert!(btrfs::quota_enabled(&setup.pool).unwrap());
    let limited = setup.driver.create(refused).await;
    assert!(btrfs::is_subvolume(&host_path(&limited)).unwrap());
    // The plain volume made before keeps working as what it is.
    let target = setup
        .driver
        .publish_at_new_target(&plain, snw_mount())
        .await;
    let (written, err) = fill(&target.join("free"), 24 * MIB);
    assert!(
        err.is_none(),
        "unlimited volume refused after {written}: {err:?}"
    );
    setup.driver.unpublish_ok(&plain, &target).await;
    setup.driver.delete(&plain.volume_id).await.unwrap();
    setup.driver.delete(&limited.volume_id).await.unwrap();
}

#[tokio::test]
async fn an_expansion_interrupted_after_raising_the_limit_is_finished_by_the_retry() {
    let setup = start_on_btrfs(Some("btrfs")).await;
    let (volume, target) = setup.published(16 * MIB).await;
    // The state a crash leaves between the two steps: the qgroup raised, the record not.
    btrfs::set_limit(&host_path(&volume), 32 * MIB as u64).unwrap();
    assert_eq!(setup.driver.capacity_of(&volume.volume_id).await, 16 * MIB);
    let grown = setup
        .driver
        .expand(expand_request(&volume.volume_id, &target, 32 * MIB, 0))
        .await
        .unwrap();
    assert_eq!(grown, 32 * MIB);
    assert_eq!(setup.driver.capacity_of(&volume.volume_id).await, 32 * MIB);
    let (usage, _) = setup.used(&volume, &target).await;
    assert_eq!(usage.total, 32 * MIB);
}

/// A power loss undid the removal of a deleted volume's subvolume: the next start destroys it
/// as a subvolume, not as a tree of files.
#[tokio::test]
async fn a_subvolume_a_power_loss_brought_back_after_a_delete_is_destroyed_at_start() {
    let mut setup = start_on_btrfs(Some("btrfs")).await;
    let volume = setup.driver.create(fast_request(16 * MIB)).await;
    let data = host_path(&volume);
    fs::write(data.join("old"), b"deleted data").unwrap();
    btrfs::snapshot_subvolume(&data, &setup.pool, "aside", false).unwrap();
    setup.driver.delete(&volume.volume_id).await.unwrap();
    setup.driver.kill9();
    fs::rename(setup.pool.join("aside"), &data).unwrap();

    setup.driver.start_again().await;
    eventually("the subvolume is destroyed", || {
        !data.exists() && setup.driver.log_text().contains("a crash brought back")
    })
    .await;
    let log = setup.driver.log_text();
    let line = log
        .lines()
        .find(|line| line.contains("a crash brought back"))
        .unwrap_or_else(|| panic!("no removal logged:\n{log}"));
    assert!(line.contains("BtrfsQgroup"), "{line}");
}

#[tokio::test]
async fn a_create_interrupted_before_its_commit_leaves_no_subvolume_behind() {
    let mut setup = start_on_btrfs(Some("btrfs")).await;
    setup.driver.stop().await;
    // What a kill -9 between making the subvolume and writing the record leaves.
    let staged = format!(".creating-{}", unknown_volume_id());
    btrfs::create_subvolume(&setup.pool.join("volumes"), &staged).unwrap();
    fs::write(setup.pool.join("volumes").join(&staged).join("f"), b"x").unwrap();
    setup.driver.start_again().await;
    let staged = setup.pool.join("volumes").join(&staged);
    eventually("the staged subvolume is removed", || !staged.exists()).await;
}

#[tokio::test]
async fn the_condition_the_controller_reports_follows_the_limit() {
    let setup = start_on_btrfs(Some("btrfs")).await;
    let volume = setup.driver.create(fast_request(16 * MIB)).await;
    let healthy = setup.driver.condition_of(&volume.volume_id).await;
    assert!(!healthy.abnormal, "{healthy:?}");
    btrfs::clear_limit(&host_path(&volume)).unwrap();
    let lost = setup.driver.condition_of(&volume.volume_id).await;
    assert!(lost.abnormal && lost.message.contains("limit"), "{lost:?}");
}

#[tokio::test]
async fn stats_still_answer_when_quota_is_turned_off_and_say_why() {
    let setup = start_on_btrfs(Some("btrfs")).await;
    let (volume, target) = setup.published(16 * MIB).await;
    fs::write(target.join("f"), pattern(MIB as usize, 2)).unwrap();
    let off = std::process::Command::new("btrfs")
        .args(["quota", "disable"])
        .arg(&setup.pool)
        .status()
        .expect("running btrfs quota disable");
    assert!(off.success());
    let stats = setup
        .driver
        .stats(&volume.volume_id, &path_str(&target))
        .await
        .unwrap();
    let condition = stats.volume_condition.clone().unwrap();
    assert!(
        condition.abnormal && condition.message.contains("size limit"),
        "{condition:?}"
    );
    // Measured the slow way instead.
    assert!(usage_of(&stats, Unit::Bytes).unwrap().used >= MIB);
}

#[tokio::test]
async fn data_in_a_subvolume_made_inside_a_volume_is_still_counted() {
    let setup = start_on_btrfs(Some("btrfs")).await;
    let (volume, target) = setup.published(16 * MIB).await;
    // btrfs charges a nested subvolume to its own qgroup, not to the volume's limit: it cannot
    // be stopped, but it must not go unseen.
    btrfs::create_subvolume(&target, "escape").unwrap();
    btrfs::create_subvolume(&target.join("escape"), "deeper").unwrap();
    let (written, err) = fill(&target.join("escape/deeper/big"), 24 * MIB);
    assert!(err.is_none(), "{written}: {err:?}");
    btrfs::sync(&setup.pool).unwrap();
    let stats = setup
        .driver
        .stats(&volume.volume_id, &path_str(&target))
        .await
        .unwrap();
    let bytes = usage_of(&stats, Unit::Bytes).unwrap();
    assert!(bytes.used >= 24 * MIB, "{bytes:?}");
    let condition = stats.volume_condition.unwrap();
    assert!(
        condition.abnormal && condition.message.contains("more than its size"),
        "{condition:?}"
    );
    assert!(setup.driver.condition_of(&volume.volume_id).await.abnormal);
}

/// btrfs updates qgroup figures only when a transaction commits (every 30 s by default): the
/// driver commits the pool (at most every few seconds) before reading them, so a write shows in
/// the next NodeGetVolumeStats once the commit interval has passed, with no sync from anyone
/// else. (Without that commit the figure stayed at 16 KiB until btrfs's own, up to 30 s.)
#[tokio::test]
async fn stats_show_a_write_at_once_not_after_the_next_btrfs_commit() {
    let setup = start_on_btrfs(Some("btrfs")).await;
    let (volume, target) = setup.published(64 * MIB).await;
    // Settled first, so nothing below commits by accident, and past the driver's commit
    // interval (its create committed); then a plain write, as a pod's.
    btrfs::sync(&setup.pool).unwrap();
    std::thread::sleep(stickyvol::volume::space::pool::QGROUP_COMMIT_EVERY);
    fs::write(target.join("fresh"), pattern(24 * MIB as usize, 5)).unwrap();
    let stats = setup
        .driver
        .stats(&volume.volume_id, &path_str(&target))
        .await
        .unwrap();
    let bytes = usage_of(&stats, Unit::Bytes).unwrap();
    assert!(bytes.used >= 24 * MIB, "{bytes:?}");
}

/// Records a "pod" appends while snapshots are taken: 16 bytes each, its sequence number
/// twice, fsync'ed in A before the same record goes to B.
const RECORD: usize = 16;

fn record(i: u64) -> [u8; RECORD] {
    let mut bytes = [0u8; RECORD];
    bytes[..8].copy_from_slice(&i.to_le_bytes());
    bytes[8..].copy_from_slice(&i.to_le_bytes());
    bytes
}

/// How many whole records `path` holds, checking each is the next in sequence (a record
/// being written when the snapshot was taken may be cut at the end).
fn records_in(path: &Path) -> u64 {
    let bytes = fs::read(path).unwrap();
    let whole = bytes.len() / RECORD;
    for (i, chunk) in bytes.chunks_exact(RECORD).enumerate() {
        assert_eq!(chunk, record(i as u64), "record {i} of {}", path.display());
    }
    whole as u64
}

/// A btrfs snapshot is one point in time of the whole volume, while a pod writes: whatever a
/// crash could keep, it keeps. The pod fsyncs each record in A before writing it to B, so no
/// crash leaves B ahead of A; a file-by-file copy would (it reads A, then the 2,000 files
/// between, then B, while the pod goes on).
#[tokio::test]
async fn btrfs_snapshots_are_crash_consistent_while_a_pod_writes() {
    use std::io::Write;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let setup = start_on_btrfs(Some("btrfs")).await;
    let (volume, target) = setup.published(64 * MIB).await;
    let (a, b) = (target.join("a"), target.join("b"));
    fs::File::create(&a).unwrap();
    for i in 0..2000 {
        fs::write(target.join(format!("between-{i}")), b"x").unwrap();
    }
    fs::File::create(&b).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let open = |path: &Path| fs::OpenOptions::new().append(true).open(path).unwrap();
            let (mut a, mut b) = (open(&a), open(&b));
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                a.write_all(&record(i)).unwrap();
                a.sync_data().unwrap();
                b.write_all(&record(i)).unwrap();
                i += 1;
            }
            i
        })
    };
    let mut seen = Vec::new();
    for _ in 0..5 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let snapshot = setup.driver.snapshot_of(&volume.volume_id).await;
        let data = setup.pool.join("snapshots").join(&snapshot.snapshot_id);
        let (in_a, in_b) = (records_in(&data.join("a")), records_in(&data.join("b")));
        // B may lag (its records are not fsync'ed, a crash may lose them), never lead.
        assert!(
            in_b <= in_a,
            "snapshot {}: {in_a} records in A, {in_b} in B",
            snapshot.snapshot_id
        );
        seen.push(in_a);
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    // The snapshots were taken while the pod wrote, at different points.
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    assert!(*seen.last().unwrap() < written, "{seen:?} of {written}");
}
