//! The admin commands through the real binary, as an admin on the node runs them:
//! `stickyvol volumes`, `stickyvol volume show|delete|export|import`, against a driver made by
//! the harness (volumes created and published through CSI, as the provisioner and kubelet do).
//!
//! Moves are tested between two drivers with their own data dirs ("two nodes"): export on one,
//! import on the other, and the data compared on the host with everything a copy must keep.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::fidelity::*;
use common::*;
use serde_json::Value;
use stickyvol::host::archive;

const OTHER_NODE: &str = "other-node";

/// `stickyvol <args>` aimed at `driver`'s admin socket, with nothing of the caller's
/// environment that the commands read.
fn stickyvol(driver: &TestDriver, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stickyvol"));
    cmd.args(args)
        .env("ADMIN_SOCKET", &driver.admin_socket)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    cmd
}

fn run(driver: &TestDriver, args: &[&str]) -> Output {
    stickyvol(driver, args)
        .output()
        .unwrap_or_else(|e| panic!("running stickyvol {args:?}: {e}"))
}

/// Runs a command that must succeed; its stdout.
#[track_caller]
fn run_ok(driver: &TestDriver, args: &[&str]) -> String {
    let out = run(driver, args);
    assert!(
        out.status.success(),
        "stickyvol {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Runs a command that must fail with exit code 1; its stderr.
#[track_caller]
fn run_failing(driver: &TestDriver, args: &[&str]) -> String {
    let out = run(driver, args);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stickyvol {args:?} should fail; stdout: {}; stderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `stickyvol volume export ID > file`.
#[track_caller]
fn export_to(driver: &TestDriver, volume_id: &str, file: &Path) -> Output {
    stickyvol(driver, &["volume", "export", volume_id])
        .stdout(File::create(file).unwrap())
        .output()
        .unwrap()
}

#[track_caller]
fn export_ok(driver: &TestDriver, volume_id: &str, file: &Path) {
    let out = export_to(driver, volume_id, file);
    assert!(
        out.status.success(),
        "export of {volume_id} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `stickyvol volume import ID [extra] < file`.
fn import_from(driver: &TestDriver, volume_id: &str, file: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["volume", "import", volume_id];
    args.extend_from_slice(extra);
    stickyvol(driver, &args)
        .stdin(File::open(file).unwrap())
        .output()
        .unwrap()
}

#[track_caller]
fn import_ok(driver: &TestDriver, volume_id: &str, file: &Path) -> String {
    let out = import_from(driver, volume_id, file, &[]);
    assert!(
        out.status.success(),
        "import into {volume_id} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[track_caller]
fn import_failing(driver: &TestDriver, volume_id: &str, file: &Path, extra: &[&str]) -> String {
    let out = import_from(driver, volume_id, file, extra);
    assert_eq!(
        out.status.code(),
        Some(1),
        "import into {volume_id} should fail: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The entry of `volume_id` in `volumes --json [extra]`.
fn listed_with(driver: &TestDriver, volume_id: &str, extra: &[&str]) -> Value {
    let mut args = vec!["volumes", "--json"];
    args.extend_from_slice(extra);
    let all = json_of(&run_ok(driver, &args));
    all.as_array()
        .expect("a JSON array")
        .iter()
        .find(|v| v["volume_id"] == volume_id)
        .unwrap_or_else(|| panic!("{volume_id} not in {all}"))
        .clone()
}

fn listed(driver: &TestDriver, volume_id: &str) -> Value {
    listed_with(driver, volume_id, &[])
}

/// CreateVolume as csi-provisioner with `--extra-create-metadata` sends it.
fn provisioned(
    pvc_namespace: &str,
    pvc: &str,
    capability: csi::VolumeCapability,
    bytes: i64,
) -> csi::CreateVolumeRequest {
    let pv = format!("pvc-{}", uuid::Uuid::now_v7());
    csi::CreateVolumeRequest {
        parameters: params(&[
            ("csi.storage.k8s.io/pv/name", &pv),
            ("csi.storage.k8s.io/pvc/name", pvc),
            ("csi.storage.k8s.io/pvc/namespace", pvc_namespace),
        ]),
        ..create_request(&pv, capability, bytes)
    }
}

fn fs_cap() -> csi::VolumeCapability {
    mount_cap(Mode::SingleNodeWriter)
}

fn block_capability() -> csi::VolumeCapability {
    block_cap(Mode::SingleNodeWriter)
}

/// A second "node": a driver with its own data dir and node id.
async fn other_node() -> TestDriver {
    TestDriver::start_with(Options {
        node_id: Some(OTHER_NODE),
        ..Options::default()
    })
    .await
}

/// A file for a stream, beneath the test's directory (removed with it).
fn stream_file(driver: &TestDriver, name: &str) -> PathBuf {
    driver.root.join(name)
}

fn entries_of(dir: &Path) -> Vec<String> {
    dir_names(dir)
}

// =============================================================================================
// Listing and showing

#[tokio::test]
async fn volumes_lists_what_the_provisioner_made_in_table_and_json() {
    let driver = TestDriver::start().await;
    let fs_volume = driver
        .create(provisioned("shop", "data-db-0", fs_cap(), 32 * MIB))
        .await;
    let block_volume = driver
        .create(provisioned(
            "shop",
            "wal-db-0",
            block_capability(),
            16 * MIB,
        ))
        .await;
    let target = driver.publish_at_new_target(&fs_volume, fs_cap()).await;
    write_synced(&target.join("two-mib"), &pattern(2 * MIB as usize, 1));
    let snapshot = driver
        .create_snapshot_ready(&snapshot_request(
            &new_snapshot_name(),
            &fs_volume.volume_id,
        ))
        .await;

    let fs_entry = listed(&driver, &fs_volume.volume_id);
    assert_eq!(fs_entry["pvc_namespace"], "shop");
    assert_eq!(fs_entry["pvc_name"], "data-db-0");
    assert!(fs_entry["pv_name"].as_str().unwrap().starts_with("pvc-"));
    assert_eq!(fs_entry["pool"], "default");
    assert_eq!(fs_entry["access_type"], "filesystem");
    assert_eq!(fs_entry["capacity_bytes"], 32 * MIB);
    assert_eq!(fs_entry["enforcement"], "none");
    // A plain directory's usage needs a walk: unknown unless asked for, said as null.
    assert_eq!(fs_entry["used_bytes"], Value::Null);
    let measured = listed_with(&driver, &fs_volume.volume_id, &["--measure"]);
    let used = measured["used_bytes"].as_i64().expect("measured usage");
    assert!((2 * MIB..3 * MIB).contains(&used), "used {used}");
    assert_eq!(fs_entry["abnormal"], false);
    assert_eq!(
        fs_entry["host_path"],
        host_path(&fs_volume).display().to_string()
    );
    let publications = fs_entry["publications"].as_array().unwrap();
    assert_eq!(publications.len(), 1);
    assert_eq!(publications[0]["target_path"], path_str(&target));
    let pod_uid = target
        .strip_prefix(driver.kubelet.join("pods"))
        .unwrap()
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(publications[0]["pod_uid"], pod_uid);
    let snapshots = fs_entry["snapshots"].as_array().unwrap();
    assert_eq!(snapshots.len(), 1);
    assert_eq!(snapshots[0]["snapshot_id"], snapshot.snapshot_id);

    let block_entry = listed(&driver, &block_volume.volume_id);
    assert_eq!(block_entry["access_type"], "block");
    assert_eq!(block_entry["enforcement"], "file");
    assert!(block_entry["used_bytes"].is_u64(), "{block_entry}");

    let table = run_ok(&driver, &["volumes"]);
    let row = |id: &str| {
        table
            .lines()
            .find(|line| line.contains(id))
            .unwrap_or_else(|| panic!("no row for {id} in:\n{table}"))
            .to_string()
    };
    assert!(
        row(&fs_volume.volume_id).contains("shop/data-db-0"),
        "{table}"
    );
    assert!(
        row(&block_volume.volume_id).contains("shop/wal-db-0"),
        "{table}"
    );
    assert!(
        row(&fs_volume.volume_id).contains(&host_path(&fs_volume).display().to_string()),
        "{table}"
    );
    assert_eq!(table.lines().count(), 3, "a header and two rows:\n{table}");

    // `show` measures, and gives the same object as the measured list.
    let shown = json_of(&run_ok(
        &driver,
        &["volume", "show", &fs_volume.volume_id, "--json"],
    ));
    assert_eq!(shown, measured);
    let text = run_ok(&driver, &["volume", "show", &fs_volume.volume_id]);
    for expected in [
        fs_volume.volume_id.as_str(),
        "shop/data-db-0",
        &snapshot.snapshot_id,
        &pod_uid,
    ] {
        assert!(text.contains(expected), "{expected} missing from:\n{text}");
    }
}

#[tokio::test]
async fn volumes_filters_by_pool_and_refuses_unknown_pools_and_ids() {
    let mut driver = TestDriver::prepare(Options::default());
    let second = driver.root.join("second-pool");
    driver.add_args(["--pool".to_string(), format!("second={}", second.display())]);
    driver.start_again().await;
    let in_default = driver.create_fs_volume().await;
    let in_second = driver
        .create(csi::CreateVolumeRequest {
            parameters: params(&[("pool", "second")]),
            ..create_request(&new_name(), fs_cap(), SIZE)
        })
        .await;
    let only_second = json_of(&run_ok(&driver, &["volumes", "--json", "--pool", "second"]));
    let ids: Vec<&str> = only_second
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["volume_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [in_second.volume_id.as_str()]);
    assert!(!ids.contains(&in_default.volume_id.as_str()));

    let err = run_failing(&driver, &["volumes", "--pool", "nope"]);
    assert!(err.contains("nope"), "{err}");
    let err = run_failing(&driver, &["volume", "show", "sv-not-ours"]);
    assert!(err.contains("does not exist"), "{err}");
}

#[tokio::test]
async fn commands_say_what_to_do_when_no_driver_answers() {
    let driver = TestDriver::prepare(Options::default());
    let err = run_failing(&driver, &["volumes"]);
    assert!(
        err.contains(&driver.admin_socket.display().to_string()) && err.contains("running"),
        "{err}"
    );
}

#[tokio::test]
async fn commands_aimed_at_the_csi_socket_are_told_where_the_admin_api_is() {
    let driver = TestDriver::start().await;
    let out = stickyvol(&driver, &["volumes"])
        .env("ADMIN_SOCKET", &driver.socket)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("does not serve the admin API (is it the driver's CSI socket?")
            && err.contains("--admin-socket"),
        "{err}"
    );
}

#[tokio::test]
async fn controller_mode_does_not_serve_the_admin_api() {
    let driver = TestDriver::start_with(Options {
        mode: Some("controller"),
        ..Options::default()
    })
    .await;
    assert!(!driver.admin_socket.exists());
    let out = stickyvol(&driver, &["volumes"])
        .env("ADMIN_SOCKET", &driver.socket)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("does not serve the admin API"), "{err}");
}

// =============================================================================================
// Deleting

#[tokio::test]
async fn delete_refuses_a_published_volume_and_removes_an_unpublished_one() {
    let mut driver = TestDriver::start().await;
    let (volume, target) = driver.published_fs_volume().await;
    fs::write(target.join("file"), b"kept while published").unwrap();

    let err = run_failing(&driver, &["volume", "delete", &volume.volume_id]);
    assert!(err.contains("published"), "{err}");
    assert!(host_path(&volume).join("file").exists());

    driver.unpublish_ok(&volume, &target).await;
    let out = run_ok(&driver, &["volume", "delete", &volume.volume_id]);
    assert!(out.contains(&volume.volume_id), "{out}");
    assert!(!host_path(&volume).exists());
    assert!(driver.list_all().await.is_empty());
    let records = driver.state_entries().await;
    assert!(records.is_empty(), "{records:?}");

    let err = run_failing(&driver, &["volume", "delete", &volume.volume_id]);
    assert!(err.contains("does not exist"), "{err}");
}

// =============================================================================================
// Export and import

/// The move the docs describe, between two nodes: every property of the tree survives, and
/// the moved volume publishes and reads on its new node.
#[tokio::test]
async fn filesystem_volume_moves_between_nodes_with_everything_kept() {
    let node_a = TestDriver::start().await;
    let node_b = other_node().await;
    let source = node_a
        .create(create_request(&new_name(), fs_cap(), 64 * MIB))
        .await;
    build_tree(&host_path(&source));
    let original = manifest(&host_path(&source));
    let target = node_b
        .create(create_request(&new_name(), fs_cap(), 64 * MIB))
        .await;

    let stream = stream_file(&node_a, "move.svx");
    export_ok(&node_a, &source.volume_id, &stream);
    let said = import_ok(&node_b, &target.volume_id, &stream);
    assert!(said.contains("sha256"), "{said}");

    assert_same_tree(&original, &host_path(&target));
    // The source is untouched by its export.
    assert_same_tree(&original, &host_path(&source));
    let mounted = node_b.publish_at_new_target(&target, fs_cap()).await;
    assert_eq!(
        fs::read(mounted.join("dir/nested/deeper/file.txt")).unwrap(),
        b"nested content"
    );
}

#[tokio::test]
async fn block_volume_moves_with_its_holes() {
    let node_a = TestDriver::start().await;
    let node_b = other_node().await;
    let source = node_a
        .create(thin(create_request(
            &new_name(),
            block_capability(),
            32 * MIB,
        )))
        .await;
    let image = host_path(&source);
    let file = OpenOptions::new().write(true).open(&image).unwrap();
    let offsets = [0u64, 5 << 20, (32 << 20) - 4096];
    for (i, offset) in offsets.iter().enumerate() {
        file.write_all_at(&pattern(4096, i as u8 + 7), *offset)
            .unwrap();
    }
    file.sync_all().unwrap();
    let target = node_b
        .create(thin(create_request(
            &new_name(),
            block_capability(),
            32 * MIB,
        )))
        .await;

    let stream = stream_file(&node_a, "block.svx");
    export_ok(&node_a, &source.volume_id, &stream);
    assert!(
        fs::metadata(&stream).unwrap().len() < 1 << 20,
        "holes are not in the stream"
    );
    import_ok(&node_b, &target.volume_id, &stream);

    let copy = host_path(&target);
    assert_eq!(fs::metadata(&copy).unwrap().len(), 32 << 20);
    for (i, offset) in offsets.iter().enumerate() {
        assert_eq!(read_at(&copy, *offset, 4096), pattern(4096, i as u8 + 7));
    }
    assert_eq!(read_at(&copy, 1 << 20, 4096), vec![0; 4096]);
    assert!(
        allocated(&copy) <= 1 << 20,
        "the copy lost its holes: {} bytes allocated",
        allocated(&copy)
    );
    // And it works as a device on its new node.
    let device = node_b
        .publish_at_new_target(&target, block_capability())
        .await;
    assert_eq!(read_at(&device, 5 << 20, 4096), pattern(4096, 8));
}

/// An ext4 image volume (a class with `csi.storage.k8s.io/fstype`): its image travels, and the
/// file written through its filesystem is there on the other node. Its filesystem counts as
/// content, so importing into a fresh image volume takes `--replace`.
#[tokio::test]
async fn an_image_volume_moves_with_its_filesystem() {
    let node_a = TestDriver::start().await;
    let node_b = other_node().await;
    let mut ext4 = mount_cap(Mode::SingleNodeWriter);
    if let Some(csi::volume_capability::AccessType::Mount(m)) = &mut ext4.access_type {
        m.fs_type = "ext4".into();
    }
    let source = node_a
        .create(create_request(&new_name(), ext4.clone(), 32 * MIB))
        .await;
    let (staging, published) = stage_and_publish(&node_a, &source, &ext4).await;
    fs::write(published.join("travels"), b"with its filesystem").unwrap();
    unpublish_and_unstage(&node_a, &source, &staging, &published).await;
    let target = node_b
        .create(create_request(&new_name(), ext4.clone(), 32 * MIB))
        .await;

    let stream = stream_file(&node_a, "image.svx");
    export_ok(&node_a, &source.volume_id, &stream);
    let refused = import_failing(&node_b, &target.volume_id, &stream, &[]);
    assert!(refused.contains("--replace"), "{refused}");
    let out = import_from(&node_b, &target.volume_id, &stream, &["--replace"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let (staging, published) = stage_and_publish(&node_b, &target, &ext4).await;
    assert_eq!(
        fs::read(published.join("travels")).unwrap(),
        b"with its filesystem"
    );
    unpublish_and_unstage(&node_b, &target, &staging, &published).await;
}

/// The node's kernel mounts an image volume's filesystem: an image volume takes only an export
/// of an image volume of its own filesystem, never a block volume's raw bytes (a tenant wrote
/// them, and could have crafted a filesystem that attacks the kernel's parser), nor an older
/// stream that does not say what it holds; a block volume takes no image volume's filesystem.
#[tokio::test]
async fn an_image_volume_takes_only_an_export_of_its_own_filesystem() {
    let node_a = TestDriver::start().await;
    let node_b = other_node().await;
    let mut ext4 = mount_cap(Mode::SingleNodeWriter);
    if let Some(csi::volume_capability::AccessType::Mount(m)) = &mut ext4.access_type {
        m.fs_type = "ext4".into();
    }
    let block = block_of(&node_a).await;
    let block_stream = stream_file(&node_a, "block.svx");
    export_ok(&node_a, &block.volume_id, &block_stream);
    let image = node_a
        .create(create_request(&new_name(), ext4.clone(), 32 * MIB))
        .await;
    let image_stream = stream_file(&node_a, "image.svx");
    export_ok(&node_a, &image.volume_id, &image_stream);
    // The same image, as a release before streams said what their image holds wrote it.
    let older = stream_file(&node_a, "older.svx");
    let mut header =
        archive::image_header(&host_path(&image), "sv-older", archive::ImageOf::Raw).unwrap();
    header.image = None;
    archive::export(
        &host_path(&image),
        &header,
        &mut File::create(&older).unwrap(),
    )
    .unwrap();

    let ext4_target = node_b
        .create(create_request(&new_name(), ext4.clone(), 32 * MIB))
        .await;
    let refused = import_failing(
        &node_b,
        &ext4_target.volume_id,
        &block_stream,
        &["--replace"],
    );
    assert!(refused.contains("a block volume's raw bytes"), "{refused}");
    let refused = import_failing(&node_b, &ext4_target.volume_id, &older, &["--replace"]);
    assert!(refused.contains("older release"), "{refused}");
    let block_target = block_of(&node_b).await;
    let refused = import_failing(
        &node_b,
        &block_target.volume_id,
        &image_stream,
        &["--replace"],
    );
    assert!(refused.contains("ext4 filesystem"), "{refused}");

    // What fits is taken: the image into its kind, raw bytes (new or older) into a block volume.
    for (target, stream) in [
        (&ext4_target, &image_stream),
        (&block_target, &block_stream),
        (&block_target, &older),
    ] {
        let out = import_from(&node_b, &target.volume_id, stream, &["--replace"]);
        assert!(
            out.status.success(),
            "{}: {}",
            stream.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A thin block volume of 32 MiB on `driver`.
async fn block_of(driver: &TestDriver) -> csi::Volume {
    let cap = block_cap(Mode::SingleNodeWriter);
    driver
        .create(thin(create_request(&new_name(), cap, 32 * MIB)))
        .await
}

/// NodeStageVolume at a fresh staging path, then NodePublishVolume at a fresh target.
async fn stage_and_publish(
    driver: &TestDriver,
    volume: &csi::Volume,
    cap: &csi::VolumeCapability,
) -> (PathBuf, PathBuf) {
    let staging = driver.staging_path();
    driver.stage(volume, &staging, cap.clone()).await.unwrap();
    let target = driver.mount_target();
    driver.publish_ok(volume, &target, cap.clone()).await;
    (staging, target)
}

async fn unpublish_and_unstage(
    driver: &TestDriver,
    volume: &csi::Volume,
    staging: &Path,
    target: &Path,
) {
    driver.unpublish_ok(volume, target).await;
    driver.unstage(&volume.volume_id, staging).await.unwrap();
}

/// A fresh volume holding one file of `bytes` on `driver`, exported to a stream file; the
/// volume and the stream.
async fn exported_volume(driver: &TestDriver, bytes: usize) -> (csi::Volume, PathBuf) {
    let volume = driver
        .create(create_request(&new_name(), fs_cap(), 64 * MIB))
        .await;
    write_synced(&host_path(&volume).join("payload"), &pattern(bytes, 3));
    let stream = stream_file(driver, &format!("{}.svx", volume.volume_id));
    export_ok(driver, &volume.volume_id, &stream);
    (volume, stream)
}

#[tokio::test]
async fn damaged_streams_fail_clearly_and_leave_the_volume_empty() {
    let node_a = TestDriver::start().await;
    let node_b = other_node().await;
    let (_, stream) = exported_volume(&node_a, 3 * MIB as usize).await;
    let bytes = fs::read(&stream).unwrap();
    let target = node_b.create_fs_volume().await;

    let truncated = stream_file(&node_a, "truncated.svx");
    fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let err = import_failing(&node_b, &target.volume_id, &truncated, &[]);
    assert!(err.contains("truncated"), "{err}");
    assert!(err.contains("left empty"), "{err}");
    assert!(entries_of(&host_path(&target)).is_empty());

    let corrupt = stream_file(&node_a, "corrupt.svx");
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x40;
    fs::write(&corrupt, &flipped).unwrap();
    let err = import_failing(&node_b, &target.volume_id, &corrupt, &[]);
    assert!(err.contains("checksum"), "{err}");
    assert!(entries_of(&host_path(&target)).is_empty());

    let garbage = stream_file(&node_a, "garbage.svx");
    fs::write(&garbage, b"this is not an export at all").unwrap();
    let err = import_failing(&node_b, &target.volume_id, &garbage, &[]);
    assert!(err.contains("not a stickyvol export"), "{err}");

    // The intact stream still imports after all that.
    import_ok(&node_b, &target.volume_id, &stream);
    assert_eq!(
        fs::read(host_path(&target).join("payload")).unwrap(),
        pattern(3 * MIB as usize, 3)
    );
}

#[tokio::test]
async fn a_stream_bigger_than_the_volume_is_refused() {
    let node_a = TestDriver::start().await;
    let node_b = other_node().await;
    let (_, stream) = exported_volume(&node_a, 24 * MIB as usize).await;
    let small = node_b.create_fs_volume().await; // 16 MiB
    let err = import_failing(&node_b, &small.volume_id, &stream, &[]);
    assert!(err.contains("needs"), "{err}");
    assert!(entries_of(&host_path(&small)).is_empty());

    let block = node_b.create_block_volume().await;
    let err = import_failing(&node_b, &block.volume_id, &stream, &[]);
    assert!(
        err.contains("block"),
        "a filesystem stream into a block volume: {err}"
    );
}

#[tokio::test]
async fn import_refuses_published_and_non_empty_volumes_unless_replacing() {
    let node_a = TestDriver::start().await;
    let node_b = other_node().await;
    let (_, stream) = exported_volume(&node_a, MIB as usize).await;
    let (busy, target) = node_b.published_fs_volume().await;
    let err = import_failing(&node_b, &busy.volume_id, &stream, &[]);
    assert!(err.contains("published"), "{err}");
    node_b.unpublish_ok(&busy, &target).await;

    fs::write(host_path(&busy).join("old"), b"old content").unwrap();
    let err = import_failing(&node_b, &busy.volume_id, &stream, &[]);
    assert!(err.contains("--replace"), "{err}");
    assert!(
        host_path(&busy).join("old").exists(),
        "refused means untouched"
    );

    let out = import_from(&node_b, &busy.volume_id, &stream, &["--replace"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(entries_of(&host_path(&busy)), ["payload"]);
}

#[tokio::test]
async fn a_published_volume_on_a_copying_pool_is_not_exported() {
    let driver = TestDriver::start().await;
    let (volume, target) = driver.published_fs_volume().await;
    fs::write(target.join("f"), b"x").unwrap();
    let out = export_to(&driver, &volume.volume_id, &stream_file(&driver, "x.svx"));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("published") && err.contains("snapshot"),
        "{err}"
    );
}

/// On btrfs a published volume is exported from a snapshot, which is gone afterwards.
#[tokio::test]
async fn a_published_btrfs_volume_exports_from_a_temporary_snapshot() {
    let setup = start_on_btrfs().await;
    let driver = &setup.driver;
    let volume = driver
        .create(csi::CreateVolumeRequest {
            parameters: params(&[("pool", "fast")]),
            ..create_request(&new_name(), fs_cap(), 64 * MIB)
        })
        .await;
    let target = driver.publish_at_new_target(&volume, fs_cap()).await;
    write_synced(&target.join("live"), &pattern(2 * MIB as usize, 9));
    let stream = stream_file(driver, "live.svx");
    let out = export_to(driver, &volume.volume_id, &stream);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("snapshot"),
        "says how it read: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        dir_names(&setup.pool.join("snapshots")).is_empty(),
        "the temporary snapshot is removed"
    );

    let node_b = other_node().await;
    let copy = node_b
        .create(create_request(&new_name(), fs_cap(), 64 * MIB))
        .await;
    import_ok(&node_b, &copy.volume_id, &stream);
    assert_eq!(
        fs::read(host_path(&copy).join("live")).unwrap(),
        pattern(2 * MIB as usize, 9)
    );
}

/// Kills `node_b` in the middle of an import of a volume exported from `node_a` (half the
/// stream written and on disk); the volume imported into and the whole stream.
async fn import_cut_by_a_crash(
    node_a: &TestDriver,
    node_b: &mut TestDriver,
) -> (csi::Volume, PathBuf) {
    let (_, stream) = exported_volume(node_a, 8 * MIB as usize).await;
    let bytes = fs::read(&stream).unwrap();
    let target = node_b
        .create(create_request(&new_name(), fs_cap(), 64 * MIB))
        .await;

    // Half the stream, then the pipe stays open: the import waits for more. Its stderr goes
    // to a file (a pipe nobody reads could fill and stall it).
    let stderr_path = stream.with_extension("import-stderr");
    let mut import = stickyvol(node_b, &["volume", "import", &target.volume_id])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let mut pipe = import.stdin.take().unwrap();
    pipe.write_all(&bytes[..bytes.len() / 2]).unwrap();
    pipe.flush().unwrap();
    // The import marks the record (one journal commit) before it writes any data.
    wait_for(|| host_path(&target).join("payload").exists()).await;

    node_b.kill9();
    drop(pipe);
    // The import never finished: its command must say so, not exit 0 as if it had.
    let status = import.wait().unwrap();
    let stderr = fs::read_to_string(&stderr_path).unwrap();
    assert_eq!(
        status.code(),
        Some(1),
        "an import whose driver died must fail: {stderr}"
    );
    assert!(
        stderr.contains("stickyvol volume import: lost the connection to the driver"),
        "says why: {stderr}"
    );
    assert!(!stderr.contains("imported "), "claims success: {stderr}");
    (target, stream)
}

/// A driver killed in the middle of an import empties the volume once it serves again.
#[tokio::test]
async fn an_import_cut_by_a_crash_is_emptied_at_the_next_start() {
    let node_a = TestDriver::start().await;
    let mut node_b = other_node().await;
    let (target, stream) = import_cut_by_a_crash(&node_a, &mut node_b).await;
    node_b.start_again().await;
    // Emptied in the background once the driver serves.
    wait_for(|| {
        node_b
            .log_text()
            .contains("import into this volume was interrupted")
    })
    .await;
    assert!(entries_of(&host_path(&target)).is_empty());
    // A clean stop writes the records back: the mark is gone.
    node_b.restart().await;
    let record = node_b
        .data
        .join("state")
        .join(format!("{}.json", target.volume_id));
    assert!(!fs::read_to_string(&record).unwrap().contains("importing"));
    import_ok(&node_b, &target.volume_id, &stream);
}

/// An interrupted import whose partial content cannot be removed (here a mount point inside
/// it, which removal never crosses) no longer stops the driver from starting: it serves, says
/// why in its log, and refuses to publish the half-written volume (ABORTED) until a later start
/// empties it.
#[tokio::test]
async fn an_interrupted_import_that_cannot_be_emptied_leaves_the_driver_serving() {
    let node_a = TestDriver::start().await;
    let mut node_b = other_node().await;
    let (target, stream) = import_cut_by_a_crash(&node_a, &mut node_b).await;
    let planted = host_path(&target).join("mounted");
    fs::create_dir(&planted).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &planted,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
    .unwrap();

    node_b.start_again().await;
    wait_for(|| {
        node_b
            .log_text()
            .contains("cannot remove the partial content of an interrupted import")
    })
    .await;
    let mount_target = node_b.mount_target();
    let err = node_b
        .publish(&target, &mount_target, fs_cap(), false)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted, "{err:?}");
    assert!(err.message().contains("interrupted import"), "{err:?}");

    nix::mount::umount(&planted).unwrap();
    node_b.restart().await;
    wait_for(|| {
        node_b
            .log_text()
            .contains("import into this volume was interrupted")
    })
    .await;
    assert!(entries_of(&host_path(&target)).is_empty());
    import_ok(&node_b, &target.volume_id, &stream);
}

/// `stickyvol_copies_in_flight{kind}` counts an export and an import while their streams run:
/// each is held midway, the export by a pipe nobody reads yet, the import by a pipe that gets
/// half the stream and stays open; once let go, neither counts.
#[tokio::test]
async fn copies_in_flight_count_exports_and_imports_while_their_streams_run() {
    let driver = TestDriver::start_with_metrics(Options::default()).await;
    let running = |kind| {
        driver
            .scrape()
            .value("stickyvol_copies_in_flight", &[("kind", kind)])
    };
    // 8 MiB: far more than the pipe and the socket hold, so the export stalls unread.
    let (volume, stream) = exported_volume(&driver, 8 * MIB as usize).await;
    let mut export = stickyvol(&driver, &["volume", "export", &volume.volume_id])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(|| running("export") == 1.0).await;
    let mut exported = Vec::new();
    std::io::Read::read_to_end(&mut export.stdout.take().unwrap(), &mut exported).unwrap();
    assert!(export.wait().unwrap().success());
    // The whole stream (each export's header has its own time, so the bytes differ).
    assert!(
        exported.len() > 8 * MIB as usize,
        "{} bytes",
        exported.len()
    );
    wait_for(|| running("export") == 0.0).await;

    let target = driver
        .create(create_request(&new_name(), fs_cap(), 64 * MIB))
        .await;
    let bytes = fs::read(&stream).unwrap();
    let mut import = stickyvol(&driver, &["volume", "import", &target.volume_id])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut pipe = import.stdin.take().unwrap();
    pipe.write_all(&bytes[..bytes.len() / 2]).unwrap();
    pipe.flush().unwrap();
    wait_for(|| running("import") == 1.0).await;
    pipe.write_all(&bytes[bytes.len() / 2..]).unwrap();
    drop(pipe);
    assert!(import.wait().unwrap().success());
    // The driver answers an import once it is done: nothing left to wait for.
    assert_eq!(running("import"), 0.0);
    assert_eq!(running("export"), 0.0);
}

/// Polls `done` for up to 30 s.
async fn wait_for(mut done: impl FnMut() -> bool) {
    for _ in 0..300 {
        if done() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("condition not reached in 30 s");
}

/// `stickyvol volume import --replace` (an image volume holds its empty filesystem), which must
/// succeed.
#[track_caller]
fn import_replacing(driver: &TestDriver, volume_id: &str, file: &Path) {
    let out = import_from(driver, volume_id, file, &["--replace"]);
    assert!(
        out.status.success(),
        "import into {volume_id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The mount capability of an image volume of filesystem `fs`.
fn image_cap(fs: &str) -> csi::VolumeCapability {
    let mut cap = mount_cap(Mode::SingleNodeWriter);
    if let Some(csi::volume_capability::AccessType::Mount(m)) = &mut cap.access_type {
        m.fs_type = fs.into();
    }
    cap
}

/// NodeStageVolume of image volume `volume` at `staging` (writing `write` into it, if given),
/// then NodeUnstageVolume if it staged.
async fn stage_and_unstage(
    driver: &TestDriver,
    volume: &csi::Volume,
    cap: &csi::VolumeCapability,
    staging: &Path,
    write: Option<&str>,
) -> Result<(), tonic::Status> {
    driver.stage(volume, staging, cap.clone()).await?;
    if let Some(text) = write {
        fs::write(staging.join("written"), text).unwrap();
    }
    driver.unstage(&volume.volume_id, staging).await
}

/// The kernel never mounts an imported filesystem unchecked: after an import, an image volume's
/// first NodeStageVolume runs the filesystem's own checker on the image; a sound one (ext4, and
/// an XFS exported with data) stages, one whose metadata is garbage is refused before any mount.
#[tokio::test]
async fn an_imported_image_is_checked_by_its_filesystems_checker_before_its_first_stage() {
    let driver = TestDriver::start().await;
    for (fs_name, size) in [("ext4", 32 * MIB), ("xfs", 300 * MIB)] {
        let cap = image_cap(fs_name);
        let source = driver
            .create(create_request(&new_name(), cap.clone(), size))
            .await;
        stage_and_unstage(
            &driver,
            &source,
            &cap,
            &driver.staging_path(),
            Some(fs_name),
        )
        .await
        .unwrap();
        let stream = stream_file(&driver, &format!("{fs_name}.svx"));
        export_ok(&driver, &source.volume_id, &stream);
        let target = driver
            .create(create_request(&new_name(), cap.clone(), size))
            .await;
        import_replacing(&driver, &target.volume_id, &stream);
        let staging = driver.staging_path();
        stage_and_unstage(&driver, &target, &cap, &staging, None)
            .await
            .unwrap_or_else(|s| panic!("{fs_name}: a sound import was refused: {s:?}"));
        assert!(
            driver
                .log_text()
                .contains("the imported filesystem passed its check"),
            "{fs_name}: no check logged"
        );
    }

    // An ext4 image whose bitmaps and inode tables are garbage, in a stream that says ext4.
    let cap = image_cap("ext4");
    let sound = driver
        .create(create_request(&new_name(), cap.clone(), 32 * MIB))
        .await;
    let damaged = driver.root.join("damaged.img");
    fs::copy(host_path(&sound), &damaged).unwrap();
    let file = OpenOptions::new().write(true).open(&damaged).unwrap();
    file.write_all_at(&vec![0xab; 960 << 10], 64 << 10).unwrap();
    drop(file);
    let stream = stream_file(&driver, "damaged.svx");
    let header = archive::image_header(
        &damaged,
        "sv-damaged",
        archive::ImageOf::Filesystem(stickyvol::host::fsimage::FsType::Ext4),
    )
    .unwrap();
    archive::export(&damaged, &header, &mut File::create(&stream).unwrap()).unwrap();
    let target = driver
        .create(create_request(&new_name(), cap.clone(), 32 * MIB))
        .await;
    import_replacing(&driver, &target.volume_id, &stream);
    let staging = driver.staging_path();
    let refused = stage_and_unstage(&driver, &target, &cap, &staging, None)
        .await
        .expect_err("a damaged image was staged");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("fails its check") && refused.message().contains("e2fsck"),
        "{}",
        refused.message()
    );
    assert!(
        mounts_at(&staging).is_empty(),
        "something was mounted at {}",
        staging.display()
    );
    // Still refused at the next attempt: the check is not forgotten.
    let again = stage_and_unstage(&driver, &target, &cap, &staging, None).await;
    assert_eq!(
        again.map_err(|s| s.code()),
        Err(tonic::Code::FailedPrecondition)
    );
}
