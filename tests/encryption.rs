//! Encrypted image volumes (StorageClass `encryption: luks2`): LUKS2 through dm-crypt between
//! the volume's loop device and its filesystem, the key from NodeStageVolume's secrets (the
//! class's node-stage Secret), as csi-provisioner and kubelet send them. The pool is a real XFS
//! (with reflinks) on a loop device, so a test can read every byte the pool's disk holds: no
//! plaintext ever, and no LUKS header once the volumes are deleted.
//!
//! Hosts without device mapper (this project's CI host) run only the refusals; the rest records
//! a skip of `dm-crypt`, and runs in the project's VM (tests/vm), where that skip fails.

mod common;

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::scratchfs::ScratchFs;
use common::*;
use tonic::Code;

const KEY: &str = "0123456789abcdef0123456789abcdef-a-test-key";
const LUKS_MAGIC: &[u8] = b"LUKS\xba\xbe";
/// The secondary header's, 16 KiB in.
const LUKS_SECOND_MAGIC: &[u8] = b"SKUL\xba\xbe";

fn ext4_cap() -> csi::VolumeCapability {
    let mut cap = mount_cap(Mode::SingleNodeWriter);
    if let Some(csi::volume_capability::AccessType::Mount(mount)) = &mut cap.access_type {
        mount.fs_type = "ext4".into();
    }
    cap
}

fn encrypted_request(bytes: i64, pool: Option<&str>) -> csi::CreateVolumeRequest {
    encrypted_request_of(ext4_cap(), bytes, pool)
}

fn encrypted_request_of(
    cap: csi::VolumeCapability,
    bytes: i64,
    pool: Option<&str>,
) -> csi::CreateVolumeRequest {
    let mut request = thin(create_request(&new_name(), cap, bytes));
    request
        .parameters
        .insert("encryption".into(), "luks2".into());
    if let Some(pool) = pool {
        request.parameters.insert("pool".into(), pool.into());
    }
    request
}

fn secrets(key: &str) -> HashMap<String, String> {
    HashMap::from([("key".to_string(), key.to_string())])
}

/// NodeStageVolume of an encrypted image as kubelet sends it for a class with a node-stage
/// Secret.
async fn stage(
    driver: &TestDriver,
    volume: &csi::Volume,
    staging: &Path,
    key: Option<&str>,
) -> Result<(), tonic::Status> {
    stage_as(driver, volume, staging, ext4_cap(), key).await
}

async fn stage_as(
    driver: &TestDriver,
    volume: &csi::Volume,
    staging: &Path,
    cap: csi::VolumeCapability,
    key: Option<&str>,
) -> Result<(), tonic::Status> {
    driver
        .node()
        .node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: volume.volume_id.clone(),
            staging_target_path: path_str(staging),
            volume_capability: Some(cap),
            volume_context: volume.volume_context.clone(),
            secrets: key.map(secrets).unwrap_or_default(),
            ..Default::default()
        })
        .await
        .map(drop)
}

async fn publish(driver: &TestDriver, volume: &csi::Volume, staging: &Path) -> PathBuf {
    let target = driver.mount_target();
    let mut request = publish_request(volume, &target, ext4_cap(), false);
    request.staging_target_path = path_str(staging);
    driver
        .node()
        .node_publish_volume(request)
        .await
        .expect("NodePublishVolume");
    target
}

fn mapping(volume: &csi::Volume) -> PathBuf {
    Path::new("/dev/mapper").join(format!("stickyvol-{}", volume.volume_id))
}

/// Whether a 4 KiB block of the file or device at `path` begins with `needle`. Every block of
/// data the tests look for starts a block: a file's data starts one (the marker file), and so
/// does a LUKS2 header (primary at 0, secondary at 16 KiB). Looking only there keeps a scan of
/// the pool's whole disk fast in a debug build under an emulated CPU.
fn holds(path: &Path, needle: &[u8]) -> bool {
    const BLOCK: usize = 4096;
    let mut file = File::open(path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let mut filled = 0;
        while filled < buffer.len() {
            match file.read(&mut buffer[filled..]).unwrap() {
                0 => break,
                n => filled += n,
            }
        }
        if buffer[..filled]
            .chunks(BLOCK)
            .any(|block| block.starts_with(needle))
        {
            return true;
        }
        if filled < buffer.len() {
            return false;
        }
    }
}

/// Whether this machine can run dm-crypt; records a skip of `dm-crypt` when it cannot.
fn dm_crypt_here() -> bool {
    let control = Path::new("/dev/mapper/control").exists();
    let tool = Command::new("cryptsetup")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !(control && tool) {
        skip::skip(
            "dm-crypt",
            "no device mapper (/dev/mapper/control) or no cryptsetup",
        );
        return false;
    }
    true
}

#[tokio::test]
async fn encryption_is_refused_for_directory_volumes_and_for_unknown_values() {
    let driver = TestDriver::start().await;
    let cases = [
        (
            mount_cap(Mode::SingleNodeWriter),
            "luks2",
            "directory volume",
        ),
        (block_cap(Mode::SingleNodeWriter), "aes", "none or luks2"),
        (ext4_cap(), "aes", "none or luks2"),
    ];
    for (cap, value, said) in cases {
        let mut request = create_request(&new_name(), cap, 64 * MIB);
        request.parameters.insert("encryption".into(), value.into());
        let err = driver
            .controller()
            .create_volume(request)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains("encryption"), "{err:?}");
        assert!(err.message().contains(said), "{err:?}");
    }
    assert!(driver.data_entries().is_empty());
}

#[tokio::test]
async fn a_node_that_cannot_encrypt_refuses_an_encrypted_class_at_create_volume() {
    // A PATH with the ext4 tools and no cryptsetup (and, on hosts like CI's, no device mapper).
    let tools = tempfile::tempdir().unwrap();
    for tool in ["mkfs.ext4", "resize2fs"] {
        let found = ["/usr/sbin", "/sbin", "/usr/bin"]
            .iter()
            .map(|dir| Path::new(dir).join(tool))
            .find(|path| path.exists())
            .unwrap_or_else(|| panic!("no {tool} on this machine"));
        std::os::unix::fs::symlink(found, tools.path().join(tool)).unwrap();
    }
    let driver = TestDriver::start_with(Options {
        path: Some(tools.path().display().to_string()),
        ..Options::default()
    })
    .await;
    refused(&driver).await;
}

async fn refused(driver: &TestDriver) {
    let err = driver
        .controller()
        .create_volume(encrypted_request(64 * MIB, None))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("to be encrypted") && err.message().contains("stickyvol doctor"),
        "{err:?}"
    );
    assert!(
        err.message().contains("cryptsetup") || err.message().contains("device mapper"),
        "{err:?}"
    );
    assert!(driver.data_entries().is_empty());
}

/// A driver whose pool "crypt" is a fresh XFS (reflinks) on a loop device. Field order: the
/// driver goes before the filesystem is unmounted.
struct CryptDriver {
    driver: TestDriver,
    fs: ScratchFs,
}

async fn start_on_xfs() -> CryptDriver {
    let fs = ScratchFs::new("xfs", 512 * MIB as u64, &["-q", "-m", "reflink=1"], "");
    let mut driver = TestDriver::prepare(Options::default());
    driver.add_args([
        "--pool".to_string(),
        format!("crypt={}", fs.mount_point.join("pool").display()),
    ]);
    driver.start_again().await;
    CryptDriver { driver, fs }
}

/// After every volume and snapshot of the pool is deleted, its whole disk holds neither the
/// plaintext a pod wrote nor a LUKS header (primary or secondary).
#[track_caller]
fn assert_disk_holds_neither(fs: &ScratchFs, marker: &str) {
    File::open(&fs.device).unwrap().sync_all().unwrap();
    assert!(
        !holds(&fs.device, marker.as_bytes()),
        "plaintext on the pool's disk"
    );
    for magic in [LUKS_MAGIC, LUKS_SECOND_MAGIC] {
        assert!(
            !holds(&fs.device, magic),
            "a LUKS header survived on the pool's disk"
        );
    }
}

fn write_marker(dir: &Path, marker: &str) {
    let mut file = File::create(dir.join("marker")).unwrap();
    for _ in 0..256 {
        file.write_all(marker.as_bytes()).unwrap();
    }
    file.sync_all().unwrap();
}

fn read_marker(dir: &Path) -> String {
    let text = fs::read_to_string(dir.join("marker")).unwrap();
    text[..text.len() / 256].to_string()
}

#[tokio::test]
async fn an_encrypted_image_holds_only_ciphertext_opens_with_its_key_alone_and_is_erased_on_delete()
{
    if !dm_crypt_here() {
        return;
    }
    let CryptDriver { mut driver, fs } = start_on_xfs().await;
    let marker = format!("PLAINTEXT-{}", new_name());
    let volume = driver
        .create(encrypted_request(64 * MIB, Some("crypt")))
        .await;
    let image = host_path(&volume);
    let staging = driver.staging_path();

    // Without its key, or with a key too short, nothing is formatted nor mounted.
    let err = stage(&driver, &volume, &staging, None).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("node-stage"), "{err:?}");
    let err = stage(&driver, &volume, &staging, Some("short"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        !err.message().contains("short\""),
        "the key is never quoted: {err:?}"
    );
    assert!(!holds(&image, LUKS_MAGIC));

    // The first stage formats; the pod's writes reach the file as ciphertext only.
    stage(&driver, &volume, &staging, Some(KEY)).await.unwrap();
    assert!(mapping(&volume).exists());
    let target = publish(&driver, &volume, &staging).await;
    write_marker(&target, &marker);
    let head = fs::read(&image).unwrap();
    assert_eq!(
        &head[..6],
        LUKS_MAGIC,
        "the file starts with its LUKS header"
    );
    assert!(!holds(&image, marker.as_bytes()), "plaintext in the file");
    assert!(!driver.log_text().contains(KEY), "the key was logged");

    // Unstaged: the mapping is closed. A wrong key opens nothing; the right one opens the data.
    driver.unpublish_ok(&volume, &target).await;
    driver.unstage(&volume.volume_id, &staging).await.unwrap();
    assert!(
        !mapping(&volume).exists(),
        "the mapping outlived the unstage"
    );
    assert!(driver.loop_devices_left().is_empty());
    let wrong = "another-key-another-key-another-key-!";
    let err = stage(&driver, &volume, &staging, Some(wrong))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(!mapping(&volume).exists());
    stage(&driver, &volume, &staging, Some(KEY)).await.unwrap();

    // A restarted driver serves the staged volume without the key.
    driver.kill9_and_restart().await;
    let target = publish(&driver, &volume, &staging).await;
    assert_eq!(read_marker(&target), marker);

    driver.unpublish_ok(&volume, &target).await;
    driver.unstage(&volume.volume_id, &staging).await.unwrap();
    driver.delete(&volume.volume_id).await.unwrap();
    assert!(!image.exists());
    assert_disk_holds_neither(&fs, &marker);
    assert!(!driver.log_text().contains(KEY), "the key was logged");
}

#[tokio::test]
async fn an_encrypted_image_is_snapshotted_restored_cloned_with_its_key_grown_and_never_exported() {
    if !dm_crypt_here() {
        return;
    }
    let CryptDriver { driver, fs } = start_on_xfs().await;
    let marker = format!("PLAINTEXT-{}", new_name());
    let volume = driver
        .create(encrypted_request(64 * MIB, Some("crypt")))
        .await;
    let staging = driver.staging_path();
    stage(&driver, &volume, &staging, Some(KEY)).await.unwrap();
    let target = publish(&driver, &volume, &staging).await;
    write_marker(&target, &marker);

    // A snapshot of the volume in use, restored: the same data, opened with the same key.
    let snapshot = driver.snapshot_of(&volume.volume_id).await;
    let mut restore = encrypted_request(64 * MIB, Some("crypt"));
    restore.volume_content_source = Some(from_snapshot(&snapshot.snapshot_id));
    let restored = driver.create(restore).await;
    assert_eq!(&fs::read(host_path(&restored)).unwrap()[..6], LUKS_MAGIC);
    let restored_staging = driver.staging_path();
    stage(&driver, &restored, &restored_staging, Some(KEY))
        .await
        .unwrap();
    let restored_target = publish(&driver, &restored, &restored_staging).await;
    assert_eq!(read_marker(&restored_target), marker);

    // A clone of the volume in use (its filesystem frozen for the reflink) likewise.
    let mut clone = encrypted_request(64 * MIB, Some("crypt"));
    clone.volume_content_source = Some(from_volume(&volume.volume_id));
    let cloned = driver.create(clone).await;
    let cloned_staging = driver.staging_path();
    stage(&driver, &cloned, &cloned_staging, Some(KEY))
        .await
        .unwrap();
    let cloned_target = publish(&driver, &cloned, &cloned_staging).await;
    assert_eq!(read_marker(&cloned_target), marker);

    // Ciphertext is no filesystem: a class without encryption cannot restore it.
    let mut plain = thin(create_request(&new_name(), ext4_cap(), 64 * MIB));
    plain.parameters.insert("pool".into(), "crypt".into());
    plain.volume_content_source = Some(from_snapshot(&snapshot.snapshot_id));
    let err = driver.controller().create_volume(plain).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("encrypted"), "{err:?}");

    // Online growth: the LUKS device, then the filesystem a writer sees.
    let before = stickyvol::host::fsstat::space(&target).unwrap().total_bytes;
    driver
        .expand(csi::NodeExpandVolumeRequest {
            volume_id: volume.volume_id.clone(),
            volume_path: path_str(&target),
            staging_target_path: path_str(&staging),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 128 * MIB,
                limit_bytes: 0,
            }),
            volume_capability: Some(ext4_cap()),
            ..Default::default()
        })
        .await
        .expect("NodeExpandVolume");
    let after = stickyvol::host::fsstat::space(&target).unwrap().total_bytes;
    assert!(after > before + 48 * MIB as u64, "{before} -> {after}");
    assert_eq!(read_marker(&target), marker);

    // No export stream of an encrypted volume, in plaintext or otherwise.
    let exported = Command::new(env!("CARGO_BIN_EXE_stickyvol"))
        .args(["volume", "export", &volume.volume_id])
        .env("ADMIN_SOCKET", &driver.admin_socket)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!exported.status.success());
    let said = String::from_utf8_lossy(&exported.stderr);
    assert!(said.contains("encrypted"), "{said}");
    assert!(!holds_bytes(&exported.stdout, marker.as_bytes()));

    for (volume, staging, target) in [
        (&volume, &staging, &target),
        (&restored, &restored_staging, &restored_target),
        (&cloned, &cloned_staging, &cloned_target),
    ] {
        driver.unpublish_ok(volume, target).await;
        driver.unstage(&volume.volume_id, staging).await.unwrap();
        driver.delete(&volume.volume_id).await.unwrap();
    }
    driver.delete_snapshot(&snapshot.snapshot_id).await.unwrap();
    assert_disk_holds_neither(&fs, &marker);
}

fn holds_bytes(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn the_scan_finds_what_starts_a_block_anywhere_in_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk");
    let mut bytes = vec![0u8; 3 << 20];
    bytes[(2 << 20) + 8192..][..LUKS_MAGIC.len()].copy_from_slice(LUKS_MAGIC);
    fs::write(&path, &bytes).unwrap();
    assert!(holds(&path, LUKS_MAGIC));
    assert!(!holds(&path, b"PLAINTEXT"));
}

/// Writes `marker` at the start of the block device behind `target` (a pod's link) and flushes.
fn write_device_marker(target: &Path, marker: &str) {
    let mut device = fs::OpenOptions::new().write(true).open(target).unwrap();
    let mut block = marker.as_bytes().to_vec();
    block.resize(4096, b'.');
    device.write_all(&block).unwrap();
    device.sync_all().unwrap();
}

fn read_device_marker(target: &Path, length: usize) -> String {
    let mut device = File::open(target).unwrap();
    let mut bytes = vec![0u8; length];
    device.read_exact(&mut bytes).unwrap();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn device_size(target: &Path) -> u64 {
    use std::io::{Seek, SeekFrom};
    File::open(target).unwrap().seek(SeekFrom::End(0)).unwrap()
}

#[tokio::test]
async fn an_encrypted_block_volume_is_staged_with_its_key_linked_into_pods_kept_across_a_restart_grown_copied_and_erased()
 {
    if !dm_crypt_here() {
        return;
    }
    let CryptDriver { mut driver, fs } = start_on_xfs().await;
    let cap = block_cap(Mode::SingleNodeWriter);
    let marker = format!("PLAINTEXT-{}", new_name());
    let volume = driver
        .create(encrypted_request_of(cap.clone(), 32 * MIB, Some("crypt")))
        .await;
    let image = host_path(&volume);
    let staging = driver.staging_path();

    // No publish before the stage that opens it; no stage without the key.
    let early = driver.block_target();
    let mut request = publish_request(&volume, &early, cap.clone(), false);
    request.staging_target_path = path_str(&staging);
    let err = driver
        .node()
        .node_publish_volume(request)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let err = stage_as(&driver, &volume, &staging, cap.clone(), None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

    stage_as(&driver, &volume, &staging, cap.clone(), Some(KEY))
        .await
        .unwrap();
    stage_as(&driver, &volume, &staging, cap.clone(), Some(KEY))
        .await
        .expect("a repeated stage is a no-op");
    let target = driver.block_target();
    let mut request = publish_request(&volume, &target, cap.clone(), false);
    request.staging_target_path = path_str(&staging);
    driver
        .node()
        .node_publish_volume(request.clone())
        .await
        .unwrap();
    assert_eq!(fs::read_link(&target).unwrap(), mapping(&volume));
    // The device is the file less its header.
    assert_eq!(device_size(&target), 31 * MIB as u64);
    write_device_marker(&target, &marker);
    assert!(!holds(&image, marker.as_bytes()), "plaintext in the file");
    // Read-only pods would need a second mapping: refused with a sentence.
    let mut readonly = request.clone();
    readonly.target_path = path_str(&driver.block_target());
    readonly.readonly = true;
    let err = driver
        .node()
        .node_publish_volume(readonly)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

    // Growth reaches the pod's device; the data stays.
    driver
        .expand(expand_request(&volume.volume_id, &target, 64 * MIB, 0))
        .await
        .expect("NodeExpandVolume");
    assert_eq!(device_size(&target), 63 * MIB as u64);
    assert_eq!(read_device_marker(&target, marker.len()), marker);

    // Unstaged, the mapping is gone; staged again, the data is there.
    let err = driver
        .unstage(&volume.volume_id, &staging)
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Code::FailedPrecondition,
        "a pod still uses it: {err:?}"
    );
    driver.unpublish_ok(&volume, &target).await;
    driver.unstage(&volume.volume_id, &staging).await.unwrap();
    assert!(!mapping(&volume).exists());
    assert!(driver.loop_devices_left().is_empty());
    stage_as(&driver, &volume, &staging, cap.clone(), Some(KEY))
        .await
        .unwrap();
    // A restarted driver keeps the mapping and serves a new pod without the key.
    driver.kill9_and_restart().await;
    driver.node().node_publish_volume(request).await.unwrap();
    assert_eq!(read_device_marker(&target, marker.len()), marker);

    // A restore of its snapshot opens with the same key and holds the same data.
    let snapshot = driver.snapshot_of(&volume.volume_id).await;
    let mut restore = encrypted_request_of(cap.clone(), 64 * MIB, Some("crypt"));
    restore.volume_content_source = Some(from_snapshot(&snapshot.snapshot_id));
    let restored = driver.create(restore).await;
    let restored_staging = driver.staging_path();
    stage_as(
        &driver,
        &restored,
        &restored_staging,
        cap.clone(),
        Some(KEY),
    )
    .await
    .unwrap();
    let restored_target = driver.block_target();
    let mut request = publish_request(&restored, &restored_target, cap.clone(), false);
    request.staging_target_path = path_str(&restored_staging);
    driver.node().node_publish_volume(request).await.unwrap();
    assert_eq!(read_device_marker(&restored_target, marker.len()), marker);

    for (volume, staging, target) in [
        (&volume, &staging, &target),
        (&restored, &restored_staging, &restored_target),
    ] {
        driver.unpublish_ok(volume, target).await;
        driver.unstage(&volume.volume_id, staging).await.unwrap();
        driver.delete(&volume.volume_id).await.unwrap();
    }
    driver.delete_snapshot(&snapshot.snapshot_id).await.unwrap();
    assert!(driver.loop_devices_left().is_empty());
    assert_disk_holds_neither(&fs, &marker);
}
