//! Restarts and crashes: volumes and publications outlive the driver process, and a start after
//! kill -9 reconciles the host with the records.

mod common;

use std::fs;
use std::time::Duration;

use common::scratchfs::ScratchFs;
use common::*;
use stickyvol::host::loopdev;

/// The publications the driver remembers for `id`, from the file it keeps them in (none when
/// the file is absent).
fn recorded_publications(driver: &TestDriver, id: &str) -> usize {
    let path = driver.run.join(format!("{id}.publications.json"));
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice::<Vec<serde_json::Value>>(&bytes)
            .unwrap()
            .len(),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => 0,
        Err(err) => panic!("{}: {err}", path.display()),
    }
}

#[tokio::test]
async fn restart_keeps_volumes_and_data() {
    let mut driver = TestDriver::start().await;
    let fs_request = create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), SIZE);
    let block_request = create_request(&new_name(), block_cap(Mode::SingleNodeWriter), SIZE);
    let fs_volume = driver.create(fs_request.clone()).await;
    let block_volume = driver.create(block_request.clone()).await;
    fs::write(host_path(&fs_volume).join("file"), b"kept").unwrap();
    let target = driver
        .publish_at_new_target(&block_volume, block_cap(Mode::SingleNodeWriter))
        .await;
    let data = pattern(MIB as usize, 5);
    write_direct(&target, &data);
    driver.unpublish_ok(&block_volume, &target).await;
    let before = driver.list_all().await;

    driver.restart().await;
    assert_eq!(driver.list_all().await, before);
    assert_eq!(driver.create(fs_request).await, fs_volume);
    assert_eq!(driver.create(block_request).await, block_volume);
    assert_eq!(
        fs::read(host_path(&fs_volume).join("file")).unwrap(),
        b"kept"
    );
    let target = driver
        .publish_at_new_target(&block_volume, block_cap(Mode::SingleNodeWriter))
        .await;
    assert_eq!(read_direct(&target, data.len()), data);
    driver.unpublish_ok(&block_volume, &target).await;
    assert_eq!(loop_devices_of(&host_path(&block_volume)), vec![]);
}

#[tokio::test]
async fn publications_survive_restart_and_kill9() {
    let mut driver = TestDriver::start().await;
    let (fs_volume, fs_target) = driver.published_fs_volume().await;
    let (block_volume, block_target) = driver.published_block_volume().await;
    let device = linked_device(&block_target);

    for graceful in [true, false] {
        if graceful {
            driver.restart().await;
        } else {
            driver.kill9_and_restart().await;
        }
        // The host kept everything in place, and the driver still knows it.
        assert_eq!(mounts_at(&fs_target).len(), 1);
        assert_eq!(linked_device(&block_target), device);
        assert_eq!(
            loop_devices_of(&host_path(&block_volume)),
            vec![device.clone()]
        );
        driver
            .assert_published_on(&[&fs_volume, &block_volume], &[NODE_ID])
            .await;
        driver
            .stats(&fs_volume.volume_id, &path_str(&fs_target))
            .await
            .expect("stats after restart");
        expect_code(
            driver.delete(&block_volume.volume_id).await,
            Code::FailedPrecondition,
        );
        // kubelet retrying a publish after the restart is still idempotent.
        driver
            .publish_ok(&fs_volume, &fs_target, mount_cap(Mode::SingleNodeWriter))
            .await;
        driver
            .publish_ok(
                &block_volume,
                &block_target,
                block_cap(Mode::SingleNodeWriter),
            )
            .await;
        assert_eq!(mounts_at(&fs_target).len(), 1);
        assert_eq!(
            loop_devices_of(&host_path(&block_volume)),
            vec![device.clone()]
        );
    }

    driver.unpublish_ok(&fs_volume, &fs_target).await;
    driver.unpublish_ok(&block_volume, &block_target).await;
    assert!(mounts_at(&fs_target).is_empty());
    assert!(!exists_no_follow(&fs_target) && !exists_no_follow(&block_target));
    assert_eq!(loop_devices_of(&host_path(&block_volume)), vec![]);
    driver.delete(&fs_volume.volume_id).await.unwrap();
    driver.delete(&block_volume.volume_id).await.unwrap();
}

#[tokio::test]
async fn start_removes_uncommitted_data_and_temp_records() {
    let mut driver = TestDriver::start().await;
    let kept = driver.create_fs_volume().await;
    fs::write(host_path(&kept).join("file"), b"kept").unwrap();
    driver.kill9();

    // What a kill -9 in the middle of CreateVolume leaves before its record commits it.
    let volumes = driver.data.join("volumes");
    let staged_dir = volumes.join(format!(".creating-{}", unknown_volume_id()));
    fs::create_dir_all(staged_dir.join("sub")).unwrap();
    fs::write(staged_dir.join("sub/file"), b"half-made").unwrap();
    let staged_file = volumes.join(format!(".creating-{}.img", unknown_volume_id()));
    fs::write(&staged_file, b"").unwrap();
    let temp_record = driver
        .data
        .join("state")
        .join(format!(".{}.json.tmp", kept.volume_id));
    fs::write(&temp_record, b"{\"torn").unwrap();
    // Not ours: left alone.
    let stranger = volumes.join("README");
    fs::write(&stranger, b"admin notes").unwrap();

    driver.start_again().await;
    // Removed once the socket serves, off the way to it.
    eventually("the staged data is removed", || {
        !exists_no_follow(&staged_dir) && !exists_no_follow(&staged_file)
    })
    .await;
    assert!(!exists_no_follow(&temp_record));
    assert_eq!(fs::read(&stranger).unwrap(), b"admin notes");
    let entries = driver.list_all().await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].volume.as_ref().unwrap(), &kept);
    assert_eq!(fs::read(host_path(&kept).join("file")).unwrap(), b"kept");
}

#[tokio::test]
async fn start_finishes_a_create_interrupted_after_its_commit() {
    let mut driver = TestDriver::start().await;
    let fs_volume = driver.create_fs_volume().await;
    let block_volume = driver.create_block_volume().await;
    fs::write(host_path(&fs_volume).join("file"), b"committed").unwrap();
    driver.kill9();
    // Record written, data not yet moved to its final name.
    for volume in [&fs_volume, &block_volume] {
        let path = host_path(volume);
        let staged = path.with_file_name(format!(
            ".creating-{}",
            path.file_name().unwrap().to_str().unwrap()
        ));
        fs::rename(&path, &staged).unwrap();
    }

    driver.start_again().await;
    assert_eq!(
        fs::read(host_path(&fs_volume).join("file")).unwrap(),
        b"committed"
    );
    assert_eq!(
        fs::metadata(host_path(&block_volume)).unwrap().len(),
        block_volume.capacity_bytes as u64
    );
    assert_eq!(
        driver.data_entries().len(),
        2,
        "{:?}",
        driver.data_entries()
    );
}

#[tokio::test]
async fn data_without_any_record_is_moved_aside_never_deleted() {
    let mut driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    fs::write(host_path(&volume).join("precious"), b"user data").unwrap();
    driver.kill9();
    // E.g. the state directory was lost: the data is all that is left.
    fs::remove_dir_all(driver.data.join("state")).unwrap();

    driver.start_again().await;
    assert!(!exists_no_follow(&host_path(&volume)));
    let moved = driver.data.join("lost+found").join(&volume.volume_id);
    assert_eq!(fs::read(moved.join("precious")).unwrap(), b"user data");
    assert!(driver.list_all().await.is_empty());
    assert!(driver.log_text().contains("moved to lost+found"));
}

#[tokio::test]
async fn unreadable_record_keeps_its_data_and_blocks_deletion() {
    let mut driver = TestDriver::prepare(Options::default());
    let id = unknown_volume_id();
    let data = driver.data.join("volumes").join(&id);
    fs::create_dir_all(&data).unwrap();
    fs::write(data.join("precious"), b"user data").unwrap();
    fs::create_dir_all(driver.data.join("state")).unwrap();
    let record = driver.data.join("state").join(format!("{id}.json"));
    fs::write(&record, b"{ this is not json").unwrap();

    driver.start_again().await;
    assert_eq!(fs::read(data.join("precious")).unwrap(), b"user data");
    expect_code(driver.delete(&id).await, Code::FailedPrecondition);
    assert_eq!(fs::read(data.join("precious")).unwrap(), b"user data");
    assert!(record.exists());
    assert!(
        driver.log_text().contains(&id),
        "the bad record must be reported"
    );

    driver.restart().await;
    assert_eq!(fs::read(data.join("precious")).unwrap(), b"user data");
}

#[tokio::test]
async fn start_forgets_publications_removed_behind_its_back() {
    let mut driver = TestDriver::start().await;
    let (fs_volume, fs_target) = driver.published_fs_volume().await;
    let (block_volume, block_target) = driver.published_block_volume().await;
    driver.kill9();

    // A node reboot (or an admin) removes the mount and the symlink while the driver is down.
    nix::mount::umount(&fs_target).unwrap();
    fs::remove_dir(&fs_target).unwrap();
    fs::remove_file(&block_target).unwrap();
    assert_eq!(recorded_publications(&driver, &fs_volume.volume_id), 1);

    driver.start_again().await;
    assert_eq!(recorded_publications(&driver, &fs_volume.volume_id), 0);
    assert_eq!(recorded_publications(&driver, &block_volume.volume_id), 0);
    assert_eq!(
        loop_devices_of(&host_path(&block_volume)),
        vec![],
        "the device of a forgotten publication is detached"
    );
    driver
        .assert_published_on(&[&fs_volume, &block_volume], &[])
        .await;
    // Kubelet's late unpublish still succeeds; deletion is not blocked.
    driver.unpublish_ok(&fs_volume, &fs_target).await;
    driver.unpublish_ok(&block_volume, &block_target).await;
    driver.delete(&fs_volume.volume_id).await.unwrap();
    driver.delete(&block_volume.volume_id).await.unwrap();
}

#[tokio::test]
async fn start_detaches_loop_devices_no_publication_uses() {
    let mut driver = TestDriver::start().await;
    let volume = driver.create_block_volume().await;
    let file = host_path(&volume);
    driver.kill9();
    // A crash between attaching the device and linking the target.
    let device = loopdev::attach(&file, false).expect("attaching a loop device");
    assert_eq!(loop_devices_of(&file), vec![device]);

    driver.start_again().await;
    assert_eq!(loop_devices_of(&file), vec![]);
    driver.delete(&volume.volume_id).await.unwrap();
}

/// Data under the staging name in the default pool: a create cut before it moved it in place.
fn staged_entries(driver: &TestDriver) -> Vec<String> {
    driver
        .data_entries()
        .into_iter()
        .filter(|name| name.starts_with(".creating-"))
        .collect()
}

/// Rounds of the create storm, each with its own kill point; more (up to the most) while
/// no kill has landed inside a create yet.
const STORM_ROUNDS: u64 = 10;
const STORM_ROUNDS_AT_MOST: u64 = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_create_storms_converges_to_one_volume_per_name() {
    let mut driver = TestDriver::start().await;
    let mut requests = Vec::new();
    // Rounds whose kill landed inside a create: its data was still under the staging name,
    // where a create makes it before its commit and moves it in place after.
    let mut landed_mid_create = 0;
    for round in 0..STORM_ROUNDS_AT_MOST {
        if round >= STORM_ROUNDS && landed_mid_create > 0 {
            break;
        }
        // A fresh name each round, so each kill can land inside a first create (about 2 ms).
        let request = create_request(&new_name(), block_cap(Mode::SingleNodeWriter), SIZE);
        requests.push(request.clone());
        let staged_before = staged_entries(&driver);
        let controller = driver.controller();
        // Calls until the first error other than ABORTED, which it returns.
        let hammer = tokio::spawn(async move {
            loop {
                match controller.clone().create_volume(request.clone()).await {
                    Err(status) if status.code() != Code::Aborted => return status,
                    _ => {}
                }
            }
        });
        // A different point of the create path each round; correctness does not depend on it.
        // Scaled where calls are slower (emulation), or every kill comes before the first call.
        std::thread::sleep(on_this_machine(Duration::from_micros(
            round % STORM_ROUNDS * 300,
        )));
        driver.kill9();
        // New since the round began: an uncommitted one from an earlier round may still be
        // waiting for its removal, which runs once the driver serves.
        let staged: Vec<String> = staged_entries(&driver)
            .into_iter()
            .filter(|name| !staged_before.contains(name))
            .collect();
        assert!(staged.len() <= 1, "one create at a time: {staged:?}");
        landed_mid_create += staged.len();
        assert_ended_by_the_kill(hammer).await;
        driver.start_again().await;
    }
    eprintln!(
        "{} rounds, {landed_mid_create} of their kills landed mid-create",
        requests.len()
    );
    assert!(
        landed_mid_create > 0,
        "no kill of {} landed inside a create: the storm tested only kills between creates",
        requests.len()
    );
    // Every one was settled at its restart: moved in place if committed, else removed.
    let settled = |log: &str| {
        log.matches("finished a create interrupted after its commit")
            .count()
            + log
                .matches("removed the data of a create interrupted before its commit")
                .count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while settled(&driver.log_text()) < landed_mid_create {
        assert!(
            std::time::Instant::now() < deadline,
            "{landed_mid_create} creates were cut, fewer settled; log:\n{}",
            driver.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut expected_data = Vec::new();
    let mut expected_state = Vec::new();
    for request in &requests {
        let volume = driver.create_retrying(request).await;
        assert_eq!(
            fs::metadata(host_path(&volume)).unwrap().len(),
            volume.capacity_bytes as u64
        );
        expected_data.push(format!("{}.img", volume.volume_id));
        expected_state.push(format!("{}.json", volume.volume_id));
    }
    expected_data.sort();
    expected_state.sort();
    assert_eq!(driver.list_all().await.len(), requests.len());
    assert_eq!(driver.data_entries(), expected_data, "no orphaned data");
    assert_eq!(
        driver.state_entries().await,
        expected_state,
        "no stray records"
    );
}

#[tokio::test]
async fn publications_kept_inside_records_by_older_versions_survive_an_upgrade() {
    let mut driver = TestDriver::start().await;
    let (volume, target) = driver.published_fs_volume().await;
    driver.stop().await;
    // What an older version left: the publications inside the record, no side file.
    let state = driver.data.join("state");
    let record_path = state.join(format!("{}.json", volume.volume_id));
    let side_path = driver
        .run
        .join(format!("{}.publications.json", volume.volume_id));
    let publications: serde_json::Value =
        serde_json::from_slice(&fs::read(&side_path).unwrap()).unwrap();
    let mut record: serde_json::Value =
        serde_json::from_slice(&fs::read(&record_path).unwrap()).unwrap();
    record["publications"] = publications;
    fs::write(&record_path, serde_json::to_vec(&record).unwrap()).unwrap();
    fs::remove_file(&side_path).unwrap();

    // The new version rewrites the record (an expansion), then restarts: the volume must
    // still be known as published there.
    driver.start_again().await;
    driver
        .expand(expand_request(&volume.volume_id, &target, 2 * SIZE, 0))
        .await
        .unwrap();
    driver.restart().await;
    assert_eq!(recorded_publications(&driver, &volume.volume_id), 1);
    driver
        .stats(&volume.volume_id, &path_str(&target))
        .await
        .expect("stats of a volume published before the upgrade");
    expect_code(
        driver.delete(&volume.volume_id).await,
        tonic::Code::FailedPrecondition,
    );
    driver.unpublish_ok(&volume, &target).await;
}

/// The newest generation of the volume journal (`state/journal/volumes.<n>`).
fn newest_volume_journal(driver: &TestDriver) -> std::path::PathBuf {
    fs::read_dir(driver.data.join("state/journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let n = p
                .file_name()?
                .to_str()?
                .strip_prefix("volumes.")?
                .parse::<u64>()
                .ok()?;
            Some((n, p))
        })
        .max()
        .expect("a volume journal")
        .1
}

/// A power loss in the middle of the commit of a create: the journal ends with a torn entry
/// (`cut`: truncated, else a bad checksum), and what was never flushed is gone — the record
/// file, and the data's move to its final name.
async fn torn_create(cut: bool) {
    let mut driver = TestDriver::start().await;
    let kept = driver.create_block_volume().await;
    let torn = driver.create_block_volume().await;
    driver.kill9();
    let journal = newest_volume_journal(&driver);
    let mut bytes = fs::read(&journal).unwrap();
    // The journal is preallocated: its entries end where the zeros start.
    let end = bytes.iter().rposition(|&b| b != 0).unwrap() + 1;
    if cut {
        bytes[end - 10..end].fill(0);
    } else {
        bytes[end - 5] ^= 0x5a;
    }
    fs::write(&journal, &bytes).unwrap();
    // Record files are written back only by compaction: none was made for it.
    assert!(
        !driver
            .data
            .join("state")
            .join(format!("{}.json", torn.volume_id))
            .exists()
    );
    let path = host_path(&torn);
    let staged = path.with_file_name(format!(".creating-{}.img", torn.volume_id));
    fs::rename(&path, &staged).unwrap();

    driver.start_again().await;
    let listed = driver.list_all().await;
    assert_eq!(listed.len(), 1, "the torn create is ignored: {listed:?}");
    assert_eq!(listed[0].volume.as_ref().unwrap(), &kept);
    eventually("its uncommitted data is removed", || {
        !exists_no_follow(&staged)
    })
    .await;
    assert!(
        driver.log_text().contains("torn"),
        "a warning names the torn entry"
    );
    assert_eq!(
        driver.data_entries(),
        vec![format!("{}.img", kept.volume_id)]
    );
    // A clean restart afterwards has nothing left to complain about.
    driver.restart().await;
    assert_eq!(driver.list_all().await.len(), 1);
}

#[tokio::test]
async fn a_truncated_journal_tail_is_ignored_with_a_warning() {
    torn_create(true).await;
}

#[tokio::test]
async fn a_journal_tail_with_a_bad_checksum_is_ignored_with_a_warning() {
    torn_create(false).await;
}

#[tokio::test]
async fn damage_in_the_middle_of_the_journal_refuses_to_start() {
    let mut driver = TestDriver::start().await;
    driver.create_block_volume().await;
    driver.create_block_volume().await;
    driver.kill9();
    let journal = newest_volume_journal(&driver);
    let mut bytes = fs::read(&journal).unwrap();
    // The first entry's checksum (after the 8-byte magic and its 4-byte length): the second
    // create was committed after the first was durable, so this is not a crash's doing.
    bytes[12] ^= 0x5a;
    fs::write(&journal, &bytes).unwrap();
    assert!(driver.try_start_again().await.is_err());
    assert!(
        driver.log_text().contains("damaged"),
        "{}",
        driver.log_text()
    );
}

/// The data filesystem fails (shut down, as ext4 and XFS do after fatal I/O errors): Probe
/// turns not ready and the journal-health metric 0, so the livenessprobe sidecar gets the driver restarted, and once the
/// filesystem is back a restart finds every volume as it was.
#[tokio::test]
async fn io_errors_on_the_state_filesystem_make_the_driver_not_ready_until_a_restart() {
    let mut fs = ScratchFs::new("ext4", 256 * MIB as u64, &["-q"], "");
    let mut driver = TestDriver::prepare(Options::default());
    driver.data = fs.path("data");
    driver.options_mut().metrics_address = Some(free_local_address());
    driver.start_again().await;
    let volume = driver.create_fs_volume().await;
    assert_eq!(probe_ready(&driver).await, Some(true));
    assert_eq!(journal_healthy(&driver), 1.0);
    assert_eq!(ready_metric(&driver), 1.0);

    fs.shut_down();
    // The journal's file can no longer be read...
    assert_eq!(probe_ready(&driver).await, Some(false));
    assert!(last_not_ready(&driver).contains("reading the journal"));
    // (stickyvol_ready says what Probe says, before any commit failed.)
    assert_eq!(ready_metric(&driver), 0.0);
    // ...and once a commit has failed, the journal refuses every later one.
    let status = driver.delete(&volume.volume_id).await.unwrap_err();
    assert!(
        status.message().contains("Input/output error"),
        "{status:?}"
    );
    assert_eq!(probe_ready(&driver).await, Some(false));
    assert!(last_not_ready(&driver).contains("appending to the journal"));
    assert_eq!(journal_healthy(&driver), 0.0);

    driver.kill9();
    fs.remount();
    driver.start_again().await;
    assert_eq!(probe_ready(&driver).await, Some(true));
    assert_eq!(journal_healthy(&driver), 1.0);
    assert_eq!(ready_metric(&driver), 1.0);
    assert_eq!(driver.list_all().await.len(), 1);
    driver.delete(&volume.volume_id).await.unwrap();
}

/// `stickyvol_ready`, scraped.
fn ready_metric(driver: &TestDriver) -> f64 {
    driver.scrape().value("stickyvol_ready", &[])
}

/// `stickyvol_journal_healthy` of the volumes' journal, scraped.
fn journal_healthy(driver: &TestDriver) -> f64 {
    driver
        .scrape()
        .value("stickyvol_journal_healthy", &[("journal", "volumes")])
}

async fn probe_ready(driver: &TestDriver) -> Option<bool> {
    let probe = driver.identity().probe(csi::ProbeRequest {}).await;
    probe.expect("Probe").into_inner().ready
}

/// The reason the driver logged last for answering Probe "not ready".
fn last_not_ready(driver: &TestDriver) -> String {
    let log = driver.log_text();
    let line = log.lines().rev().find(|line| line.contains("not ready"));
    let line = line.unwrap_or_else(|| panic!("no \"not ready\" in the log:\n{log}"));
    assert!(
        line.contains("the volume state journal cannot take commits"),
        "{line}"
    );
    line.to_string()
}

/// DeleteVolume committed, then a power loss undid the (unflushed) removal of the data: the
/// next start finishes the removal, since the journal still says the volume was deleted.
#[tokio::test]
async fn data_a_power_loss_brought_back_after_a_delete_is_removed_at_start() {
    let mut driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    driver.delete(&volume.volume_id).await.unwrap();
    driver.kill9();
    fs::create_dir(host_path(&volume)).unwrap();
    fs::write(host_path(&volume).join("old"), b"deleted data").unwrap();

    driver.start_again().await;
    eventually("the deleted volume's data is removed", || {
        !exists_no_follow(&host_path(&volume)) && driver.log_text().contains("a crash brought back")
    })
    .await;
    assert!(!driver.data.join("lost+found").exists());
    assert!(driver.list_all().await.is_empty());
    // Off the way to serving: a big tree must not keep the node's storage down.
    let log = driver.log_text();
    let serving = log.rfind("serving CSI").unwrap();
    assert!(log[serving..].contains("a crash brought back"), "{log}");
}

/// A power loss right after a create's commit took its (unflushed) data and the move into
/// place: the empty volume is remade from its record. A volume whose data vanished after it
/// was used is reported, not remade.
#[tokio::test]
async fn the_empty_data_of_a_create_lost_by_a_power_loss_is_remade() {
    let mut driver = TestDriver::start().await;
    let fs_volume = driver.create_fs_volume().await;
    let block_volume = driver.create_block_volume().await;
    let (used, target) = driver.published_fs_volume().await;
    driver.kill9();
    fs::remove_dir(host_path(&fs_volume)).unwrap();
    // The image's size did not reach the disk either.
    fs::write(host_path(&block_volume), b"").unwrap();
    nix::mount::umount(&target).unwrap();
    fs::remove_dir_all(host_path(&used)).unwrap();

    driver.start_again().await;
    assert!(host_path(&fs_volume).is_dir());
    assert_eq!(
        fs::metadata(host_path(&block_volume)).unwrap().len(),
        block_volume.capacity_bytes as u64
    );
    assert!(
        !exists_no_follow(&host_path(&used)),
        "a used volume's lost data is not remade"
    );
    driver.delete(&fs_volume.volume_id).await.unwrap();
    driver.delete(&block_volume.volume_id).await.unwrap();
}

/// What versions before the journal left: one durable JSON per record, publications in side
/// files or inline, no `state/journal/`.
#[tokio::test]
async fn a_state_directory_of_the_old_layout_loads_unchanged() {
    let mut driver = TestDriver::start().await;
    let fs_volume = driver.create_fs_volume().await;
    let block_volume = driver.create_block_volume().await;
    fs::write(host_path(&fs_volume).join("file"), b"kept").unwrap();
    let (published, target) = driver.published_fs_volume().await;
    let deleted = driver.create_block_volume().await;
    driver.delete(&deleted.volume_id).await.unwrap();
    let before = driver.list_all().await;
    // A clean stop writes every record back; then the old layout: record files, no journal.
    driver.stop().await;
    fs::remove_dir_all(driver.data.join("state/journal")).unwrap();

    driver.start_again().await;
    assert_eq!(driver.list_all().await, before);
    assert!(driver.log_text().contains("volume state loaded"));
    assert!(!driver.data.join("lost+found").exists());
    assert_eq!(
        fs::read(host_path(&fs_volume).join("file")).unwrap(),
        b"kept"
    );
    assert_eq!(recorded_publications(&driver, &published.volume_id), 1);
    driver.unpublish_ok(&published, &target).await;
    for volume in [&fs_volume, &block_volume, &published] {
        driver.delete(&volume.volume_id).await.unwrap();
    }
    let records = driver.state_entries().await;
    assert!(records.is_empty(), "{records:?}");
    driver.restart().await;
    assert!(driver.list_all().await.is_empty());
}

/// Creates, deletes, publishes and unpublishes racing kill -9: every name ends with one
/// volume, every deleted volume is gone, data fsynced before the storm is intact, and once the
/// CO and kubelet retry nothing is leaked (records, data, mounts, loop devices) or moved to
/// lost+found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_create_delete_and_publish_storms_converges() {
    let mut driver = TestDriver::start().await;
    let fs_volume = driver.create_fs_volume().await;
    write_synced(
        &host_path(&fs_volume).join("kept"),
        b"synced before the storm",
    );
    let block_volume = driver.create_block_volume().await;
    {
        use std::os::unix::fs::FileExt;
        let image = fs::OpenOptions::new()
            .write(true)
            .open(host_path(&block_volume))
            .unwrap();
        image.write_all_at(&pattern(4096, 9), 0).unwrap();
        image.sync_all().unwrap();
    }
    let mut targets = Vec::new();
    let published = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut kept = Vec::new();
    let mut deleted = Vec::new();
    for round in 0..8u64 {
        let doomed = driver
            .create(create_request(
                &new_name(),
                block_cap(Mode::SingleNodeWriter),
                SIZE,
            ))
            .await;
        deleted.push(doomed.volume_id.clone());
        let request = create_request(&new_name(), block_cap(Mode::SingleNodeWriter), SIZE);
        kept.push(request.clone());
        let controller = driver.controller();
        let creator = tokio::spawn(async move {
            loop {
                match controller.clone().create_volume(request.clone()).await {
                    Err(status) if status.code() != Code::Aborted => return status,
                    _ => {}
                }
            }
        });
        let controller = driver.controller();
        let doomed_id = doomed.volume_id.clone();
        let deleter = tokio::spawn(async move {
            loop {
                let request = csi::DeleteVolumeRequest {
                    volume_id: doomed_id.clone(),
                    secrets: Default::default(),
                };
                match controller.clone().delete_volume(request).await {
                    Err(status) if status.code() != Code::Aborted => return status,
                    _ => {}
                }
            }
        });
        // Kubelet publishing and unpublishing both volumes at fresh targets, over and over.
        let round_targets = vec![
            (
                fs_volume.clone(),
                driver.mount_target(),
                mount_cap(Mode::SingleNodeWriter),
            ),
            (
                block_volume.clone(),
                driver.block_target(),
                block_cap(Mode::SingleNodeWriter),
            ),
        ];
        targets.extend(
            round_targets
                .iter()
                .map(|(v, t, _)| (v.volume_id.clone(), t.clone())),
        );
        let node = driver.node();
        let published = published.clone();
        let publisher = tokio::spawn(async move {
            loop {
                for (volume, target, capability) in &round_targets {
                    let publish = publish_request(volume, target, capability.clone(), false);
                    let unpublish = csi::NodeUnpublishVolumeRequest {
                        volume_id: volume.volume_id.clone(),
                        target_path: path_str(target),
                    };
                    let done = node.clone().node_publish_volume(publish).await;
                    if done.is_ok() {
                        published.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    for result in [
                        done.map(drop),
                        node.clone()
                            .node_unpublish_volume(unpublish)
                            .await
                            .map(drop),
                    ] {
                        match result {
                            Err(status) if status.code() != Code::Aborted => return status,
                            _ => {}
                        }
                    }
                }
            }
        });
        // A different moment of the hammers' work each round (scaled as in the create storm).
        std::thread::sleep(on_this_machine(Duration::from_micros(round * 1500)));
        driver.kill9();
        for hammer in [creator, deleter, publisher] {
            assert_ended_by_the_kill(hammer).await;
        }
        driver.start_again().await;
    }

    assert!(
        published.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "the storm published nothing: it tests nothing"
    );
    // Kubelet retries every unpublish it got no answer to, the CO every delete.
    for (volume_id, target) in &targets {
        driver.unpublish(volume_id, target).await.unwrap();
    }
    assert!(
        driver.mounts_left().is_empty(),
        "{:?}",
        driver.mounts_left()
    );
    assert!(driver.loop_devices_left().is_empty());
    assert_eq!(
        fs::read(host_path(&fs_volume).join("kept")).unwrap(),
        b"synced before the storm"
    );
    assert_eq!(
        read_at(&host_path(&block_volume), 0, 4096),
        pattern(4096, 9)
    );
    for id in &deleted {
        driver.delete(id).await.unwrap();
    }
    for volume in [&fs_volume, &block_volume] {
        driver.delete(&volume.volume_id).await.unwrap();
    }
    let mut expected_data = Vec::new();
    let mut expected_state = Vec::new();
    for request in &kept {
        let volume = driver.create_retrying(request).await;
        expected_data.push(format!("{}.img", volume.volume_id));
        expected_state.push(format!("{}.json", volume.volume_id));
    }
    expected_data.sort();
    expected_state.sort();
    assert_eq!(driver.list_all().await.len(), kept.len());
    assert_eq!(driver.data_entries(), expected_data, "no leaked data");
    assert_eq!(
        driver.state_entries().await,
        expected_state,
        "no leaked records"
    );
    assert!(
        !driver.data.join("lost+found").exists(),
        "nothing deleted was quarantined"
    );
    driver.restart().await;
    assert_eq!(driver.list_all().await.len(), kept.len());
}

/// Publications live in the run directory (a tmpfs in production): a driver restart finds them
/// there, a file an earlier version kept beside the record is moved there, and a reboot, which
/// empties it along with the mounts, leaves the volumes unpublished and deletable.
#[tokio::test]
async fn publications_live_in_the_run_directory_and_a_reboot_forgets_them() {
    let mut driver = TestDriver::start().await;
    let (volume, target) = driver.published_fs_volume().await;
    let in_run = driver
        .run
        .join(format!("{}.publications.json", volume.volume_id));
    let beside_record = driver
        .data
        .join("state")
        .join(format!("{}.publications.json", volume.volume_id));
    assert!(in_run.exists() && !beside_record.exists());

    // An earlier version's place: moved to the run directory at start, still published.
    driver.stop().await;
    fs::rename(&in_run, &beside_record).unwrap();
    driver.start_again().await;
    assert!(in_run.exists() && !beside_record.exists());
    assert_eq!(recorded_publications(&driver, &volume.volume_id), 1);
    expect_code(
        driver.delete(&volume.volume_id).await,
        tonic::Code::FailedPrecondition,
    );

    // A reboot: the mounts and the run directory's content are gone.
    driver.stop().await;
    nix::mount::umount(&target).unwrap();
    fs::remove_dir_all(&driver.run).unwrap();
    driver.start_again().await;
    assert_eq!(recorded_publications(&driver, &volume.volume_id), 0);
    driver.delete(&volume.volume_id).await.unwrap();
}

/// A storm's hammer (a task calling the driver until something other than OK or ABORTED
/// comes back) stopped because the driver was killed: only a lost connection may end it.
async fn assert_ended_by_the_kill(hammer: tokio::task::JoinHandle<tonic::Status>) {
    let ended = tokio::time::timeout(Duration::from_secs(10), hammer)
        .await
        .expect("the hammer stops once the driver is gone")
        .unwrap();
    assert!(
        matches!(
            ended.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled
        ),
        "{ended:?}"
    );
}
