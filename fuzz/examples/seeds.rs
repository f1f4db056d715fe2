//! Writes the seed corpora under `fuzz/corpus/<target>/` with stickyvol's own writers: an
//! export stream of a small tree holding every kind of entry and of a sparse image (the
//! exporter), a journal generation with a few commits (the journal), mountinfo lines with
//! the kernel's escapes, and CSI requests as gRPC carries them (protobuf).
//!
//!     cd fuzz && cargo run --example seeds            # as root (mknod of a fifo, chown)
//!
//! The committed seeds were made once this way; running it again makes new ids and times.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{self, File};
use std::os::unix::fs::{FileExt, symlink};
use std::path::{Path, PathBuf};
use std::time::Duration;

use prost::Message;
use stickyvol::csi;
use stickyvol::fuzzing::journal_frame;
use stickyvol::host::archive;
use stickyvol::volume::state::id::{NodeTag, SnapshotId, VolumeId};
use stickyvol::volume::state::journal::{Entry, Journal, Op, Options};

fn corpus(target: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stickyvol-seeds-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn export_seeds() {
    let out = corpus("export_stream");
    let root = scratch("tree");
    fs::write(root.join("hello.txt"), b"hello, world\n").unwrap();
    // A sparse file: a hole, then a few bytes, then a trailing hole.
    let sparse = File::create(root.join("sparse")).unwrap();
    sparse
        .write_all_at(b"data after a hole", 256 << 10)
        .unwrap();
    sparse.set_len(512 << 10).unwrap();
    fs::create_dir(root.join("sub dir")).unwrap();
    fs::write(root.join("sub dir/nested"), b"x").unwrap();
    fs::hard_link(root.join("hello.txt"), root.join("sub dir/hello-link")).unwrap();
    symlink("../hello.txt", root.join("sub dir/symlink")).unwrap();
    let fifo = CString::new(root.join("fifo").into_os_string().into_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);
    let name = CString::new(root.join("hello.txt").into_os_string().into_encoded_bytes()).unwrap();
    let value = b"a user xattr";
    let set = unsafe {
        libc::setxattr(
            name.as_ptr(),
            c"user.comment".as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if set != 0 {
        eprintln!("no user xattrs here: the tree seed has none");
    }
    let header = archive::tree_header(&root, "sv-seed-tree").unwrap();
    let mut stream = Vec::new();
    archive::export(&root, &header, &mut stream).unwrap();
    fs::write(out.join("tree"), &stream).unwrap();

    let empty = scratch("empty");
    let header = archive::tree_header(&empty, "sv-seed-empty").unwrap();
    let mut stream = Vec::new();
    archive::export(&empty, &header, &mut stream).unwrap();
    fs::write(out.join("empty-tree"), &stream).unwrap();

    let dir = scratch("image");
    let image = dir.join("image");
    let file = File::create(&image).unwrap();
    file.write_all_at(b"boot sector", 0).unwrap();
    file.write_all_at(b"superblock", 64 << 10).unwrap();
    file.set_len(1 << 20).unwrap();
    let header = archive::image_header(&image, "sv-seed-image").unwrap();
    let mut stream = Vec::new();
    archive::export(&image, &header, &mut stream).unwrap();
    fs::write(out.join("image"), &stream).unwrap();
    for dir in [root, empty, dir] {
        fs::remove_dir_all(dir).unwrap();
    }
}

/// CRC-32 (IEEE, reflected), bit by bit: only to make a version 1 seed.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn journal_seeds() {
    let out = corpus("journal_file");
    let dir = scratch("journal");
    let node = NodeTag::of("node-a");
    let volume = VolumeId::generate(&node).to_string();
    let snapshot = SnapshotId::generate(&node).to_string();
    let record = |id: &str, state: &str| {
        format!(r#"{{"id":"{id}","name":"pvc-1","capacity_bytes":1073741824,"state":"{state}"}}"#)
            .into_bytes()
    };
    let entries = vec![
        Entry {
            op: Op::Create,
            id: volume.clone(),
            json: record(&volume, "creating"),
        },
        Entry {
            op: Op::Update,
            id: volume.clone(),
            json: record(&volume, "ready"),
        },
        Entry {
            op: Op::Create,
            id: snapshot.clone(),
            json: record(&snapshot, "ready"),
        },
        Entry {
            op: Op::Remove,
            id: snapshot.clone(),
            json: Vec::new(),
        },
    ];
    let options = Options {
        max_bytes: 2048,
        max_age: Duration::from_secs(3600),
        background: false,
        ..Options::default()
    };
    let (journal, _) = Journal::open(&dir, "j", &dir, options).unwrap();
    for entry in &entries {
        journal.commit(entry.clone()).unwrap();
    }
    // Read while the journal is open: a clean close compacts and removes the generation.
    let written = fs::read(dir.join("j.1")).unwrap();
    drop(journal);
    fs::write(out.join("v2"), &written).unwrap();
    // A crash before the last commit's flush: its tail is zeros (a torn entry).
    let mut torn = written.clone();
    let end = torn.iter().rposition(|&b| b != 0).unwrap() + 1;
    torn[end - 4..end].fill(0);
    fs::write(out.join("v2-torn"), &torn).unwrap();
    // Version 1: the same entries, frames without the order numbers, nothing after them.
    let mut v1 = Vec::new();
    for entry in &entries {
        let frame = journal_frame(entry, 0, 0);
        let payload = &frame[8 + 16..];
        v1.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        v1.extend_from_slice(&crc32(payload).to_le_bytes());
        v1.extend_from_slice(payload);
    }
    fs::write(out.join("v1"), &v1).unwrap();
    fs::remove_dir_all(dir).unwrap();
}

fn mountinfo_seeds() {
    let out = corpus("mountinfo");
    let kubelet = "/var/lib/kubelet/pods/0b6f3c9e-2f0c-4c1b-9a0e-3f1d2c4b5a69/volumes/kubernetes.io~csi/pvc-1/mount";
    let lines = [
        "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro".to_string(),
        "25 22 0:22 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw".to_string(),
        "40 22 0:36 / /run rw,nosuid,nodev,noexec,relatime shared:5 - tmpfs tmpfs rw,size=813564k,mode=755,inode64".to_string(),
        format!("812 22 259:2 /var/lib/stickyvol/pools/default/volumes/sv-0190b3e1c2d37a4e8f1029384756abcd-1a2b3c4d/data {kubelet} rw,nosuid,nodev,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro"),
        "813 812 7:3 / /var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/pvc-2/dev rw,relatime master:7 propagate_from:1 - xfs /dev/loop3 rw,attr2,inode64,logbufs=8,noquota".to_string(),
        r"900 22 0:50 / /mnt/with\040space\011tab\012newline\134backslash rw,relatime unbindable - fuse.sshfs user@host:/a\040b rw,user_id=0,group_id=0".to_string(),
        r"901 22 0:51 /sub\040dir /mnt/bind\040of\040a\040subdir rw - btrfs /dev/sdb rw,space_cache=v2,subvolid=5,subvol=/".to_string(),
        r"902 22 0:52 / /mnt/not\377utf8\300 ro,nosuid - overlay overlay ro,lowerdir=/l,upperdir=/u,workdir=/w".to_string(),
    ];
    for (i, line) in lines.iter().enumerate() {
        fs::write(out.join(format!("line-{i}")), format!("{line}\n")).unwrap();
    }
    fs::write(out.join("table"), lines.join("\n") + "\n").unwrap();
    // Bytes that are not UTF-8, raw, as the kernel may print a mount point.
    let mut raw = b"903 22 0:53 / /mnt/raw-\xff\xfe-name rw - tmpfs tmpfs rw\n".to_vec();
    raw.extend_from_slice(lines[0].as_bytes());
    fs::write(out.join("raw-bytes"), raw).unwrap();
}

fn request_seeds() {
    use csi::volume_capability::access_mode::Mode;
    use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
    let out = corpus("request");
    let write = |name: &str, what: u8, bytes: &[u8]| {
        let mut seed = vec![what];
        seed.extend_from_slice(bytes);
        fs::write(out.join(name), seed).unwrap();
    };
    let node = NodeTag::of("node-a");
    let volume = VolumeId::generate(&node).to_string();
    let snapshot = SnapshotId::generate(&node).to_string();
    let target = "/var/lib/kubelet/pods/0b6f3c9e-2f0c-4c1b-9a0e-3f1d2c4b5a69/volumes/kubernetes.io~csi/pvc-1/mount";
    write("volume-id", 0, volume.as_bytes());
    write("volume-id-untagged", 0, &volume.as_bytes()[..35]);
    write("snapshot-id", 0, snapshot.as_bytes());
    write("target-path", 1, target.as_bytes());
    write("path-with-dots", 1, b"/var/lib/kubelet/pods/../../../etc");
    write("device-path", 1, b"/dev/loop2");
    write("parameters", 2, b"pool=fast\nblockAllocation=thick\nrequireEnforcement=true\nsharedAccess=false\ncsi.storage.k8s.io/pvc/name=data");
    write("mount-options", 3, b"ro,noexec\nnosuid\n nodev \nnoatime");
    let mount = |flags: &[&str], mode: Mode| csi::VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: String::new(),
            mount_flags: flags.iter().map(|f| f.to_string()).collect(),
            volume_mount_group: String::new(),
        })),
    };
    let block = csi::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    };
    let publish = csi::NodePublishVolumeRequest {
        volume_id: volume.clone(),
        target_path: target.into(),
        volume_capability: Some(mount(&["ro", "noexec"], Mode::SingleNodeWriter)),
        readonly: true,
        volume_context: HashMap::from([(
            "storage.kubernetes.io/csiProvisionerIdentity".into(),
            "1".into(),
        )]),
        ..Default::default()
    };
    write("node-publish", 4, &publish.encode_to_vec());
    let publish_block = csi::NodePublishVolumeRequest {
        volume_capability: Some(block.clone()),
        target_path: "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-2/uid"
            .into(),
        staging_target_path:
            "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/staging/pvc-2".into(),
        ..publish
    };
    write("node-publish-block", 4, &publish_block.encode_to_vec());
    let create = csi::CreateVolumeRequest {
        name: "pvc-0b6f3c9e-2f0c-4c1b-9a0e-3f1d2c4b5a69".into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![
            mount(&["nosuid"], Mode::SingleNodeWriter),
            mount(&[], Mode::MultiNodeReaderOnly),
        ],
        parameters: HashMap::from([
            ("pool".into(), "default".into()),
            ("sharedAccess".into(), "true".into()),
            ("csi.storage.k8s.io/pvc/namespace".into(), "apps".into()),
        ]),
        volume_content_source: Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Snapshot(
                csi::volume_content_source::SnapshotSource {
                    snapshot_id: snapshot.clone(),
                },
            )),
        }),
        accessibility_requirements: Some(csi::TopologyRequirement {
            requisite: vec![csi::Topology {
                segments: HashMap::from([("topology.stickyvol/node".into(), "node-a".into())]),
            }],
            preferred: Vec::new(),
        }),
        ..Default::default()
    };
    write("create-volume", 5, &create.encode_to_vec());
    let clone = csi::CreateVolumeRequest {
        volume_capabilities: vec![block],
        parameters: HashMap::from([("blockAllocation".into(), "thin".into())]),
        volume_content_source: Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Volume(
                csi::volume_content_source::VolumeSource {
                    volume_id: volume.clone(),
                },
            )),
        }),
        ..create
    };
    write("create-volume-clone", 5, &clone.encode_to_vec());
    let snap = csi::CreateSnapshotRequest {
        source_volume_id: volume.clone(),
        name: "snapshot-3c9e0b6f".into(),
        parameters: HashMap::from([("csi.storage.k8s.io/volumesnapshot/name".into(), "s".into())]),
        ..Default::default()
    };
    write("create-snapshot", 6, &snap.encode_to_vec());
    let expand = csi::NodeExpandVolumeRequest {
        volume_id: volume.clone(),
        volume_path: "/dev/loop2".into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 2 << 30,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    write("node-expand", 7, &expand.encode_to_vec());
    let delete = csi::DeleteSnapshotRequest {
        snapshot_id: snapshot,
        ..Default::default()
    };
    write("delete-snapshot", 8, &delete.encode_to_vec());
}

fn main() {
    export_seeds();
    journal_seeds();
    mountinfo_seeds();
    request_seeds();
}
