//! Two nodes on one kernel, as in every multi-node kind cluster: each driver has its data dir at
//! the same path in a mount namespace of its own, while loop devices are kernel-wide. Each sees
//! the other's devices with backing paths inside its own pool, so a device is ours only if it is
//! attached to our very file (same device and inode), whatever its path says.

mod common;

use std::fs::File;
use std::path::{Path, PathBuf};

use common::namespace::OtherNode;
use common::*;
use stickyvol::host::fsstat::{self, FileId};
use stickyvol::host::loopdev::{self, LoopDevice};

/// A device this test attached over a file of this node, as a crashed driver may leave one.
/// Detached on drop unless it is gone already (or now serves someone else).
struct OurDevice(LoopDevice, FileId);

impl OurDevice {
    fn attach(file: &Path) -> OurDevice {
        let device = loopdev::attach(file, false)
            .unwrap_or_else(|e| panic!("attaching {}: {e}", file.display()));
        OurDevice(device, fsstat::file_id(file).unwrap())
    }

    fn is_attached(&self) -> bool {
        loopdev::backing_file_id(&self.0).unwrap() == Some(self.1)
    }
}

impl Drop for OurDevice {
    fn drop(&mut self) {
        if loopdev::backing_file_id(&self.0).ok().flatten() == Some(self.1)
            && let Err(err) = loopdev::detach(&self.0)
        {
            eprintln!("detaching {}: {err}", self.0.name());
        }
    }
}

/// Whether `device` is still attached to the file `file` identifies (its number may serve
/// someone else once detached).
fn still_attached(device: &LoopDevice, file: FileId) -> bool {
    loopdev::backing_file_id(device).unwrap() == Some(file)
}

/// The identity of the file at `path` in the mount namespace of process `pid`.
fn file_id_seen_by(pid: u32, path: &Path) -> FileId {
    let through_its_root = PathBuf::from(format!("/proc/{pid}/root"))
        .join(path.strip_prefix("/").expect("an absolute path"));
    fsstat::file_id(&through_its_root)
        .unwrap_or_else(|e| panic!("{} as process {pid} sees it: {e}", path.display()))
}

/// The host-level fact the driver relies on: the kernel prints the other namespace's file at our
/// path, and only the identity tells the two apart.
#[test]
fn a_device_over_another_namespaces_file_at_our_path_is_not_ours() {
    let dir = tempfile::Builder::new()
        .prefix("stickyvol-test-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let ours = dir.path().canonicalize().unwrap().join("x.img");
    File::create(&ours).unwrap().set_len(MIB as u64).unwrap();
    let mut other = OtherNode::over(ours.parent().unwrap());
    let (theirs, their_file) = other.attach_new_file("x.img", MIB as u64);
    let mine = OurDevice::attach(&ours);

    assert_eq!(
        loopdev::backing_file(&theirs).unwrap(),
        Some(ours.clone()),
        "the other namespace's file shows at our path"
    );
    assert_ne!(their_file, fsstat::file_id(&ours).unwrap());
    assert_eq!(loopdev::backing_file_id(&theirs).unwrap(), Some(their_file));
    assert!(!loopdev::is_attached_to(&theirs, &ours).unwrap());
    assert!(loopdev::is_attached_to(&mine.0, &ours).unwrap());
    assert_eq!(
        loopdev::find_by_backing_file(&ours).unwrap(),
        vec![mine.0.clone()]
    );
}

/// Seen in a real cluster: a node's driver starting detached the device another node had
/// published (its pod lost its disk), because the device's backing path lay in its pool and no
/// record of its own named the volume.
#[tokio::test]
async fn a_start_leaves_the_device_another_node_published_alone() {
    let mut this = TestDriver::start().await;
    let mut other = TestDriver::prepare_other_node_at_same_paths(&this, "other-node");
    other.start_again().await;
    let (volume, target) = other.published_block_volume().await;
    let device = linked_device(&target);
    let file = host_path(&volume);
    let theirs = file_id_seen_by(other.pid(), &file);
    // What this node sees: a device over a file in its own pool, which it does not have.
    assert!(file.starts_with(&this.data), "{}", file.display());
    assert_eq!(loopdev::backing_file(&device).unwrap(), Some(file.clone()));
    assert!(!exists_no_follow(&file));
    assert_eq!(loopdev::backing_file_id(&device).unwrap(), Some(theirs));
    let data = pattern(MIB as usize, 7);
    write_direct(&target, &data);

    this.restart().await;
    assert!(
        still_attached(&device, theirs),
        "this node's start detached the other node's published device"
    );
    assert_eq!(read_direct(&target, data.len()), data);

    // This node's own block volume lives and goes beside it.
    let (mine, my_target) = this.published_block_volume().await;
    this.expand(expand_request(&mine.volume_id, &my_target, 2 * SIZE, 0))
        .await
        .expect("NodeExpandVolume");
    this.unpublish_ok(&mine, &my_target).await;
    this.delete(&mine.volume_id).await.unwrap();
    this.kill9_and_restart().await;
    assert!(still_attached(&device, theirs));
    assert_eq!(read_direct(&target, data.len()), data);

    other.unpublish_ok(&volume, &target).await;
    assert!(
        !still_attached(&device, theirs),
        "its own driver detaches it"
    );
    other.delete(&volume.volume_id).await.unwrap();
}

/// The same volume ids on both nodes (an id we know, one we have data of but no record for):
/// this node's own unused devices are detached at start, the other node's are never touched,
/// neither by start nor by publish, expand or delete.
#[tokio::test]
async fn devices_of_the_same_volume_ids_on_another_node_are_told_apart() {
    let mut this = TestDriver::start().await;
    let known = this.create_block_volume().await;
    let known_file = host_path(&known);
    let recordless_id = unknown_volume_id();
    let recordless_file = known_file.with_file_name(format!("{recordless_id}.img"));
    this.kill9();
    // A crash left this node's devices behind: one over a volume it knows (attached, never
    // linked), one over data it has no record of.
    File::create(&recordless_file)
        .unwrap()
        .set_len(MIB as u64)
        .unwrap();
    let ours = [
        OurDevice::attach(&known_file),
        OurDevice::attach(&recordless_file),
    ];
    // The other node has files of the same ids at the same paths, each attached.
    let mut other = OtherNode::over(&this.data);
    let theirs = [&known_file, &recordless_file].map(|file| {
        let relative = file.strip_prefix(&this.data).unwrap().to_str().unwrap();
        let (device, id) = other.attach_new_file(relative, MIB as u64);
        assert_eq!(loopdev::backing_file(&device).unwrap().as_ref(), Some(file));
        (device, id)
    });

    this.start_again().await;
    for (device, id) in &theirs {
        assert!(
            still_attached(device, *id),
            "this node's start detached the other node's {}",
            device.name()
        );
    }
    for our in &ours {
        assert!(
            !our.is_attached(),
            "this node's unused {} is detached at start",
            our.0.name()
        );
    }
    assert!(
        this.data
            .join("lost+found")
            .join(format!("{recordless_id}.img"))
            .exists(),
        "data without a record is moved aside"
    );

    // A link at the target to the other node's device (a stale one, say, after a reboot
    // renumbered the devices) is not taken for this volume's device.
    let target = this.block_target();
    std::os::unix::fs::symlink(theirs[0].0.path(), &target).unwrap();
    this.publish_ok(&known, &target, block_cap(Mode::SingleNodeWriter))
        .await;
    let mine = linked_device(&target);
    assert_ne!(mine, theirs[0].0, "published the other node's device");
    assert!(loopdev::is_attached_to(&mine, &known_file).unwrap());
    this.expand(expand_request(&known.volume_id, &target, 2 * SIZE, 0))
        .await
        .expect("NodeExpandVolume");
    assert_eq!(sysfs_size_bytes(&theirs[0].0), MIB as u64);
    this.unpublish_ok(&known, &target).await;
    this.delete(&known.volume_id).await.unwrap();
    assert!(!exists_no_follow(&known_file));
    for (device, id) in &theirs {
        assert!(
            still_attached(device, *id),
            "this node's publish, expand or delete detached the other node's {}",
            device.name()
        );
    }
}
