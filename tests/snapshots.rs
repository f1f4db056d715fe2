//! Snapshots, restores and clones through the CSI API, as csi-snapshotter (CreateSnapshot,
//! DeleteSnapshot, ListSnapshots) and external-provisioner (CreateVolume with a
//! volume_content_source) call it, with the data checked on the host: files, owners, modes,
//! times, xattrs, links and holes, read through a NodePublish bind mount or the image file.
//!
//! Sections: capabilities; CreateSnapshot; DeleteSnapshot; ListSnapshots; restores and clones
//! on the default pool (/var/tmp, ext4 here: full copies); block volumes; crash safety;
//! capacity and metrics; btrfs with quota (snapshots of subvolumes) and XFS (reflinks) on
//! loop-backed scratch filesystems. Tests that need a copy slower than CreateSnapshot waits
//! (tens of thousands of small files) or free space no other test moves put the default pool
//! on a tmpfs of their own ([`start_on_tmpfs`]); the mechanism is the same full copy.

mod common;

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use common::fidelity::*;
use common::scratchfs::ScratchFs;
use common::*;
use csi::controller_service_capability::rpc::Type as ControllerRpc;
use serde_json::Value;
use sha2::{Digest, Sha256};
use stickyvol::host::btrfs;
use stickyvol::volume::state::id::{NodeTag, SnapshotId, VolumeId};

/// A second node for sources that live elsewhere.
const OTHER_NODE: &str = "other-node";

fn snw_mount() -> csi::VolumeCapability {
    mount_cap(Mode::SingleNodeWriter)
}

fn snw_block() -> csi::VolumeCapability {
    block_cap(Mode::SingleNodeWriter)
}

// ---- ids ----

/// The tag ids issued by `node` end with: the first 8 hex digits of SHA-256 of its name.
fn tag_of(node: &str) -> String {
    Sha256::digest(node.as_bytes())[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `id` is `<prefix><32 lowercase hex>-<tag of node>`.
#[track_caller]
fn assert_id_of(id: &str, prefix: &str, node: &str) {
    let hex = |s: &str| s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let parts = id
        .strip_prefix(prefix)
        .and_then(|rest| rest.split_once('-'));
    assert!(
        parts.is_some_and(|(uuid, tag)| hex(uuid) && tag == tag_of(node)),
        "{id:?} is not {prefix}<32 hex>-{} (issued by {node})",
        tag_of(node)
    );
}

/// A well-formed snapshot id of `node` that no driver issued.
fn snapshot_id_of(node: &str) -> String {
    SnapshotId::generate(&NodeTag::of(node))
        .as_str()
        .to_string()
}

/// A well-formed volume id of `node` that no driver issued.
fn volume_id_of(node: &str) -> String {
    VolumeId::generate(&NodeTag::of(node)).as_str().to_string()
}

// ---- requests ----

/// CreateVolume from `source` with `capability`, under a fresh name; no capacity_range when
/// `required_bytes` is None (the provisioner always sends one; CSI allows none).
fn restore_request(
    capability: csi::VolumeCapability,
    source: csi::VolumeContentSource,
    required_bytes: Option<i64>,
) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: new_name(),
        capacity_range: required_bytes.map(|required_bytes| csi::CapacityRange {
            required_bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability],
        volume_content_source: Some(source),
        // Sparse, to show the holes carried over (thick is the default on the test pools).
        parameters: params(&[("blockAllocation", "thin")]),
        ..Default::default()
    }
}

fn list_request(f: impl FnOnce(&mut csi::ListSnapshotsRequest)) -> csi::ListSnapshotsRequest {
    let mut request = csi::ListSnapshotsRequest::default();
    f(&mut request);
    request
}

/// Snapshot ids in a ListSnapshots answer.
fn ids(response: &csi::ListSnapshotsResponse) -> Vec<String> {
    response
        .entries
        .iter()
        .map(|e| {
            e.snapshot
                .as_ref()
                .expect("entry without snapshot")
                .snapshot_id
                .clone()
        })
        .collect()
}

// Where snapshot data and records live: `<pool root>/snapshots/<id>[.img]` and
// `<data-dir>/state/snapshots/<id>.json`.

fn snapshot_dir(pool_root: &Path, id: &str) -> PathBuf {
    pool_root.join("snapshots").join(id)
}

fn snapshot_image(pool_root: &Path, id: &str) -> PathBuf {
    pool_root.join("snapshots").join(format!("{id}.img"))
}

/// The record file of snapshot `id`, at rest: a running driver is restarted first (see
/// `TestDriver::state_entries`).
async fn snapshot_record(driver: &mut TestDriver, id: &str) -> PathBuf {
    if driver.is_running() {
        driver.restart().await;
    }
    driver
        .data
        .join("state/snapshots")
        .join(format!("{id}.json"))
}

/// Writes `count` files of `each` bytes of real (non-zero) data into `dir`.
fn write_files(dir: &Path, count: usize, each: usize) {
    for i in 0..count {
        let mut file = File::create(dir.join(format!("file-{i:03}"))).unwrap();
        let chunk = pattern(MIB as usize, i as u8);
        let mut left = each;
        while left > 0 {
            let n = left.min(chunk.len());
            file.write_all(&chunk[..n]).unwrap();
            left -= n;
        }
    }
}

/// Seconds since the epoch, now.
fn now_seconds() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A published filesystem volume of `bytes` holding a file "file" of 1 MiB; the volume, its
/// target and the file's content.
async fn published_with_file(driver: &TestDriver, bytes: i64) -> (csi::Volume, PathBuf, Vec<u8>) {
    let volume = driver
        .create(create_request(&new_name(), snw_mount(), bytes))
        .await;
    let target = driver.publish_at_new_target(&volume, snw_mount()).await;
    let content = pattern(MIB as usize, 42);
    write_synced(&target.join("file"), &content);
    (volume, target, content)
}

/// A filesystem volume of [`SIZE`] holding "file" (1 MiB, written on the host); the volume and
/// the file's content.
async fn volume_with_file(driver: &TestDriver) -> (csi::Volume, Vec<u8>) {
    let volume = driver.create_fs_volume().await;
    let content = pattern(MIB as usize, 42);
    write_synced(&host_path(&volume).join("file"), &content);
    (volume, content)
}

/// Small files added per round by [`snapshot_answered_not_ready`]: on a tmpfs data dir,
/// copying 12,000 files of 4 KiB took 0.23 s on the development VM in 2026-11 (50,000 took
/// 0.95 s, too close to the 1 s CreateSnapshot waits: a copy ended between the answer and a
/// kill -9 in CI), so 100,000 take about twice that wait. Two rounds at most: 100,000 files and
/// their copy, then 200,000 and theirs, fit the 3 GiB tmpfs the tests mount.
const SLOW_COPY_FILES: usize = 100_000;
const SLOW_COPY_ROUNDS: usize = 2;

/// A driver whose data dir (the default pool) is a fresh tmpfs of `size`: its free space is
/// the test's alone, and big or many-file copies cost memory, not the disk's I/O budget (a
/// test VM's disk may be rate-limited). The test driver's cleanup unmounts it, as everything
/// beneath its directory, also when the test fails.
async fn start_on_tmpfs(size: &str) -> TestDriver {
    let mut driver = TestDriver::prepare(Options::default());
    mount_tmpfs(&driver.data, size);
    driver.start_again().await;
    driver
}

/// Writes `count` files of 4 KiB, each with its own content, under `dir/round-<round>/`
/// (1,000 per subdirectory).
fn write_small_files(dir: &Path, round: usize, count: usize) {
    let base = dir.join(format!("round-{round}"));
    let mut block = vec![0x5au8; 4096];
    for i in 0..count {
        let sub = base.join(format!("d{:02}", i / 1000));
        if i % 1000 == 0 {
            fs::create_dir_all(&sub).unwrap();
        }
        block[..8].copy_from_slice(&(i as u64).to_le_bytes());
        block[8] = round as u8;
        fs::write(sub.join(format!("f{i:05}")), &block).unwrap();
    }
}

/// A filesystem volume holding so many small files that copying them takes longer than
/// CreateSnapshot waits (use a driver from [`start_on_tmpfs`]), a CreateSnapshot request for
/// it, and the first answer, which is not ready. Where a copy is quicker than expected, the
/// volume gets as many files again and a new name is tried (at most [`SLOW_COPY_ROUNDS`]
/// rounds; then the test fails, since what it means to test cannot happen here).
async fn snapshot_answered_not_ready(
    driver: &TestDriver,
) -> (csi::Volume, csi::CreateSnapshotRequest, csi::Snapshot) {
    let mut source = SlowCopySource::new(driver).await;
    while let Some((request, first)) = source.next_snapshot(driver).await {
        if !first.ready_to_use {
            return (source.volume, request, first);
        }
        eprintln!(
            "a copy of {} files was ready at once; doubling them",
            source.files
        );
        driver.delete_snapshot(&first.snapshot_id).await.unwrap();
    }
    panic!(
        "even a copy of {} files was ready within the first CreateSnapshot call",
        source.files
    );
}

/// [`snapshot_answered_not_ready`], then kill -9 while the copy still runs: the snapshot's
/// staging copy is there and its data is not in place. A copy only a little slower than
/// CreateSnapshot's wait can finish between the answer and the kill; then the driver starts
/// again, that snapshot goes, and the volume gets as many files again (at most
/// [`SLOW_COPY_ROUNDS`] rounds in all). Returns with the driver stopped.
async fn killed_during_a_copy(
    driver: &mut TestDriver,
) -> (csi::Volume, csi::CreateSnapshotRequest, csi::Snapshot) {
    let mut source = SlowCopySource::new(driver).await;
    while let Some((request, first)) = source.next_snapshot(driver).await {
        let answered_not_ready = !first.ready_to_use;
        if answered_not_ready {
            driver.kill9();
            if copy_is_half_made(driver, &first.snapshot_id) {
                return (source.volume, request, first);
            }
            eprintln!(
                "the copy of {} files ended before the kill; doubling them",
                source.files
            );
            driver.start_again().await;
        }
        driver.delete_snapshot(&first.snapshot_id).await.unwrap();
    }
    panic!(
        "even a copy of {} files ended before the driver was killed",
        source.files
    );
}

/// Evidence that a kill landed during the copy of `snapshot_id`: its staging copy is in
/// snapshots/ and its data is not in place.
fn copy_is_half_made(driver: &TestDriver, snapshot_id: &str) -> bool {
    let left = dir_names(&driver.data.join("snapshots"));
    left.contains(&format!(".creating-{snapshot_id}")) && !left.contains(&snapshot_id.to_string())
}

/// The source volume of a slow copy: [`SLOW_COPY_FILES`] small files at first, doubled each
/// round a copy turns out quicker than the test needs.
struct SlowCopySource {
    volume: csi::Volume,
    files: usize,
    /// Snapshots asked for so far (at most [`SLOW_COPY_ROUNDS`]).
    rounds: usize,
}

impl SlowCopySource {
    async fn new(driver: &TestDriver) -> Self {
        let volume = driver
            .create(create_request(&new_name(), snw_mount(), 1 << 30))
            .await;
        write_small_files(&host_path(&volume), 0, SLOW_COPY_FILES);
        SlowCopySource {
            volume,
            files: SLOW_COPY_FILES,
            rounds: 0,
        }
    }

    /// The next round's CreateSnapshot request and its first answer: after the first round, the
    /// volume first gets as many files again (under the round's directory). None once
    /// [`SLOW_COPY_ROUNDS`] were tried.
    async fn next_snapshot(
        &mut self,
        driver: &TestDriver,
    ) -> Option<(csi::CreateSnapshotRequest, csi::Snapshot)> {
        if self.rounds == SLOW_COPY_ROUNDS {
            return None;
        }
        if self.rounds > 0 {
            write_small_files(&host_path(&self.volume), self.rounds, self.files);
            self.files *= 2;
        }
        self.rounds += 1;
        Some(self.snapshot(driver).await)
    }

    /// A CreateSnapshot request of the volume under a new name, and its first answer.
    async fn snapshot(&self, driver: &TestDriver) -> (csi::CreateSnapshotRequest, csi::Snapshot) {
        let request = snapshot_request(&new_snapshot_name(), &self.volume.volume_id);
        let first = driver.create_snapshot(request.clone()).await.unwrap();
        (request, first)
    }
}

/// `copy` holds the same entries as `original` (as [`write_small_files`] made them), with the
/// same content for a sample of them.
#[track_caller]
fn assert_same_small_files(original: &Path, copy: &Path) {
    let relative = |root: &Path| -> Vec<PathBuf> {
        walk(root)
            .into_iter()
            .map(|p| p.strip_prefix(root).unwrap().to_path_buf())
            .collect()
    };
    let names = relative(original);
    assert_eq!(relative(copy), names, "entries of {}", copy.display());
    for rel in names.iter().step_by(997) {
        let path = original.join(rel);
        if path.is_file() {
            assert_eq!(fs::read(copy.join(rel)).unwrap(), fs::read(&path).unwrap());
        }
    }
}

// =============================================================================================
// Capabilities

async fn controller_rpcs(driver: &TestDriver) -> Vec<ControllerRpc> {
    use csi::controller_service_capability::Type::Rpc;
    driver
        .controller()
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .expect("ControllerGetCapabilities")
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|cap| match cap.r#type {
            Some(Rpc(rpc)) => ControllerRpc::try_from(rpc.r#type).ok(),
            None => None,
        })
        .collect()
}

const SNAPSHOT_RPCS: [ControllerRpc; 3] = [
    ControllerRpc::CreateDeleteSnapshot,
    ControllerRpc::ListSnapshots,
    ControllerRpc::CloneVolume,
];

/// The default mode (`all`) advertises snapshots, their listing and clones.
#[tokio::test]
async fn mode_all_claims_snapshot_list_and_clone_capabilities() {
    let driver = TestDriver::start().await;
    let rpcs = controller_rpcs(&driver).await;
    for wanted in SNAPSHOT_RPCS {
        assert!(rpcs.contains(&wanted), "{wanted:?} missing from {rpcs:?}");
    }
}

/// `--mode controller` (beside csi-resizer) does no host work, so claims none of them.
#[tokio::test]
async fn mode_controller_claims_no_snapshot_capability() {
    let driver = TestDriver::start_with(Options {
        mode: Some("controller"),
        ..Default::default()
    })
    .await;
    let rpcs = controller_rpcs(&driver).await;
    for unwanted in SNAPSHOT_RPCS {
        assert!(!rpcs.contains(&unwanted), "{unwanted:?} claimed: {rpcs:?}");
    }
}

// =============================================================================================
// CreateSnapshot

/// The answer names a snapshot of ours (ss-…-<this node's tag>), echoes the source, carries
/// the source's capacity and a creation time of now, becomes ready, and the data and record
/// are where the contract puts them.
#[tokio::test]
async fn create_snapshot_answers_an_id_of_this_node_the_source_size_and_time() {
    let mut driver = TestDriver::start().await;
    let volume = driver
        .create(create_request(&new_name(), snw_mount(), 3 * SIZE))
        .await;
    let content = pattern(MIB as usize, 9);
    write_synced(&host_path(&volume).join("file"), &content);
    let before = now_seconds();
    let snapshot = driver.snapshot_of(&volume.volume_id).await;

    assert_id_of(&snapshot.snapshot_id, "ss-", NODE_ID);
    assert_eq!(snapshot.source_volume_id, volume.volume_id);
    assert_eq!(snapshot.size_bytes, 3 * SIZE);
    assert!(snapshot.ready_to_use);
    let time = snapshot.creation_time.expect("creation_time");
    assert!(
        time.seconds > 0 && (time.seconds - before).abs() <= 60,
        "creation_time {time:?}, now {before}"
    );
    let data = snapshot_dir(&driver.data, &snapshot.snapshot_id);
    assert!(
        fs::symlink_metadata(&data).unwrap().is_dir(),
        "{}",
        data.display()
    );
    assert_eq!(fs::read(data.join("file")).unwrap(), content);
    assert!(
        snapshot_record(&mut driver, &snapshot.snapshot_id)
            .await
            .is_file()
    );
}

/// Same name and source: the same snapshot (id, creation time), no second copy.
#[tokio::test]
async fn create_snapshot_is_idempotent_by_name_and_source() {
    let driver = TestDriver::start().await;
    let (volume, _) = volume_with_file(&driver).await;
    let request = snapshot_request(&new_snapshot_name(), &volume.volume_id);
    let first = driver.create_snapshot_ready(&request).await;
    let again = driver.create_snapshot(request).await.unwrap();
    assert_eq!(again, first);
    assert_eq!(driver.list_all_snapshots().await, vec![first]);
    assert_eq!(dir_names(&driver.data.join("snapshots")).len(), 1);
}

/// The same name for another source is ALREADY_EXISTS, and makes nothing.
#[tokio::test]
async fn create_snapshot_same_name_other_source_is_already_exists() {
    let driver = TestDriver::start().await;
    let (a, _) = volume_with_file(&driver).await;
    let (b, _) = volume_with_file(&driver).await;
    let name = new_snapshot_name();
    let first = driver
        .create_snapshot_ready(&snapshot_request(&name, &a.volume_id))
        .await;
    expect_code(
        driver
            .create_snapshot(snapshot_request(&name, &b.volume_id))
            .await,
        Code::AlreadyExists,
    );
    assert_eq!(driver.list_all_snapshots().await, vec![first]);
}

/// An empty name or an empty source is INVALID_ARGUMENT.
#[tokio::test]
async fn create_snapshot_without_name_or_source_is_invalid() {
    let driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    for (what, request) in [
        ("no name", snapshot_request("", &volume.volume_id)),
        ("no source", snapshot_request(&new_snapshot_name(), "")),
    ] {
        let status = expect_code(driver.create_snapshot(request).await, Code::InvalidArgument);
        assert!(!status.message().is_empty(), "{what}");
    }
    assert!(driver.list_all_snapshots().await.is_empty());
}

/// A source that is not a volume of ours (any other shape) or that this driver does not hold
/// is NOT_FOUND.
#[tokio::test]
async fn create_snapshot_of_an_unknown_or_foreign_source_is_not_found() {
    let driver = TestDriver::start().await;
    let deleted = driver.create_fs_volume().await;
    driver.delete(&deleted.volume_id).await.unwrap();
    for source in [
        deleted.volume_id.clone(),
        unknown_volume_id(),
        volume_id_of(OTHER_NODE),
        format!("sv-{}", uuid::Uuid::now_v7().simple()),
        "pvc-0123".to_string(),
        "../volumes".to_string(),
        snapshot_id_of(NODE_ID),
    ] {
        expect_code(
            driver
                .create_snapshot(snapshot_request(&new_snapshot_name(), &source))
                .await,
            Code::NotFound,
        );
    }
    assert!(driver.list_all_snapshots().await.is_empty());
    assert!(dir_names(&driver.data.join("snapshots")).is_empty());
}

/// VolumeSnapshotClass parameters: csi-snapshotter's `csi.storage.k8s.io/*` keys pass,
/// anything else is INVALID_ARGUMENT naming the key.
#[tokio::test]
async fn create_snapshot_accepts_only_provisioner_parameters() {
    let driver = TestDriver::start().await;
    let (volume, _) = volume_with_file(&driver).await;
    let with = |pairs: &[(&str, &str)]| csi::CreateSnapshotRequest {
        parameters: params(pairs),
        ..snapshot_request(&new_snapshot_name(), &volume.volume_id)
    };
    let accepted = with(&[
        ("csi.storage.k8s.io/volumesnapshot/name", "snap"),
        ("csi.storage.k8s.io/volumesnapshot/namespace", "default"),
        (
            "csi.storage.k8s.io/volumesnapshotcontent/name",
            "snapcontent-1",
        ),
    ]);
    driver.create_snapshot_ready(&accepted).await;
    let refused = with(&[
        ("csi.storage.k8s.io/volumesnapshot/name", "snap"),
        ("compression", "zstd"),
    ]);
    let status = expect_code(driver.create_snapshot(refused).await, Code::InvalidArgument);
    assert!(status.message().contains("compression"), "{status:?}");
    assert_eq!(driver.list_all_snapshots().await.len(), 1);
}

/// A copy that takes longer than CreateSnapshot waits answers not ready; asked again and
/// again under the same name, every answer names the same snapshot with the same creation
/// time until one says it is ready, and the data is then complete.
#[tokio::test]
async fn a_long_copy_is_polled_until_ready_under_one_id() {
    let driver = start_on_tmpfs("3g").await;
    let (volume, request, first) = snapshot_answered_not_ready(&driver).await;
    let ready = driver.create_snapshot_ready(&request).await;
    assert_eq!(ready.snapshot_id, first.snapshot_id);
    assert_eq!(ready.creation_time, first.creation_time);
    assert_eq!(ready.source_volume_id, volume.volume_id);
    assert_same_small_files(
        &host_path(&volume),
        &snapshot_dir(&driver.data, &ready.snapshot_id),
    );
}

// =============================================================================================
// DeleteSnapshot

/// DeleteSnapshot removes the data and the record; a second delete is still OK.
#[tokio::test]
async fn delete_snapshot_removes_its_data_and_record() {
    let mut driver = TestDriver::start().await;
    let (volume, _) = volume_with_file(&driver).await;
    let snapshot = driver.snapshot_of(&volume.volume_id).await;
    let data = snapshot_dir(&driver.data, &snapshot.snapshot_id);
    let record = snapshot_record(&mut driver, &snapshot.snapshot_id).await;
    assert!(data.exists() && record.exists());

    driver.delete_snapshot(&snapshot.snapshot_id).await.unwrap();
    assert!(!exists_no_follow(&data), "data left at {}", data.display());
    snapshot_record(&mut driver, &snapshot.snapshot_id).await;
    assert!(
        !exists_no_follow(&record),
        "record left at {}",
        record.display()
    );
    assert!(driver.list_all_snapshots().await.is_empty());
    assert!(dir_names(&driver.data.join("snapshots")).is_empty());
    driver.delete_snapshot(&snapshot.snapshot_id).await.unwrap();
    // The source is untouched.
    assert!(host_path(&volume).join("file").exists());
}

/// Unknown ids (ours or another node's) and ids of any other shape are already gone: OK. An
/// empty id is INVALID_ARGUMENT.
#[tokio::test]
async fn delete_snapshot_of_unknown_ids_is_ok_and_of_no_id_invalid() {
    let driver = TestDriver::start().await;
    let (volume, _) = volume_with_file(&driver).await;
    let kept = driver.snapshot_of(&volume.volume_id).await;
    for id in [
        snapshot_id_of(NODE_ID),
        snapshot_id_of(OTHER_NODE),
        "snap-123".to_string(),
        "../state".to_string(),
        volume.volume_id.clone(),
    ] {
        driver
            .delete_snapshot(&id)
            .await
            .unwrap_or_else(|s| panic!("DeleteSnapshot {id:?}: {s:?}"));
    }
    expect_code(driver.delete_snapshot("").await, Code::InvalidArgument);
    assert_eq!(driver.list_all_snapshots().await, vec![kept]);
    assert!(host_path(&volume).join("file").exists());
}

// =============================================================================================
// ListSnapshots

/// Every snapshot is listed, with the fields CreateSnapshot answered.
#[tokio::test]
async fn list_snapshots_lists_every_snapshot_with_its_fields() {
    let driver = TestDriver::start().await;
    let (a, _) = volume_with_file(&driver).await;
    let b = driver
        .create(create_request(&new_name(), snw_mount(), 2 * SIZE))
        .await;
    let mut made = vec![
        driver.snapshot_of(&a.volume_id).await,
        driver.snapshot_of(&a.volume_id).await,
        driver.snapshot_of(&b.volume_id).await,
    ];
    let mut listed = driver.list_all_snapshots().await;
    made.sort_by(|x, y| x.snapshot_id.cmp(&y.snapshot_id));
    listed.sort_by(|x, y| x.snapshot_id.cmp(&y.snapshot_id));
    assert_eq!(listed, made);
    for snapshot in &listed {
        assert!(snapshot.ready_to_use);
        assert!(snapshot.creation_time.is_some_and(|t| t.seconds > 0));
        let source = if snapshot.source_volume_id == a.volume_id {
            &a
        } else {
            &b
        };
        assert_eq!(snapshot.source_volume_id, source.volume_id);
        assert_eq!(snapshot.size_bytes, source.capacity_bytes);
    }
}

/// Filters: by snapshot id (the one snapshot; an unknown or malformed id gives an empty
/// list), by source volume (its snapshots only; an unknown source gives an empty list), both.
#[tokio::test]
async fn list_snapshots_filters_by_snapshot_id_and_source_volume() {
    let driver = TestDriver::start().await;
    let (a, _) = volume_with_file(&driver).await;
    let (b, _) = volume_with_file(&driver).await;
    let a1 = driver.snapshot_of(&a.volume_id).await;
    let a2 = driver.snapshot_of(&a.volume_id).await;
    let b1 = driver.snapshot_of(&b.volume_id).await;
    let list = |f: fn(&mut csi::ListSnapshotsRequest, &[String]), args: Vec<String>| {
        let request = list_request(|r| f(r, &args));
        let driver = &driver;
        async move {
            let response = driver
                .list_snapshots(request.clone())
                .await
                .unwrap_or_else(|s| panic!("ListSnapshots {request:?}: {s:?}"));
            let mut ids = ids(&response);
            ids.sort();
            ids
        }
    };
    let by_id = |r: &mut csi::ListSnapshotsRequest, a: &[String]| r.snapshot_id = a[0].clone();
    let by_source =
        |r: &mut csi::ListSnapshotsRequest, a: &[String]| r.source_volume_id = a[0].clone();
    let by_both = |r: &mut csi::ListSnapshotsRequest, a: &[String]| {
        r.snapshot_id = a[0].clone();
        r.source_volume_id = a[1].clone();
    };

    assert_eq!(
        list(by_id, vec![a2.snapshot_id.clone()]).await,
        vec![a2.snapshot_id.clone()]
    );
    for unknown in [
        snapshot_id_of(NODE_ID),
        snapshot_id_of(OTHER_NODE),
        "snap-1".into(),
    ] {
        assert_eq!(list(by_id, vec![unknown]).await, Vec::<String>::new());
    }
    let mut of_a = vec![a1.snapshot_id.clone(), a2.snapshot_id.clone()];
    of_a.sort();
    assert_eq!(list(by_source, vec![a.volume_id.clone()]).await, of_a);
    assert_eq!(
        list(by_source, vec![b.volume_id.clone()]).await,
        vec![b1.snapshot_id.clone()]
    );
    for unknown in [unknown_volume_id(), "pvc-1".into()] {
        assert_eq!(list(by_source, vec![unknown]).await, Vec::<String>::new());
    }
    assert_eq!(
        list(by_both, vec![b1.snapshot_id.clone(), b.volume_id.clone()]).await,
        vec![b1.snapshot_id.clone()]
    );
    assert_eq!(
        list(by_both, vec![b1.snapshot_id.clone(), a.volume_id.clone()]).await,
        Vec::<String>::new()
    );
}

/// Pages of max_entries, followed by next_token, cover every snapshot exactly once; the last
/// page has no next_token. Also with a source filter.
#[tokio::test]
async fn list_snapshots_pages_cover_every_snapshot_once() {
    let driver = TestDriver::start().await;
    let (a, _) = volume_with_file(&driver).await;
    let (b, _) = volume_with_file(&driver).await;
    let mut all = Vec::new();
    let mut of_a = Vec::new();
    for i in 0..7 {
        let source = if i % 3 == 2 { &b } else { &a };
        let snapshot = driver.snapshot_of(&source.volume_id).await;
        if i % 3 != 2 {
            of_a.push(snapshot.snapshot_id.clone());
        }
        all.push(snapshot.snapshot_id);
    }
    all.sort();
    of_a.sort();

    for (source, expected) in [(String::new(), &all), (a.volume_id.clone(), &of_a)] {
        for page_size in [1, 2, 3, 5] {
            let mut seen = Vec::new();
            let mut token = String::new();
            let mut pages = 0;
            loop {
                let response = driver
                    .list_snapshots(list_request(|r| {
                        r.max_entries = page_size;
                        r.starting_token = token.clone();
                        r.source_volume_id = source.clone();
                    }))
                    .await
                    .unwrap();
                assert!(response.entries.len() <= page_size as usize);
                seen.extend(ids(&response));
                pages += 1;
                assert!(pages <= expected.len() + 1, "paging does not end");
                if response.next_token.is_empty() {
                    break;
                }
                token = response.next_token;
            }
            seen.sort();
            assert_eq!(&seen, expected, "pages of {page_size}, source {source:?}");
        }
    }
}

/// Negative max_entries is INVALID_ARGUMENT; a starting_token we never issued is ABORTED.
#[tokio::test]
async fn list_snapshots_refuses_negative_pages_and_strange_tokens() {
    let driver = TestDriver::start().await;
    let (volume, _) = volume_with_file(&driver).await;
    driver.snapshot_of(&volume.volume_id).await;
    expect_code(
        driver
            .list_snapshots(list_request(|r| r.max_entries = -1))
            .await,
        Code::InvalidArgument,
    );
    for token in ["bogus", "1", volume.volume_id.as_str(), "../state"] {
        expect_code(
            driver
                .list_snapshots(list_request(|r| r.starting_token = token.into()))
                .await,
            Code::Aborted,
        );
    }
}

// =============================================================================================
// Restores and clones (default pool: full copies)

/// A volume restored from a snapshot holds the source's tree with every property (owners,
/// modes with setgid, times, xattrs, symlinks, hard links, holes), seen through bind mounts.
#[tokio::test]
async fn restore_keeps_content_and_metadata() {
    assert_copy_keeps_the_tree(true).await;
}

/// A clone of a volume holds the source's tree with every property, like a restore.
#[tokio::test]
async fn clone_keeps_content_and_metadata() {
    assert_copy_keeps_the_tree(false).await;
}

/// Restores (`via_snapshot`) or clones a volume holding `build_tree`'s tree and compares the
/// new volume, published and on the host, with the original; the source keeps its data.
async fn assert_copy_keeps_the_tree(via_snapshot: bool) {
    let driver = TestDriver::start().await;
    let source = driver.create_fs_volume().await;
    let target = driver.publish_at_new_target(&source, snw_mount()).await;
    build_tree(&target);
    let original = manifest(&target);
    driver.unpublish_ok(&source, &target).await;
    let content = if via_snapshot {
        from_snapshot(&driver.snapshot_of(&source.volume_id).await.snapshot_id)
    } else {
        from_volume(&source.volume_id)
    };

    let copy = driver
        .create(restore_request(snw_mount(), content, Some(SIZE)))
        .await;
    assert_id_of(&copy.volume_id, "sv-", NODE_ID);
    let copy_target = driver.publish_at_new_target(&copy, snw_mount()).await;
    assert_same_tree(&original, &copy_target);
    assert_same_tree(&original, &host_path(&copy));
    assert_same_tree(&original, &host_path(&source));
}

/// The response echoes the content source; without a capacity_range the new volume has the
/// source's size (the snapshot's size_bytes, the cloned volume's capacity).
#[tokio::test]
async fn restore_and_clone_echo_the_source_and_default_to_its_size() {
    let driver = TestDriver::start().await;
    let volume = driver
        .create(create_request(&new_name(), snw_mount(), 3 * SIZE))
        .await;
    let snapshot = driver.snapshot_of(&volume.volume_id).await;
    for source in [
        from_snapshot(&snapshot.snapshot_id),
        from_volume(&volume.volume_id),
    ] {
        let made = driver
            .create(restore_request(snw_mount(), source.clone(), None))
            .await;
        assert_eq!(made.content_source, Some(source.clone()));
        assert_eq!(made.capacity_bytes, 3 * SIZE, "{source:?}");
        assert_eq!(driver.capacity_of(&made.volume_id).await, 3 * SIZE);
        // ListVolumes and ControllerGetVolume tell the same story.
        let got = driver.get_volume(&made.volume_id).await.unwrap();
        assert_eq!(got.volume.unwrap().content_source, Some(source));
    }
}

/// A capacity range that allows only less than the source is OUT_OF_RANGE; nothing is made.
#[tokio::test]
async fn restore_or_clone_smaller_than_the_source_is_out_of_range() {
    let driver = TestDriver::start().await;
    let volume = driver
        .create(create_request(&new_name(), snw_mount(), 2 * SIZE))
        .await;
    let snapshot = driver.snapshot_of(&volume.volume_id).await;
    for source in [
        from_snapshot(&snapshot.snapshot_id),
        from_volume(&volume.volume_id),
    ] {
        // Required and limit both below the source; only a limit below it.
        for (required_bytes, limit_bytes) in [(SIZE, SIZE), (0, SIZE)] {
            let request = csi::CreateVolumeRequest {
                capacity_range: Some(csi::CapacityRange {
                    required_bytes,
                    limit_bytes,
                }),
                ..restore_request(snw_mount(), source.clone(), None)
            };
            expect_code(
                driver.controller().create_volume(request).await,
                Code::OutOfRange,
            );
        }
    }
    assert_eq!(driver.list_all().await.len(), 1);
}

/// A larger capacity than the source's is granted as asked.
#[tokio::test]
async fn restore_or_clone_larger_than_the_source_gets_the_size_asked() {
    let driver = TestDriver::start().await;
    let (volume, content) = volume_with_file(&driver).await;
    let snapshot = driver.snapshot_of(&volume.volume_id).await;
    for source in [
        from_snapshot(&snapshot.snapshot_id),
        from_volume(&volume.volume_id),
    ] {
        let made = driver
            .create(restore_request(snw_mount(), source, Some(4 * SIZE)))
            .await;
        assert_eq!(made.capacity_bytes, 4 * SIZE);
        assert_eq!(driver.capacity_of(&made.volume_id).await, 4 * SIZE);
        assert_eq!(fs::read(host_path(&made).join("file")).unwrap(), content);
    }
}

/// Filesystem data cannot become a block volume, nor the reverse: INVALID_ARGUMENT.
#[tokio::test]
async fn restore_or_clone_into_another_access_type_is_invalid() {
    let driver = TestDriver::start().await;
    let fs_volume = driver.create_fs_volume().await;
    let block_volume = driver.create_block_volume().await;
    let fs_snapshot = driver.snapshot_of(&fs_volume.volume_id).await;
    let block_snapshot = driver.snapshot_of(&block_volume.volume_id).await;
    for (capability, source) in [
        (snw_block(), from_snapshot(&fs_snapshot.snapshot_id)),
        (snw_mount(), from_snapshot(&block_snapshot.snapshot_id)),
        (snw_block(), from_volume(&fs_volume.volume_id)),
        (snw_mount(), from_volume(&block_volume.volume_id)),
    ] {
        expect_code(
            driver
                .controller()
                .create_volume(restore_request(capability, source, Some(SIZE)))
                .await,
            Code::InvalidArgument,
        );
    }
    assert_eq!(driver.list_all().await.len(), 2);
    assert_eq!(driver.data_entries().len(), 2);
}

/// A source this node issued but no longer holds (deleted, or never made) is NOT_FOUND.
#[tokio::test]
async fn restore_or_clone_of_a_missing_source_of_this_node_is_not_found() {
    let driver = TestDriver::start().await;
    let (volume, _) = volume_with_file(&driver).await;
    let snapshot = driver.snapshot_of(&volume.volume_id).await;
    driver.delete_snapshot(&snapshot.snapshot_id).await.unwrap();
    driver.delete(&volume.volume_id).await.unwrap();
    for source in [
        from_snapshot(&snapshot.snapshot_id),
        from_snapshot(&snapshot_id_of(NODE_ID)),
        from_volume(&volume.volume_id),
        from_volume(&unknown_volume_id()),
    ] {
        expect_code(
            driver
                .controller()
                .create_volume(restore_request(snw_mount(), source, Some(SIZE)))
                .await,
            Code::NotFound,
        );
    }
    assert!(driver.list_all().await.is_empty());
}

/// A source issued by another node (a real second driver, and made-up ids with its tag) is
/// FAILED_PRECONDITION naming the node's tag: csi-provisioner keeps the claim (no rescheduling
/// round) while restore placement moves it; an untagged volume id of an earlier version, which
/// may be on any node, is RESOURCE_EXHAUSTED so the scheduler tries another.
#[tokio::test]
async fn restore_or_clone_of_another_nodes_source_is_failed_precondition() {
    let other = TestDriver::start_with(Options {
        node_id: Some(OTHER_NODE),
        ..Default::default()
    })
    .await;
    let (elsewhere, _) = volume_with_file(&other).await;
    let elsewhere_snapshot = other.snapshot_of(&elsewhere.volume_id).await;
    assert_id_of(&elsewhere.volume_id, "sv-", OTHER_NODE);
    assert_id_of(&elsewhere_snapshot.snapshot_id, "ss-", OTHER_NODE);

    let driver = TestDriver::start().await;
    for source in [
        from_snapshot(&elsewhere_snapshot.snapshot_id),
        from_volume(&elsewhere.volume_id),
        from_snapshot(&snapshot_id_of(OTHER_NODE)),
        from_volume(&volume_id_of(OTHER_NODE)),
    ] {
        let status = driver
            .controller()
            .create_volume(restore_request(snw_mount(), source, Some(SIZE)))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        let tag = &elsewhere.volume_id[elsewhere.volume_id.len() - 8..];
        assert!(status.message().contains(tag), "{status:?}");
    }
    let untagged = from_volume(&format!("sv-{}", "0".repeat(32)));
    expect_code(
        driver
            .controller()
            .create_volume(restore_request(snw_mount(), untagged, Some(SIZE)))
            .await,
        Code::ResourceExhausted,
    );
    assert!(driver.list_all().await.is_empty());
}

/// Source ids of any shape we never issue are NOT_FOUND.
#[tokio::test]
async fn restore_or_clone_of_a_foreign_shaped_id_is_not_found() {
    let driver = TestDriver::start().await;
    let (volume, _) = volume_with_file(&driver).await;
    let upper = snapshot_id_of(NODE_ID)
        .to_uppercase()
        .replacen("SS-", "ss-", 1);
    for source in [
        from_snapshot("snapshot-1234"),
        from_snapshot("ss-0123"),
        from_snapshot(&upper),
        from_snapshot(&volume.volume_id),
        from_snapshot("../snapshots"),
        from_volume("pvc-1234"),
        from_volume("sv-xyz"),
        from_volume(&snapshot_id_of(NODE_ID)),
    ] {
        expect_code(
            driver
                .controller()
                .create_volume(restore_request(snw_mount(), source, Some(SIZE)))
                .await,
            Code::NotFound,
        );
    }
    assert_eq!(driver.list_all().await.len(), 1);
}

/// The same name and source give the same volume; the same name with another source, or
/// with a source where there was none (and the reverse), is ALREADY_EXISTS.
#[tokio::test]
async fn restore_is_idempotent_by_name_and_source() {
    let driver = TestDriver::start().await;
    let (volume, _) = volume_with_file(&driver).await;
    let one = driver.snapshot_of(&volume.volume_id).await;
    let two = driver.snapshot_of(&volume.volume_id).await;
    let request = restore_request(snw_mount(), from_snapshot(&one.snapshot_id), Some(SIZE));
    let first = driver.create(request.clone()).await;
    assert_eq!(driver.create(request.clone()).await, first);

    let plain_name = create_request(&new_name(), snw_mount(), SIZE);
    driver.create(plain_name.clone()).await;
    for (what, conflicting) in [
        (
            "another snapshot",
            csi::CreateVolumeRequest {
                volume_content_source: Some(from_snapshot(&two.snapshot_id)),
                ..request.clone()
            },
        ),
        (
            "a volume instead",
            csi::CreateVolumeRequest {
                volume_content_source: Some(from_volume(&volume.volume_id)),
                ..request.clone()
            },
        ),
        (
            "no source",
            csi::CreateVolumeRequest {
                volume_content_source: None,
                ..request.clone()
            },
        ),
        (
            "a source for a volume made empty",
            csi::CreateVolumeRequest {
                volume_content_source: Some(from_snapshot(&one.snapshot_id)),
                ..plain_name.clone()
            },
        ),
    ] {
        let status = expect_code(
            driver.controller().create_volume(conflicting).await,
            Code::AlreadyExists,
        );
        assert!(!status.message().is_empty(), "{what}");
    }
    assert_eq!(driver.list_all().await.len(), 3);
}

/// Clones are idempotent by name and source too.
#[tokio::test]
async fn clone_is_idempotent_by_name_and_source() {
    let driver = TestDriver::start().await;
    let (a, _) = volume_with_file(&driver).await;
    let (b, _) = volume_with_file(&driver).await;
    let request = restore_request(snw_mount(), from_volume(&a.volume_id), Some(SIZE));
    let first = driver.create(request.clone()).await;
    assert_eq!(driver.create(request.clone()).await, first);
    let other = csi::CreateVolumeRequest {
        volume_content_source: Some(from_volume(&b.volume_id)),
        ..request
    };
    expect_code(
        driver.controller().create_volume(other).await,
        Code::AlreadyExists,
    );
    assert_eq!(driver.list_all().await.len(), 3);
}

/// A restored volume is a volume like any other: it publishes, takes writes, reports stats,
/// expands online and deletes, and its snapshot stays usable.
#[tokio::test]
async fn a_restored_volume_publishes_expands_and_deletes() {
    let driver = TestDriver::start().await;
    let (volume, content) = volume_with_file(&driver).await;
    let snapshot = driver.snapshot_of(&volume.volume_id).await;
    let restored = driver
        .create(restore_request(
            snw_mount(),
            from_snapshot(&snapshot.snapshot_id),
            None,
        ))
        .await;
    let target = driver.publish_at_new_target(&restored, snw_mount()).await;
    assert_eq!(fs::read(target.join("file")).unwrap(), content);
    fs::write(target.join("new"), b"written after the restore").unwrap();
    driver
        .stats(&restored.volume_id, &path_str(&target))
        .await
        .expect("stats of a restored volume");
    let grown = driver
        .expand(expand_request(&restored.volume_id, &target, 2 * SIZE, 0))
        .await
        .unwrap();
    assert_eq!(grown, 2 * SIZE);
    assert_eq!(driver.capacity_of(&restored.volume_id).await, 2 * SIZE);
    driver.unpublish_ok(&restored, &target).await;
    driver.delete(&restored.volume_id).await.unwrap();
    assert!(!exists_no_follow(&host_path(&restored)));
    // The snapshot did not get the new file, and still restores.
    assert!(
        !snapshot_dir(&driver.data, &snapshot.snapshot_id)
            .join("new")
            .exists()
    );
    let again = driver
        .create(restore_request(
            snw_mount(),
            from_snapshot(&snapshot.snapshot_id),
            None,
        ))
        .await;
    assert_eq!(fs::read(host_path(&again).join("file")).unwrap(), content);
    assert!(!host_path(&again).join("new").exists());
}

/// A snapshot is independent of its source: the source can be deleted, the snapshot is still
/// listed and still restores the data of the moment it was taken.
#[tokio::test]
async fn a_snapshot_outlives_its_source_volume() {
    let driver = TestDriver::start().await;
    let (volume, content) = volume_with_file(&driver).await;
    let snapshot = driver.snapshot_of(&volume.volume_id).await;
    fs::write(
        host_path(&volume).join("file"),
        b"overwritten after the snapshot",
    )
    .unwrap();
    driver.delete(&volume.volume_id).await.unwrap();
    assert!(!exists_no_follow(&host_path(&volume)));

    assert_eq!(driver.list_all_snapshots().await, vec![snapshot.clone()]);
    let restored = driver
        .create(restore_request(
            snw_mount(),
            from_snapshot(&snapshot.snapshot_id),
            None,
        ))
        .await;
    assert_eq!(
        fs::read(host_path(&restored).join("file")).unwrap(),
        content
    );
}

/// Deleting a snapshot leaves the volumes restored from it intact.
#[tokio::test]
async fn a_restored_volume_outlives_its_snapshot() {
    let driver = TestDriver::start().await;
    let source = driver.create_fs_volume().await;
    build_tree(&host_path(&source));
    let original = manifest(&host_path(&source));
    let snapshot = driver.snapshot_of(&source.volume_id).await;
    let restored = driver
        .create(restore_request(
            snw_mount(),
            from_snapshot(&snapshot.snapshot_id),
            None,
        ))
        .await;
    driver.delete_snapshot(&snapshot.snapshot_id).await.unwrap();
    assert!(dir_names(&driver.data.join("snapshots")).is_empty());
    let target = driver.publish_at_new_target(&restored, snw_mount()).await;
    assert_same_tree(&original, &target);
}

/// A snapshot of a volume a pod has published (and writes to) works; it holds what the pod
/// wrote before it. The publication is undisturbed.
#[tokio::test]
async fn a_published_volume_can_be_snapshotted() {
    let driver = TestDriver::start().await;
    let (volume, target, content) = published_with_file(&driver, SIZE).await;
    let snapshot = driver.snapshot_of(&volume.volume_id).await;
    assert_eq!(mounts_at(&target).len(), 1);
    fs::write(target.join("later"), b"after the snapshot").unwrap();
    let restored = driver
        .create(restore_request(
            snw_mount(),
            from_snapshot(&snapshot.snapshot_id),
            None,
        ))
        .await;
    assert_eq!(
        fs::read(host_path(&restored).join("file")).unwrap(),
        content
    );
    assert!(!host_path(&restored).join("later").exists());
    // A clone of the published volume has both.
    let clone = driver
        .create(restore_request(
            snw_mount(),
            from_volume(&volume.volume_id),
            None,
        ))
        .await;
    assert_eq!(fs::read(host_path(&clone).join("file")).unwrap(), content);
    assert!(host_path(&clone).join("later").exists());
    driver.unpublish_ok(&volume, &target).await;
}

// =============================================================================================
// Block volumes

const CHUNK: usize = 64 << 10;
/// Offsets (multiples of 4096) where block tests write; the rest of the image stays a hole.
const OFFSETS: [u64; 3] = [0, 5 << 20, (13 << 20) + 4096];
/// Offsets inside holes.
const HOLES: [u64; 2] = [2 << 20, 9 << 20];

fn write_chunks_into_file(image: &Path, seed: u8) {
    let file = fs::OpenOptions::new().write(true).open(image).unwrap();
    for (i, offset) in OFFSETS.iter().enumerate() {
        file.write_all_at(&pattern(CHUNK, seed + i as u8), *offset)
            .unwrap();
    }
    file.sync_all().unwrap();
}

/// The image holds the chunks `seed` wrote at [`OFFSETS`], zeros in [`HOLES`], and at most
/// a little more than the chunks allocated.
#[track_caller]
fn assert_image_holds(image: &Path, seed: u8) {
    for (i, offset) in OFFSETS.iter().enumerate() {
        assert!(
            read_at(image, *offset, CHUNK) == pattern(CHUNK, seed + i as u8),
            "{} at {offset} does not hold pattern {}",
            image.display(),
            seed + i as u8
        );
    }
    for hole in HOLES {
        assert_eq!(
            read_at(image, hole, 4096),
            vec![0u8; 4096],
            "hole at {hole}"
        );
    }
    let written = (OFFSETS.len() * CHUNK) as u64;
    assert!(
        allocated(image) <= written + (1 << 20),
        "{} lost its holes: {} bytes allocated for {written} written",
        image.display(),
        allocated(image)
    );
}

/// A block snapshot is the image at the time (`<data>/snapshots/<id>.img`); overwriting the
/// source afterwards does not reach it, and a restore has the old pattern and the holes,
/// readable through the published device.
#[tokio::test]
async fn block_snapshot_and_restore_keep_the_pattern_and_the_holes() {
    let driver = TestDriver::start().await;
    let (volume, target) = driver.published_block_volume().await;
    for (i, offset) in OFFSETS.iter().enumerate() {
        write_direct_at(&target, *offset, &pattern(CHUNK, 1 + i as u8));
    }
    driver.unpublish_ok(&volume, &target).await;
    let snapshot = driver.snapshot_of(&volume.volume_id).await;
    assert_eq!(snapshot.size_bytes, SIZE);
    let image = snapshot_image(&driver.data, &snapshot.snapshot_id);
    assert_eq!(fs::metadata(&image).unwrap().len(), SIZE as u64);
    assert_image_holds(&image, 1);

    write_chunks_into_file(&host_path(&volume), 100);
    let restored = driver
        .create(restore_request(
            snw_block(),
            from_snapshot(&snapshot.snapshot_id),
            None,
        ))
        .await;
    assert_eq!(restored.capacity_bytes, SIZE);
    assert_eq!(
        fs::metadata(host_path(&restored)).unwrap().len(),
        SIZE as u64
    );
    assert_image_holds(&host_path(&restored), 1);
    assert_image_holds(&image, 1);
    let target = driver.publish_at_new_target(&restored, snw_block()).await;
    assert_eq!(
        read_direct_at(&target, OFFSETS[1], CHUNK),
        pattern(CHUNK, 2)
    );
    driver.unpublish_ok(&restored, &target).await;
}

/// A block clone copies the image as it is (written directly into the unpublished image);
/// overwriting the source afterwards does not reach the clone.
#[tokio::test]
async fn block_clone_keeps_the_pattern_and_the_holes() {
    let driver = TestDriver::start().await;
    let volume = driver.create_block_volume().await;
    write_chunks_into_file(&host_path(&volume), 1);
    let clone = driver
        .create(restore_request(
            snw_block(),
            from_volume(&volume.volume_id),
            None,
        ))
        .await;
    write_chunks_into_file(&host_path(&volume), 100);
    assert_eq!(clone.capacity_bytes, SIZE);
    assert_image_holds(&host_path(&clone), 1);
    assert_image_holds(&host_path(&volume), 100);
}

/// A block restore asked larger than its snapshot has an image (and a device) of the new
/// size, with the old data at its place.
#[tokio::test]
async fn block_restore_larger_than_the_snapshot_has_the_new_size() {
    let driver = TestDriver::start().await;
    let volume = driver.create_block_volume().await;
    write_chunks_into_file(&host_path(&volume), 1);
    let snapshot = driver.snapshot_of(&volume.volume_id).await;
    let restored = driver
        .create(restore_request(
            snw_block(),
            from_snapshot(&snapshot.snapshot_id),
            Some(3 * SIZE),
        ))
        .await;
    assert_eq!(restored.capacity_bytes, 3 * SIZE);
    let image = host_path(&restored);
    assert_eq!(fs::metadata(&image).unwrap().len(), 3 * SIZE as u64);
    assert_image_holds(&image, 1);
    let target = driver.publish_at_new_target(&restored, snw_block()).await;
    assert_eq!(sysfs_size_bytes(&linked_device(&target)), 3 * SIZE as u64);
    driver.unpublish_ok(&restored, &target).await;
}

// =============================================================================================
// Crash safety

/// kill -9 while a copy runs (CreateSnapshot answered not ready). The snapshot's record is
/// committed before its copy starts (`Volumes::create_snapshot`), so the id the CO holds is
/// never lost: after the restart the same snapshot is listed, the restart finishes its copy
/// by itself (no CreateSnapshot needed), the same request then answers the same id and
/// creation time, ready, with complete data, and no staging copy stays behind. (The test
/// name's "or none" is history: a snapshot the CO was told about may not vanish.)
#[tokio::test]
async fn kill9_during_a_copy_ends_with_the_same_snapshot_ready_or_none() {
    let mut driver = start_on_tmpfs("3g").await;
    let (volume, request, first) = killed_during_a_copy(&mut driver).await;
    let snapshots = driver.data.join("snapshots");
    let staging = format!(".creating-{}", first.snapshot_id);
    let copied = walk(&snapshots.join(&staging)).len();
    let source = walk(&host_path(&volume)).len();
    assert!(
        copied < source,
        "the copy was complete ({copied} of {source} entries) when the driver was killed"
    );
    eprintln!("killed with {copied} of {source} entries copied");
    driver.start_again().await;

    // Still there under its id (ready or not yet), and finished without being asked again.
    let deadline = std::time::Instant::now() + SNAPSHOT_READY_TIMEOUT;
    let resumed = loop {
        let listed = driver
            .list_snapshots(list_request(|r| r.snapshot_id = first.snapshot_id.clone()))
            .await
            .unwrap();
        assert_eq!(
            ids(&listed),
            vec![first.snapshot_id.clone()],
            "the committed snapshot was forgotten by the restart"
        );
        let snapshot = listed.entries[0].snapshot.clone().unwrap();
        if snapshot.ready_to_use {
            break snapshot;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the interrupted copy was not resumed by the restart; log:\n{}",
            driver.log_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(
        driver
            .log_text()
            .contains("restarting a snapshot copy interrupted by a restart"),
        "{}",
        driver.log_text()
    );
    let ready = driver.create_snapshot_ready(&request).await;
    assert_eq!(ready.snapshot_id, first.snapshot_id, "the id changed");
    assert_eq!(ready.creation_time, first.creation_time);
    assert_eq!(resumed, ready);
    let staged: Vec<String> = dir_names(&snapshots)
        .into_iter()
        .filter(|n| n.starts_with(".creating-"))
        .collect();
    assert!(staged.is_empty(), "staging copies left: {staged:?}");
    assert_eq!(
        dir_names(&driver.data.join("lost+found")),
        Vec::<String>::new()
    );
    assert_same_small_files(
        &host_path(&volume),
        &snapshot_dir(&driver.data, &ready.snapshot_id),
    );
    assert_eq!(driver.list_all_snapshots().await, vec![ready]);
}

/// DeleteSnapshot while the copy still runs (CreateSnapshot answered not ready) cancels it:
/// no data, staging copy or record stays, and the source is untouched.
#[tokio::test]
async fn delete_snapshot_during_its_copy_removes_everything() {
    let mut driver = start_on_tmpfs("3g").await;
    let (volume, _, first) = snapshot_answered_not_ready(&driver).await;
    retry_aborted(|| driver.delete_snapshot(&first.snapshot_id))
        .await
        .unwrap();
    assert!(driver.list_all_snapshots().await.is_empty());
    assert_eq!(
        dir_names(&driver.data.join("snapshots")),
        Vec::<String>::new()
    );
    assert!(!exists_no_follow(
        &snapshot_record(&mut driver, &first.snapshot_id).await
    ));
    assert!(host_path(&volume).join("round-0/d00/f00000").is_file());
    // The volume is free to go too: no copy holds it any more.
    driver.delete(&volume.volume_id).await.unwrap();
}

/// A staging copy (`.creating-ss-…`, directory or image) without any record, as a crash
/// leaves it, is removed at start.
#[tokio::test]
async fn start_removes_staged_snapshot_copies_without_a_record() {
    let mut driver = TestDriver::prepare(Options::default());
    let snapshots = driver.data.join("snapshots");
    let staged_dir = snapshots.join(format!(".creating-{}", snapshot_id_of(NODE_ID)));
    fs::create_dir_all(staged_dir.join("sub")).unwrap();
    fs::write(staged_dir.join("sub/file"), b"half copied").unwrap();
    let staged_image = snapshots.join(format!(".creating-{}.img", snapshot_id_of(NODE_ID)));
    fs::write(&staged_image, b"half an image").unwrap();

    driver.start_again().await;
    assert!(!exists_no_follow(&staged_dir), "{}", staged_dir.display());
    assert!(
        !exists_no_follow(&staged_image),
        "{}",
        staged_image.display()
    );
    // Removed, not set aside like data without a record.
    assert_eq!(
        dir_names(&driver.data.join("lost+found")),
        Vec::<String>::new()
    );
    assert!(driver.list_all_snapshots().await.is_empty());
}

/// Edits the record file of snapshot `id` of a stopped driver (a clean stop wrote every record
/// back, so the file is the whole record).
fn edit_snapshot_record(driver: &mut TestDriver, id: &str, edit: impl FnOnce(&mut Value)) {
    assert!(
        !driver.is_running(),
        "stop the driver before editing its records"
    );
    let path = driver
        .data
        .join("state/snapshots")
        .join(format!("{id}.json"));
    let mut record: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    edit(&mut record);
    fs::write(&path, serde_json::to_vec_pretty(&record).unwrap()).unwrap();
}

/// `stickyvol volume show ID --json` against `driver`.
fn volume_shown(driver: &TestDriver, volume_id: &str) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_stickyvol"))
        .args(["volume", "show", volume_id, "--json"])
        .env("ADMIN_SOCKET", &driver.admin_socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stickyvol volume show: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What a snapshot whose copies ran out of attempts says (see `MAX_COPY_ATTEMPTS`).
const STOPPED: &str = "was tried 3 times and stopped";

/// A copy out of attempts (as three starts that each died copying leave it: say, killed out of
/// memory on a tree a pod shaped) is not run again, neither at start nor by CreateSnapshot:
/// csi-snapshotter gets FAILED_PRECONDITION saying why, ListSnapshots keeps it not ready,
/// `stickyvol volume show` says why, and DeleteSnapshot removes it with what the copies left.
#[tokio::test]
async fn a_copy_out_of_attempts_stops_with_an_error_and_can_be_deleted() {
    let mut driver = TestDriver::start().await;
    let (volume, _) = volume_with_file(&driver).await;
    let request = snapshot_request(&new_snapshot_name(), &volume.volume_id);
    let id = driver.create_snapshot_ready(&request).await.snapshot_id;
    driver.stop().await;
    edit_snapshot_record(&mut driver, &id, |record| {
        record["ready"] = false.into();
        record["copy_attempts"] = 3.into();
    });
    let data = snapshot_dir(&driver.data, &id);
    fs::remove_dir_all(&data).unwrap();
    fs::create_dir(&data).unwrap();
    fs::write(data.join("half"), b"half a copy").unwrap();
    driver.start_again().await;

    for _ in 0..2 {
        let err = driver.create_snapshot(request.clone()).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        assert!(err.message().contains(STOPPED), "{err:?}");
        assert!(err.message().contains("killed out of memory?"), "{err:?}");
    }
    let listed = driver.list_all_snapshots().await;
    assert_eq!(listed.len(), 1);
    assert!(!listed[0].ready_to_use);
    // No copy ran: each starts by removing what an earlier one left.
    assert_eq!(dir_names(&data), vec!["half".to_string()]);
    let shown = volume_shown(&driver, &volume.volume_id);
    let error = shown["snapshots"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains(STOPPED), "{shown}");

    driver.delete_snapshot(&id).await.unwrap();
    assert!(driver.list_all_snapshots().await.is_empty());
    assert!(!exists_no_follow(&data));
    assert!(!exists_no_follow(&snapshot_record(&mut driver, &id).await));
    assert!(
        volume_shown(&driver, &volume.volume_id)["snapshots"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

/// A copy that fails is started over by the next CreateSnapshot (as csi-snapshotter retries),
/// but only until its attempts run out: three, the one resumed at start included. Then every
/// call answers the error that stopped it, with the last failure's reason, also after a
/// restart; and the snapshot can still be deleted.
#[tokio::test]
async fn failing_copies_stop_after_three_attempts() {
    let mut driver = TestDriver::start().await;
    let (volume, _) = volume_with_file(&driver).await;
    let name = new_snapshot_name();
    let id = driver
        .create_snapshot_ready(&snapshot_request(&name, &volume.volume_id))
        .await
        .snapshot_id;
    driver.stop().await;
    // Its copy to redo, from a source that is gone: every attempt fails.
    let gone = volume_id_of(NODE_ID);
    edit_snapshot_record(&mut driver, &id, |record| {
        record["ready"] = false.into();
        record["source_volume"] = gone.clone().into();
    });
    driver.start_again().await;

    let request = snapshot_request(&name, &gone);
    let mut stopped = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while stopped.len() < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "answers so far: {stopped:?}"
        );
        // An attempt slower than CreateSnapshot waits answers not ready: call again.
        let Err(err) = driver.create_snapshot(request.clone()).await else {
            continue;
        };
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        assert!(
            err.message().contains("was deleted before its snapshot"),
            "{err:?}"
        );
        stopped.push(err.message().contains(STOPPED));
    }
    assert_eq!(stopped, [false, false, true, true, true]);

    driver.restart().await;
    let err = driver.create_snapshot(request.clone()).await.unwrap_err();
    assert!(err.message().contains(STOPPED), "{err:?}");
    assert!(!driver.list_all_snapshots().await[0].ready_to_use);
    driver.delete_snapshot(&id).await.unwrap();
    assert!(driver.list_all_snapshots().await.is_empty());
    assert_eq!(
        dir_names(&driver.data.join("snapshots")),
        Vec::<String>::new()
    );
}

/// A restart with a copy to redo (kill -9 during it) serves at once: Probe, NodeUnpublish and
/// DeleteVolume answer while the resumed copy still runs (ListSnapshots says not ready after
/// them), and the copy then finishes under the same id.
#[tokio::test]
async fn a_restart_serves_while_an_interrupted_copy_is_redone() {
    let mut driver = start_on_tmpfs("3g").await;
    let other = driver.create_fs_volume().await;
    let (published, target) = driver.published_fs_volume().await;
    let (_, request, first) = killed_during_a_copy(&mut driver).await;
    driver.start_again().await;

    driver.identity().probe(csi::ProbeRequest {}).await.unwrap();
    driver
        .unpublish(&published.volume_id, &target)
        .await
        .unwrap();
    driver.delete(&published.volume_id).await.unwrap();
    driver.delete(&other.volume_id).await.unwrap();
    let listed = driver
        .list_snapshots(list_request(|r| r.snapshot_id = first.snapshot_id.clone()))
        .await
        .unwrap();
    let snapshot = listed.entries[0].snapshot.as_ref().unwrap();
    assert!(
        !snapshot.ready_to_use,
        "the copy was redone before the calls were answered: this test needs a slower copy"
    );

    let ready = driver.create_snapshot_ready(&request).await;
    assert_eq!(ready.snapshot_id, first.snapshot_id);
}

// =============================================================================================
// Capacity and metrics

/// Mounts a tmpfs of `size` at `path` (created if missing). The test driver's cleanup
/// unmounts it, as everything beneath its directory, also when the test fails.
fn mount_tmpfs(path: &Path, size: &str) {
    fs::create_dir_all(path).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        path,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some(format!("size={size},mode=0755").as_str()),
    )
    .unwrap_or_else(|e| panic!("mounting a tmpfs at {}: {e}", path.display()));
}

/// A copied snapshot (default pool) takes its data size out of GetCapacity: the copy holds
/// real space. The data dir is a tmpfs of its own, so no other test moves the free space.
#[tokio::test]
async fn a_copied_snapshot_lowers_capacity_by_its_data_size() {
    let driver = start_on_tmpfs("512m").await;
    let data = 32 * MIB;
    let volume = driver
        .create(create_request(&new_name(), snw_mount(), 64 * MIB))
        .await;
    let target = driver.publish_at_new_target(&volume, snw_mount()).await;
    write_files(&target, 4, (data / 4) as usize);
    // Unenforced directories: the driver learns the volume's usage from a stats walk.
    driver
        .stats(&volume.volume_id, &path_str(&target))
        .await
        .unwrap();
    let before = driver.available_capacity(&[], snw_mount()).await;
    driver.snapshot_of(&volume.volume_id).await;
    let after = driver.available_capacity(&[], snw_mount()).await;
    eprintln!("capacity {before} before, {after} after a snapshot of {data} bytes");
    let slack = 2 * MIB;
    assert!(
        before - after >= data - slack,
        "capacity {before} before, {after} after a snapshot of {data} bytes"
    );
}

/// A snapshot whose copy cannot fit in its pool is refused with RESOURCE_EXHAUSTED and leaves
/// nothing behind; a small one in the same pool fits.
#[tokio::test]
async fn a_snapshot_that_does_not_fit_its_pool_is_resource_exhausted() {
    let mut driver = TestDriver::prepare(Options::default());
    let small = driver.root.join("small");
    mount_tmpfs(&small, "64m");
    driver.add_args(["--pool".to_string(), format!("small={}", small.display())]);
    driver.start_again().await;
    let in_small = |bytes| csi::CreateVolumeRequest {
        parameters: params(&[("pool", "small")]),
        ..create_request(&new_name(), snw_mount(), bytes)
    };

    let little = driver.create(in_small(4 * MIB)).await;
    write_synced(&host_path(&little).join("f"), &pattern(MIB as usize, 1));
    let fits = driver.snapshot_of(&little.volume_id).await;
    assert!(snapshot_dir(&small, &fits.snapshot_id).join("f").exists());

    let big = driver.create(in_small(48 * MIB)).await;
    write_files(&host_path(&big), 5, 8 * MIB as usize);
    expect_code(
        driver
            .create_snapshot(snapshot_request(&new_snapshot_name(), &big.volume_id))
            .await,
        Code::ResourceExhausted,
    );
    assert_eq!(driver.list_all_snapshots().await, vec![fits.clone()]);
    assert_eq!(
        dir_names(&small.join("snapshots")),
        vec![fits.snapshot_id.clone()]
    );
    let snapshot_records: Vec<String> = driver
        .state_entries()
        .await
        .into_iter()
        .filter(|name| name.starts_with("snapshots/"))
        .collect();
    assert_eq!(
        snapshot_records,
        vec![format!("snapshots/{}.json", fits.snapshot_id)]
    );
}

/// `stickyvol_snapshots{pool}` counts snapshots; `stickyvol_pool_snapshot_bytes{pool}` shows
/// what copied snapshots hold; `stickyvol_snapshot_copies{pool,state}` those not ready, whose
/// copy runs or stopped.
#[tokio::test]
async fn snapshot_metrics_count_snapshots_and_their_bytes() {
    let mut driver = TestDriver::start_with_metrics(Options::default()).await;
    let default = [("pool", "default")];
    let count = |driver: &TestDriver| driver.scrape().get("stickyvol_snapshots", &default);
    assert_eq!(count(&driver).unwrap_or(0.0), 0.0);
    let volume = driver.create_fs_volume().await;
    write_files(&host_path(&volume), 1, 4 * MIB as usize);
    let one = driver.snapshot_of(&volume.volume_id).await;
    driver.snapshot_of(&volume.volume_id).await;
    let metrics = driver.scrape();
    assert_eq!(metrics.value("stickyvol_snapshots", &default), 2.0);
    let bytes = metrics.value("stickyvol_pool_snapshot_bytes", &default);
    assert!(bytes > 0.0, "snapshot bytes {bytes}");
    let copies = |driver: &TestDriver, state: &str| {
        driver.scrape().value(
            "stickyvol_snapshot_copies",
            &[("pool", "default"), ("state", state)],
        )
    };
    assert_eq!(copies(&driver, "copying"), 0.0);
    assert_eq!(copies(&driver, "stopped"), 0.0);
    driver.delete_snapshot(&one.snapshot_id).await.unwrap();
    assert_eq!(count(&driver), Some(1.0));

    // One whose copies ran out of attempts (as in a_copy_out_of_attempts_stops_...).
    let id = driver.list_all_snapshots().await[0].snapshot_id.clone();
    driver.stop().await;
    edit_snapshot_record(&mut driver, &id, |record| {
        record["ready"] = false.into();
        record["copy_attempts"] = 3.into();
    });
    driver.start_again().await;
    assert_eq!(copies(&driver, "stopped"), 1.0);
    assert_eq!(copies(&driver, "copying"), 0.0);
}

/// `stickyvol_copies_in_flight{kind}`: a restore, then a clone, counts while CreateVolume
/// copies its data (100,000 small files: seconds), and no longer once CreateVolume answered.
#[tokio::test]
async fn copies_in_flight_count_a_restore_and_a_clone_while_they_copy() {
    // Room for the source's, the restore's and the clone's 1 GiB each; 1.6 GB are written.
    let driver = TestDriver::start_with_metrics_after(Options::default(), |driver| {
        mount_tmpfs(&driver.data, "5g")
    })
    .await;
    let source = SlowCopySource::new(&driver).await;
    let snapshot = driver.snapshot_of(&source.volume.volume_id).await;
    let restore = restore_request(snw_mount(), from_snapshot(&snapshot.snapshot_id), None);
    created_while_counted(&driver, restore, "restore").await;
    let clone = restore_request(snw_mount(), from_volume(&source.volume.volume_id), None);
    created_while_counted(&driver, clone, "clone").await;
}

/// The volume `request` creates, after scrapes every 50 ms while CreateVolume ran saw one copy
/// of `kind` running, and one after it answered sees none.
async fn created_while_counted(
    driver: &TestDriver,
    request: csi::CreateVolumeRequest,
    kind: &str,
) -> csi::Volume {
    let running = || {
        driver
            .scrape()
            .value("stickyvol_copies_in_flight", &[("kind", kind)])
    };
    assert_eq!(running(), 0.0, "{kind} copies before CreateVolume");
    let create = driver.create(request);
    tokio::pin!(create);
    let mut most_seen = 0.0_f64;
    let created = loop {
        tokio::select! {
            created = &mut create => break created,
            () = tokio::time::sleep(std::time::Duration::from_millis(50)) => {
                most_seen = most_seen.max(running());
            }
        }
    };
    assert_eq!(
        most_seen, 1.0,
        "the {kind} copy running, as scrapes saw it while CreateVolume ran"
    );
    assert_eq!(running(), 0.0, "{kind} copies after CreateVolume answered");
    created
}

// =============================================================================================
// btrfs with quota: volumes are subvolumes, snapshots are btrfs snapshots

fn fast(capability: csi::VolumeCapability, bytes: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        parameters: params(&[("pool", "fast")]),
        ..create_request(&new_name(), capability, bytes)
    }
}

fn fast_restore(source: csi::VolumeContentSource, bytes: Option<i64>) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        parameters: params(&[("pool", "fast")]),
        ..restore_request(snw_mount(), source, bytes)
    }
}

/// A snapshot of a published subvolume is ready in the first answer and is a read-only
/// subvolume holding the data.
#[tokio::test]
async fn btrfs_snapshot_is_ready_at_once_and_a_read_only_subvolume() {
    let setup = start_on_btrfs().await;
    let driver = &setup.driver;
    let volume = driver.create(fast(snw_mount(), 16 * MIB)).await;
    assert!(btrfs::is_subvolume(&host_path(&volume)).unwrap());
    let target = driver.publish_at_new_target(&volume, snw_mount()).await;
    write_files(&target, 1, 4 * MIB as usize);
    let snapshot = driver
        .create_snapshot(snapshot_request(&new_snapshot_name(), &volume.volume_id))
        .await
        .unwrap();
    assert!(snapshot.ready_to_use, "{snapshot:?}");
    assert_eq!(snapshot.size_bytes, 16 * MIB);
    let data = snapshot_dir(&setup.pool, &snapshot.snapshot_id);
    assert!(btrfs::is_subvolume(&data).unwrap(), "{}", data.display());
    assert_eq!(
        sha256_of(&data.join("file-000")),
        sha256_of(&target.join("file-000"))
    );
    let write = fs::write(data.join("intruder"), b"x");
    assert_eq!(
        write.as_ref().map_err(|e| e.raw_os_error()),
        Err(Some(libc::EROFS)),
        "the snapshot is writable"
    );
    driver.unpublish_ok(&volume, &target).await;
}

/// A restore on btrfs is a writable subvolume with the data, limited to its size.
#[tokio::test]
async fn btrfs_restore_is_a_writable_subvolume_limited_to_its_size() {
    let setup = start_on_btrfs().await;
    let driver = &setup.driver;
    let volume = driver.create(fast(snw_mount(), 16 * MIB)).await;
    write_files(&host_path(&volume), 1, 4 * MIB as usize);
    let snapshot = driver.snapshot_of(&volume.volume_id).await;
    let restored = driver
        .create(fast_restore(from_snapshot(&snapshot.snapshot_id), None))
        .await;
    assert_eq!(restored.capacity_bytes, 16 * MIB);
    assert!(btrfs::is_subvolume(&host_path(&restored)).unwrap());
    let target = driver.publish_at_new_target(&restored, snw_mount()).await;
    assert_eq!(
        sha256_of(&target.join("file-000")),
        sha256_of(&host_path(&volume).join("file-000"))
    );
    let (written, err) = fill(&target.join("more"), 32 * MIB);
    assert_stopped_at_limit(err, written + 4 * MIB, 16 * MIB, 6 * MIB);
    driver.unpublish_ok(&restored, &target).await;
}

/// A restore asked larger than its snapshot can be written up to its new size, not beyond.
#[tokio::test]
async fn btrfs_restore_larger_than_its_snapshot_fills_up_to_the_new_size() {
    let setup = start_on_btrfs().await;
    let driver = &setup.driver;
    let volume = driver.create(fast(snw_mount(), 16 * MIB)).await;
    write_files(&host_path(&volume), 1, 4 * MIB as usize);
    let snapshot = driver.snapshot_of(&volume.volume_id).await;
    let restored = driver
        .create(fast_restore(
            from_snapshot(&snapshot.snapshot_id),
            Some(48 * MIB),
        ))
        .await;
    assert_eq!(restored.capacity_bytes, 48 * MIB);
    let target = driver.publish_at_new_target(&restored, snw_mount()).await;
    let (written, err) = fill(&target.join("more"), 64 * MIB);
    assert_stopped_at_limit(err, written + 4 * MIB, 48 * MIB, 6 * MIB);
    driver.unpublish_ok(&restored, &target).await;
}

/// A clone on btrfs is a limited subvolume with the source's tree, every property kept.
#[tokio::test]
async fn btrfs_clone_keeps_the_tree_in_a_limited_subvolume() {
    let setup = start_on_btrfs().await;
    let driver = &setup.driver;
    let volume = driver.create(fast(snw_mount(), 16 * MIB)).await;
    build_tree(&host_path(&volume));
    let original = manifest(&host_path(&volume));
    let clone = driver
        .create(fast_restore(from_volume(&volume.volume_id), None))
        .await;
    assert!(btrfs::is_subvolume(&host_path(&clone)).unwrap());
    let target = driver.publish_at_new_target(&clone, snw_mount()).await;
    assert_same_tree(&original, &target);
    let (written, err) = fill(&target.join("more"), 32 * MIB);
    // The tree holds about 3 MiB of data.
    assert!(
        err.is_some(),
        "{written} bytes more fit in a clone of 16 MiB"
    );
    driver.unpublish_ok(&clone, &target).await;
}

/// A block volume on btrfs: its snapshot is ready in the first answer and restores the image.
#[tokio::test]
async fn btrfs_block_snapshot_is_ready_at_once_and_restores() {
    let setup = start_on_btrfs().await;
    let driver = &setup.driver;
    let volume = driver.create(fast(snw_block(), SIZE)).await;
    write_chunks_into_file(&host_path(&volume), 1);
    let snapshot = driver
        .create_snapshot(snapshot_request(&new_snapshot_name(), &volume.volume_id))
        .await
        .unwrap();
    assert!(snapshot.ready_to_use, "{snapshot:?}");
    assert_image_holds(&snapshot_image(&setup.pool, &snapshot.snapshot_id), 1);
    write_chunks_into_file(&host_path(&volume), 100);
    let restored = driver
        .create(csi::CreateVolumeRequest {
            parameters: params(&[("pool", "fast")]),
            ..restore_request(snw_block(), from_snapshot(&snapshot.snapshot_id), None)
        })
        .await;
    assert_image_holds(&host_path(&restored), 1);
}

// =============================================================================================
// XFS with reflink

/// A driver whose pool "fast" is on a fresh XFS with reflink. Field order as for btrfs.
struct XfsDriver {
    driver: TestDriver,
    pool: PathBuf,
    fs: ScratchFs,
}

async fn start_on_xfs() -> XfsDriver {
    let fs = ScratchFs::new("xfs", 512 << 20, &["-q", "-m", "reflink=1"], "");
    let pool = fs.mount_point.join("pool");
    let mut driver = TestDriver::prepare(Options::default());
    driver.add_args(["--pool".to_string(), format!("fast={}", pool.display())]);
    driver.start_again().await;
    XfsDriver { driver, pool, fs }
}

/// A volume in pool "fast" of 128 MiB holding one file ("file-000") of `data` bytes, flushed.
async fn xfs_volume_with(setup: &XfsDriver, data: i64) -> csi::Volume {
    let volume = setup.driver.create(fast(snw_mount(), 128 * MIB)).await;
    write_files(&host_path(&volume), 1, data as usize);
    stickyvol::host::copy::sync_filesystem(&setup.fs.mount_point).unwrap();
    volume
}

/// A snapshot on XFS is ready in the first answer and shares the extents: free space barely
/// changes for a 64 MiB file.
#[tokio::test]
async fn xfs_snapshot_is_ready_at_once_and_shares_extents() {
    let setup = start_on_xfs().await;
    let volume = xfs_volume_with(&setup, 64 * MIB).await;
    let before = available_bytes(&setup.fs.mount_point) as i64;
    let snapshot = setup
        .driver
        .create_snapshot(snapshot_request(&new_snapshot_name(), &volume.volume_id))
        .await
        .unwrap();
    assert!(snapshot.ready_to_use, "{snapshot:?}");
    stickyvol::host::copy::sync_filesystem(&setup.fs.mount_point).unwrap();
    let taken = before - available_bytes(&setup.fs.mount_point) as i64;
    eprintln!("an XFS snapshot of a 64 MiB file took {taken} bytes");
    assert!(taken < 4 * MIB, "the snapshot took {taken} bytes");
    let data = snapshot_dir(&setup.pool, &snapshot.snapshot_id);
    assert_eq!(
        sha256_of(&data.join("file-000")),
        sha256_of(&host_path(&volume).join("file-000"))
    );
}

/// A restore from a reflinked snapshot on XFS has the data, and is independent of the
/// snapshot (a write to it does not reach the snapshot).
#[tokio::test]
async fn xfs_restore_from_a_reflinked_snapshot_has_the_data() {
    let setup = start_on_xfs().await;
    let volume = xfs_volume_with(&setup, 8 * MIB).await;
    let original = sha256_of(&host_path(&volume).join("file-000"));
    let snapshot = setup.driver.snapshot_of(&volume.volume_id).await;
    let restored = setup
        .driver
        .create(fast_restore(from_snapshot(&snapshot.snapshot_id), None))
        .await;
    let file = host_path(&restored).join("file-000");
    assert_eq!(sha256_of(&file), original);
    let handle = fs::OpenOptions::new().write(true).open(&file).unwrap();
    handle.write_all_at(b"changed", 4096).unwrap();
    handle.sync_all().unwrap();
    let data = snapshot_dir(&setup.pool, &snapshot.snapshot_id);
    assert_eq!(sha256_of(&data.join("file-000")), original);
    assert_eq!(sha256_of(&host_path(&volume).join("file-000")), original);
}

/// Restores of one snapshot and clones of one volume may run at the same time (they only read
/// their source); none is turned away with ABORTED. The sources hold enough files that the
/// copies overlap.
#[tokio::test]
async fn concurrent_restores_and_clones_of_one_source_all_succeed() {
    let driver = TestDriver::start().await;
    let source = driver.create_fs_volume().await;
    let data = host_path(&source);
    for i in 0..3000 {
        fs::write(data.join(format!("f{i}")), [i as u8; 512]).unwrap();
    }
    let snapshot = driver
        .create_snapshot_ready(&snapshot_request(&new_snapshot_name(), &source.volume_id))
        .await;
    let request = |content: csi::VolumeContentSource| csi::CreateVolumeRequest {
        volume_content_source: Some(content),
        ..create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), SIZE)
    };
    let mut controller = driver.controller();
    let mut second = driver.controller();
    let mut third = driver.controller();
    let mut fourth = driver.controller();
    let (a, b, c, d) = tokio::join!(
        controller.create_volume(request(from_snapshot(&snapshot.snapshot_id))),
        second.create_volume(request(from_snapshot(&snapshot.snapshot_id))),
        third.create_volume(request(from_volume(&source.volume_id))),
        fourth.create_volume(request(from_volume(&source.volume_id))),
    );
    for made in [a, b, c, d] {
        let volume = made
            .expect("no copy waits for another")
            .into_inner()
            .volume
            .unwrap();
        assert_eq!(dir_names(&host_path(&volume)).len(), 3000);
    }
}

/// A copy that fails for a reason that then goes away: its error reaches the caller, and the
/// next CreateSnapshot starts it over under the same id, which then becomes ready.
#[tokio::test]
async fn a_copy_that_failed_once_is_started_over_under_the_same_id() {
    use common::mounts::TmpfsMount;
    let driver = TestDriver::start().await;
    let (volume, content) = volume_with_file(&driver).await;
    // A mount inside the volume (an admin's, or a leftover): copies never cross one.
    let mount = TmpfsMount::new(
        &host_path(&volume).join("mounted"),
        "1m",
        nix::mount::MsFlags::empty(),
    );
    let request = snapshot_request(&new_snapshot_name(), &volume.volume_id);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let err = loop {
        assert!(std::time::Instant::now() < deadline, "no failure reported");
        match driver.create_snapshot(request.clone()).await {
            Ok(snapshot) => assert!(!snapshot.ready_to_use, "copied across a mount"),
            Err(err) => break err,
        }
    };
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("mount point"), "{err:?}");
    let listed = driver.list_all_snapshots().await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(!listed[0].ready_to_use);
    let failed_id = listed[0].snapshot_id.clone();

    drop(mount);
    let ready = driver.create_snapshot_ready(&request).await;
    assert_eq!(ready.snapshot_id, failed_id);
    let restored = driver
        .create(csi::CreateVolumeRequest {
            volume_content_source: Some(from_snapshot(&ready.snapshot_id)),
            ..create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), SIZE)
        })
        .await;
    assert_eq!(
        fs::read(host_path(&restored).join("file")).unwrap(),
        content
    );
}
