//! A tenant fills the pool's filesystem, which also holds the state directory and its
//! journals, to the last block (a pool without size enforcement): the driver must still start
//! after a restart, serve Probe, NodeUnpublish, DeleteSnapshot and DeleteVolume (which frees
//! the space), refuse what it cannot record with RESOURCE_EXHAUSTED, say what is wrong, and
//! recover by itself.
//! Run on scratch XFS and btrfs filesystems, which differ: XFS overwrites allocated blocks in
//! place, btrfs copies on write unless the file is NOCOW.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::apistub;
use common::fill::fill_to_the_last_block;
use common::scratchfs::ScratchFs;
use common::*;
use serde_json::{Value, json};
use tonic::Code;

fn snw_mount() -> csi::VolumeCapability {
    mount_cap(Mode::SingleNodeWriter)
}

async fn survives_a_full_filesystem(fs_type: &str, size: u64) {
    // Declared before the driver, so dropped after it (its mounts go first).
    let fs = ScratchFs::new(fs_type, size, &["-q"], "");
    let mut driver = TestDriver::prepare(Options::default());
    driver.data = fs.mount_point.join("data");
    driver.options_mut().metrics_address = Some(free_local_address());
    driver.add_args(["--enforcement", "default=none"]);
    driver.start_again().await;

    let kept = driver.create_fs_volume().await;
    let kept_target = driver.publish_at_new_target(&kept, snw_mount()).await;
    let filler = driver.create_fs_volume().await;
    let filler_target = driver.publish_at_new_target(&filler, snw_mount()).await;
    // A snapshot (cheap on both: reflinks on XFS, a subvolume snapshot on btrfs) to delete
    // once the filesystem is full.
    std::fs::write(filler_target.join("old"), pattern(8 * MIB as usize, 5)).unwrap();
    let snapshot = driver.snapshot_of(&filler.volume_id).await;
    let filled = fill_to_the_last_block(&filler_target.join("fill"));
    assert!(filled > 100 * MIB as u64, "only {filled} bytes went in");
    let free_before = available_bytes(&fs.mount_point);

    // A clean stop (its compaction cannot write the records back), then a crash: both starts
    // find the filesystem full.
    driver.stop().await;
    driver.start_again().await;
    driver.kill9_and_restart().await;
    assert!(
        fill_to_the_last_block(&filler_target.join("fill")) < 4 * MIB as u64,
        "the filesystem was not full"
    );
    let mut expected = vec![kept.volume_id.clone(), filler.volume_id.clone()];
    expected.sort();
    assert_eq!(driver.listed_ids().await, expected);
    let log = driver.log_text();
    assert!(
        log.contains("is full") && log.contains(&fs.mount_point.display().to_string()),
        "no error naming the full filesystem:\n{log}"
    );
    let scrape = driver.scrape();
    assert_eq!(
        scrape.value("stickyvol_pool_filesystem_full", &[("pool", "default")]),
        1.0
    );

    // What cannot be recorded is refused, and not acknowledged.
    let refused = driver
        .controller()
        .create_volume(create_request(&new_name(), snw_mount(), MIB))
        .await;
    expect_code(refused, Code::ResourceExhausted);

    // What frees space works.
    driver
        .delete_snapshot(&snapshot.snapshot_id)
        .await
        .expect("DeleteSnapshot on a full filesystem");
    assert!(driver.list_all_snapshots().await.is_empty());
    driver.unpublish_ok(&kept, &kept_target).await;
    driver.unpublish_ok(&filler, &filler_target).await;
    driver
        .delete(&filler.volume_id)
        .await
        .expect("DeleteVolume on a full filesystem");
    let free_after = available_bytes(&fs.mount_point);
    assert!(
        free_after > free_before + filled / 2,
        "the deletion freed too little: {free_before} → {free_after}"
    );
    let created = driver.create_fs_volume().await;

    // The journal recovers by itself: it rotates and compacts once a new generation fits.
    let compactions = |log: &str| log.matches("journal compacted").count();
    let before = compactions(&driver.log_text());
    let deadline = Instant::now() + Duration::from_secs(60);
    while compactions(&driver.log_text()) == before {
        assert!(
            Instant::now() < deadline,
            "the journal did not compact once space returned:\n{}",
            driver.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        driver
            .scrape()
            .value("stickyvol_pool_filesystem_full", &[("pool", "default")]),
        0.0
    );

    // Every acknowledged record is there after a crash and after a clean restart.
    let mut expected = vec![kept.volume_id.clone(), created.volume_id.clone()];
    expected.sort();
    driver.kill9_and_restart().await;
    assert_eq!(driver.listed_ids().await, expected);
    driver.restart().await;
    assert_eq!(driver.listed_ids().await, expected);
    driver.delete(&kept.volume_id).await.unwrap();
    driver.delete(&created.volume_id).await.unwrap();
    driver.restart().await;
    assert!(driver.listed_ids().await.is_empty());
}

#[tokio::test]
async fn the_driver_survives_a_full_xfs_pool() {
    survives_a_full_filesystem("xfs", 320 * MIB as u64).await;
}

#[tokio::test]
async fn the_driver_survives_a_full_btrfs_pool() {
    survives_a_full_filesystem("btrfs", 256 * MIB as u64).await;
}

/// A thin block volume gets its blocks as the pod writes them: on a pool whose filesystem
/// something else filled, those writes fail with ENOSPC. Its condition says so at once, and is
/// healthy again once space is freed.
/// Bodies of the events.k8s.io Events the stub API server was sent in namespace `shop`.
type Events = Arc<Mutex<Vec<Value>>>;

/// A stub API server that holds claim `shop/data-0` (uid `u-data`) and keeps the Events posted.
async fn stub_api(dir: &std::path::Path) -> (PathBuf, Events) {
    let events = Events::default();
    let kept = events.clone();
    let kubeconfig = apistub::serve(
        Arc::new(move |method: &str, path: &str, body: &[u8]| {
            let path = path.split('?').next().unwrap_or_default();
            match (method, path) {
                ("POST", "/apis/events.k8s.io/v1/namespaces/shop/events") => {
                    let event: Value = serde_json::from_slice(body).unwrap();
                    kept.lock().unwrap().push(event.clone());
                    (201, event)
                }
                ("GET", "/api/v1/namespaces/shop/persistentvolumeclaims/data-0") => (
                    200,
                    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                           "metadata": {"name": "data-0", "namespace": "shop", "uid": "u-data"}}),
                ),
                _ => (404, apistub::status(404, "NotFound")),
            }
        }),
        dir,
    )
    .await;
    (kubeconfig, events)
}

/// Waits up to 30 s for an Event of `reason` on claim `shop/data-0`; its note.
async fn event_note(events: &Events, reason: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = events.lock().unwrap().iter().find_map(|e| {
            (e["reason"] == reason && e["regarding"]["uid"] == "u-data")
                .then(|| e["note"].as_str().unwrap_or_default().to_string())
        });
        if let Some(note) = found {
            return note;
        }
        assert!(
            Instant::now() < deadline,
            "no {reason} Event: {:?}",
            events.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A thin block volume's pool fills: its condition turns abnormal, its claim gets a Warning
/// Event and the pool's starved-volume count says 1; once space is freed, all three say so.
#[tokio::test]
async fn a_thin_volume_on_a_full_pool_is_abnormal_until_space_is_freed() {
    // XFS: its smallest filesystem (300 MiB) holds the volume and leaves room to fill.
    let fs = ScratchFs::new("xfs", 400 << 20, &["-q"], "");
    let scratch = tempfile::tempdir().unwrap();
    let (kubeconfig, events) = stub_api(scratch.path()).await;
    let mut driver = TestDriver::prepare(Options {
        kubeconfig: Some(kubeconfig),
        metrics_address: Some(free_local_address()),
        ..Options::default()
    });
    driver.data = fs.mount_point.join("data");
    driver.add_args(["--enforcement", "default=none"]);
    driver.start_again().await;
    let block = block_cap(Mode::SingleNodeWriter);
    let mut request = create_request(&new_name(), block.clone(), 64 * MIB);
    request.parameters = params(&[
        ("csi.storage.k8s.io/pvc/namespace", "shop"),
        ("csi.storage.k8s.io/pvc/name", "data-0"),
        ("blockAllocation", "thin"),
    ]);
    let volume = driver.create(request).await;
    let device = driver.publish_at_new_target(&volume, block).await;
    let (id, path) = (volume.volume_id.as_str(), path_str(&device));
    assert!(!condition(&driver, id, &path).await.abnormal);
    let starved = || {
        driver
            .scrape()
            .value("stickyvol_pool_starved_volumes", &[("pool", "default")])
    };
    assert_eq!(starved(), 0.0);

    let filler = fs.mount_point.join("filler");
    fill_to_the_last_block(&filler);
    let condition_now = condition(&driver, id, &path).await;
    assert!(
        condition_now.abnormal
            && condition_now.message.contains("is full")
            && condition_now.message.contains("ENOSPC"),
        "{condition_now:?}"
    );
    assert_eq!(starved(), 1.0);
    let note = event_note(&events, "PoolFull").await;
    assert!(note.contains(id) && note.contains("ENOSPC"), "{note}");

    std::fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    // XFS returns an unlinked file's blocks in the background.
    while condition(&driver, id, &path).await.abnormal {
        assert!(
            Instant::now() < deadline,
            "still abnormal after the space was freed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(starved(), 0.0);
    let note = event_note(&events, "PoolSpaceBack").await;
    assert!(note.contains(id), "{note}");
    driver.unpublish_ok(&volume, &device).await;
    driver.delete(&volume.volume_id).await.unwrap();
}

async fn condition(driver: &TestDriver, id: &str, path: &str) -> csi::VolumeCondition {
    let stats = driver.stats(id, path).await.unwrap();
    stats.volume_condition.unwrap()
}
