//! Rollbacks that refuse clearly: state written in a format this release cannot read (a record
//! that needs a newer format, a journal file of a newer layout) stops the driver at start,
//! with a message that says what wrote it, what it needs, what this release reads and what to
//! do, and leaves the state byte for byte as it was. Today's own state (directory, block and
//! image volumes, a snapshot) reads back whole, each record saying the format it needs.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use common::*;
use stickyvol::volume::state::format::{SUPPORTED_FORMAT, WRITER};
use stickyvol::volume::state::id::{NodeTag, SnapshotId, VolumeId};

const NEWER_WRITER: &str = "stickyvol 9.9.9 (commit feedface)";

/// Every file under `dir` with its bytes, and every directory (as `None`).
fn tree(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut found = BTreeMap::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.insert(path.clone(), None);
            found.extend(tree(&path));
        } else {
            found.insert(path.clone(), Some(fs::read(&path).unwrap()));
        }
    }
    found
}

fn state_dir(driver: &TestDriver) -> PathBuf {
    driver.data.join("state")
}

fn ext4() -> csi::VolumeCapability {
    let mut cap = mount_cap(Mode::SingleNodeWriter);
    if let Some(csi::volume_capability::AccessType::Mount(mount)) = &mut cap.access_type {
        mount.fs_type = "ext4".into();
    }
    cap
}

/// A driver killed with volumes in use, so its journal holds changes the next start would
/// write back (and recovery would act on): a start that changes nothing is then visible.
async fn killed_with_volumes() -> TestDriver {
    let mut driver = TestDriver::start().await;
    driver.published_fs_volume().await;
    driver.published_block_volume().await;
    driver.kill9();
    // Loading would remove it.
    fs::write(state_dir(&driver).join(".half-written.json.tmp"), b"{").unwrap();
    driver
}

/// Starts the driver, which must refuse; its log, and the state (unchanged).
async fn refused_start(driver: &mut TestDriver) -> String {
    let before = tree(&state_dir(driver));
    let volumes_before = driver.data_entries();
    let log_before = driver.log_text().len();
    let status = driver
        .try_start_again()
        .await
        .expect_err("the driver started over state it cannot read");
    assert!(!status.success(), "{status}");
    assert!(before == tree(&state_dir(driver)), "the state changed");
    assert_eq!(driver.data_entries(), volumes_before);
    driver.log_text()[log_before..].to_string()
}

fn assert_says(log: &str, parts: &[&str]) {
    for part in parts {
        assert!(log.contains(part), "{part:?} missing from the log:\n{log}");
    }
}

#[tokio::test]
async fn a_snapshot_record_needing_a_newer_format_stops_the_start_before_the_volumes_open() {
    let mut driver = killed_with_volumes().await;
    let id = SnapshotId::generate(&NodeTag::of(NODE_ID));
    let record = format!(
        r#"{{"id":"{id}","name":"snap","kind":{{"hologram":"x"}},"needs":9,"written_by":"{NEWER_WRITER}"}}"#
    );
    let planted = state_dir(&driver)
        .join("snapshots")
        .join(format!("{id}.json"));
    fs::write(&planted, record).unwrap();

    let log = refused_start(&mut driver).await;
    assert_says(
        &log,
        &[
            &format!("{} needs state format 9", planted.display()),
            &format!("written by {NEWER_WRITER}"),
            &format!("this release ({WRITER}) reads formats 1 to {SUPPORTED_FORMAT}"),
            "nothing was changed",
            &format!("Roll forward to {NEWER_WRITER} or a later release"),
        ],
    );

    // Without it (an admin's choice, not ours), the same state starts and serves its volumes.
    fs::remove_file(&planted).unwrap();
    driver.start_again().await;
    assert_eq!(driver.list_all().await.len(), 2);
}

#[tokio::test]
async fn a_volume_record_needing_a_newer_format_from_an_unnamed_release_stops_the_start() {
    let mut driver = killed_with_volumes().await;
    let id = VolumeId::generate(&NodeTag::of(NODE_ID));
    let planted = state_dir(&driver).join(format!("{id}.json"));
    fs::write(&planted, format!(r#"{{"id":"{id}","needs":7}}"#)).unwrap();

    let log = refused_start(&mut driver).await;
    assert_says(
        &log,
        &[
            &format!("{} needs state format 7", planted.display()),
            "written by a newer release, which did not say which",
            "Roll forward to a release that reads format 7",
        ],
    );
}

#[tokio::test]
async fn a_journal_file_of_a_newer_layout_stops_the_start() {
    let mut driver = killed_with_volumes().await;
    let planted = state_dir(&driver).join("journal").join("volumes.999");
    let mut newer = b"SVJRNL3\n".to_vec();
    newer.resize(4096, 0xa5);
    fs::write(&planted, newer).unwrap();

    let log = refused_start(&mut driver).await;
    assert_says(
        &log,
        &[
            &planted.display().to_string(),
            "newer layout",
            "SVJRNL3",
            "Roll forward to the release that wrote it",
        ],
    );
}

/// Every volume ListVolumes reports, in id order.
async fn volumes(driver: &TestDriver) -> Vec<csi::Volume> {
    let mut listed: Vec<csi::Volume> = driver
        .list_all()
        .await
        .into_iter()
        .map(|e| e.volume.expect("an entry without its volume"))
        .collect();
    listed.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
    listed
}

/// A record file at rest, as JSON.
fn record_at(path: &Path) -> serde_json::Value {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn todays_state_reads_back_whole_each_record_saying_the_format_it_needs() {
    let mut driver = TestDriver::start().await;
    let directory = driver.create_fs_volume().await;
    let block = driver.create_block_volume().await;
    let image = driver
        .create(create_request(&new_name(), ext4(), SIZE))
        .await;
    let snapshot = driver.snapshot_of(&image.volume_id).await;
    let listed = volumes(&driver).await;
    assert_eq!(listed.len(), 3);
    let snapshots = driver.list_all_snapshots().await;

    // A clean stop writes every record back.
    driver.stop().await;
    let state = state_dir(&driver);
    let image_record = record_at(&state.join(format!("{}.json", image.volume_id)));
    assert_eq!(image_record["needs"], 2, "{image_record}");
    assert_eq!(image_record["written_by"], WRITER);
    let snapshot_record = record_at(
        &state
            .join("snapshots")
            .join(format!("{}.json", snapshot.snapshot_id)),
    );
    assert_eq!(snapshot_record["needs"], 2, "{snapshot_record}");
    for volume in [&directory, &block] {
        let record = record_at(&state.join(format!("{}.json", volume.volume_id)));
        // As the previous release wrote them: it reads them.
        assert!(record.get("needs").is_none(), "{record}");
        assert!(record.get("written_by").is_none(), "{record}");
    }

    driver.start_again().await;
    assert_eq!(volumes(&driver).await, listed);
    assert_eq!(driver.list_all_snapshots().await, snapshots);

    // And from the journal alone, after a crash.
    let again = driver
        .create(create_request(&new_name(), ext4(), SIZE))
        .await;
    driver.kill9();
    driver.start_again().await;
    let after_crash = volumes(&driver).await;
    assert_eq!(after_crash.len(), 4);
    assert!(after_crash.iter().any(|v| v == &again), "{after_crash:?}");
    assert!(listed.iter().all(|v| after_crash.contains(v)));
}
