//! What protects the node: secrets stay out of logs, the socket is not world-accessible, a
//! second instance never touches a live one's state, ids never become paths.

mod common;

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::time::Duration;

use common::*;
use stickyvol::admin_api::DescribeVolumesRequest;
use stickyvol::admin_api::admin_client::AdminClient;

const SECRET: &str = "s3cr3t-value";

fn secrets() -> HashMap<String, String> {
    HashMap::from([
        ("password".to_string(), SECRET.to_string()),
        ("token".to_string(), format!("Bearer {SECRET}")),
    ])
}

#[tokio::test]
async fn secrets_never_reach_the_log() {
    let driver = TestDriver::start_with(Options {
        rust_log: Some("debug"),
        ..Default::default()
    })
    .await;
    let name = new_name();
    let create = csi::CreateVolumeRequest {
        secrets: secrets(),
        ..create_request(&name, mount_cap(Mode::SingleNodeWriter), SIZE)
    };
    let volume = driver
        .controller()
        .create_volume(create.clone())
        .await
        .expect("CreateVolume with secrets")
        .into_inner()
        .volume
        .unwrap();
    // Failing calls too: error paths are where request dumps tend to hide.
    let conflicting = csi::CreateVolumeRequest {
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 2 * SIZE,
            limit_bytes: 2 * SIZE,
        }),
        ..create
    };
    expect_code(
        driver.controller().create_volume(conflicting).await,
        Code::AlreadyExists,
    );
    let invalid = csi::CreateVolumeRequest {
        secrets: secrets(),
        ..create_request("", mount_cap(Mode::SingleNodeWriter), SIZE)
    };
    expect_code(
        driver.controller().create_volume(invalid).await,
        Code::InvalidArgument,
    );
    let validate = csi::ValidateVolumeCapabilitiesRequest {
        volume_id: volume.volume_id.clone(),
        volume_capabilities: vec![mount_cap(Mode::SingleNodeWriter)],
        secrets: secrets(),
        ..Default::default()
    };
    driver
        .controller()
        .validate_volume_capabilities(validate)
        .await
        .unwrap();

    let target = driver.mount_target();
    let publish = csi::NodePublishVolumeRequest {
        secrets: secrets(),
        ..publish_request(&volume, &target, mount_cap(Mode::SingleNodeWriter), false)
    };
    driver
        .node()
        .node_publish_volume(publish.clone())
        .await
        .expect("NodePublishVolume with secrets");
    let wrong_target = csi::NodePublishVolumeRequest {
        target_path: "/etc/x".into(),
        ..publish
    };
    expect_code(
        driver.node().node_publish_volume(wrong_target).await,
        Code::InvalidArgument,
    );
    driver.unpublish_ok(&volume, &target).await;
    let delete = csi::DeleteVolumeRequest {
        volume_id: volume.volume_id.clone(),
        secrets: secrets(),
    };
    driver.controller().delete_volume(delete).await.unwrap();

    let log = driver.log_text();
    assert!(log.contains("CreateVolume"), "debug logging is on:\n{log}");
    assert!(
        log.contains("NodePublishVolume"),
        "debug logging is on:\n{log}"
    );
    assert!(!log.contains(SECRET), "a secret reached the log:\n{log}");
}

#[tokio::test]
async fn socket_is_not_world_accessible() {
    let driver = TestDriver::start().await;
    let meta = fs::symlink_metadata(&driver.socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    // The data dir holds every volume; pods reach theirs only through its mount.
    let data = fs::metadata(&driver.data).unwrap();
    assert_eq!(data.permissions().mode() & 0o777, 0o700);
}

/// The inotify events (mask per name) of one directory, read without blocking.
struct DirEvents(std::os::fd::OwnedFd);

impl DirEvents {
    fn watch(dir: &std::path::Path, mask: u32) -> DirEvents {
        use std::os::fd::{AsRawFd, FromRawFd};
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: plain system calls on a descriptor we own.
        unsafe {
            let fd = libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC);
            assert!(fd >= 0, "{}", std::io::Error::last_os_error());
            let events = DirEvents(std::os::fd::OwnedFd::from_raw_fd(fd));
            let dir = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
            let wd = libc::inotify_add_watch(events.0.as_raw_fd(), dir.as_ptr(), mask);
            assert!(wd >= 0, "{}", std::io::Error::last_os_error());
            events
        }
    }

    /// The masks of the queued events about `name`, in order.
    fn of(&self, name: &str) -> Vec<u32> {
        use std::os::fd::AsRawFd;
        let mut masks = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            // SAFETY: reads into our buffer, at most its length.
            let n = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return masks;
            }
            let mut at = 0;
            while at < n as usize {
                let word =
                    |i: usize| u32::from_ne_bytes(buf[at + i..at + i + 4].try_into().unwrap());
                // struct inotify_event: wd, mask, cookie, len, then len bytes of NUL-padded name.
                let (mask, len) = (word(4), word(12) as usize);
                let raw = &buf[at + 16..at + 16 + len];
                let end = raw.iter().position(|b| *b == 0).unwrap_or(len);
                if &raw[..end] == name.as_bytes() {
                    masks.push(mask);
                }
                at += 16 + len;
            }
        }
    }
}

/// The umask in /proc/PID/status.
fn umask_of(pid: u32) -> String {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Umask:")).unwrap();
    line["Umask:".len()..].trim().to_string()
}

/// A process killed (and reaped) when the test ends, passed or not.
struct KilledOnDrop(std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_sockets_are_created_with_their_modes_and_never_changed_by_path() {
    let driver = TestDriver::prepare(Options::default());
    let admin_dir = driver.admin_socket.parent().unwrap();
    fs::create_dir(admin_dir).unwrap();
    let watched = [(&driver.socket, 0o660), (&driver.admin_socket, 0o600)].map(|(socket, mode)| {
        let mask = libc::IN_CREATE | libc::IN_ATTRIB | libc::IN_MOVED_TO;
        (
            socket,
            mode,
            DirEvents::watch(socket.parent().unwrap(), mask),
        )
    });
    // A umask that would strip the group's write bit from a plain bind.
    let serving = KilledOnDrop(
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("umask 027 && {}", driver.shell_command()))
            .spawn()
            .unwrap(),
    );
    // Serving comes after both sockets are bound and their bind directories removed; a connect
    // alone succeeds at the rename, a moment before that removal (seen under emulation).
    let started = std::time::Instant::now();
    while !probe_answers(&driver.socket).await {
        assert!(
            started.elapsed() < on_this_machine(Duration::from_secs(10)),
            "the driver serves within 10 s; log:\n{}",
            driver.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (socket, mode, events) in watched {
        let name = socket.file_name().unwrap().to_str().unwrap();
        // The socket appears at its path whole, renamed from a directory only root may enter;
        // a chmod (or chown) by path after bind would show as IN_ATTRIB: the window in which a
        // swap of the path could redirect it.
        assert_eq!(
            events.of(name),
            [libc::IN_MOVED_TO],
            "{name}: IN_MOVED_TO only"
        );
        let leftovers: Vec<_> = fs::read_dir(socket.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(".stickyvol-bind-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        let meta = fs::symlink_metadata(socket).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, mode, "{name}");
    }
    // The driver's own umask is left as it was given (sh execs the driver: same pid).
    assert_eq!(umask_of(serving.0.id()), "0027");
}

#[tokio::test]
async fn a_stale_socket_is_replaced_at_start() {
    let mut driver = TestDriver::prepare(Options::default());
    let sockets = [
        (driver.socket.clone(), 0o660),
        (driver.admin_socket.clone(), 0o600),
    ];
    // Socket files nobody listens on, as a crashed driver leaves them.
    fs::create_dir(driver.admin_socket.parent().unwrap()).unwrap();
    for (socket, _) in &sockets {
        drop(std::os::unix::net::UnixListener::bind(socket).unwrap());
    }
    driver.start_again().await;
    let volume = driver.create_fs_volume().await;
    // And after a kill -9 of our own.
    driver.kill9();
    for (socket, _) in &sockets {
        assert!(
            socket.exists(),
            "kill -9 leaves {} behind",
            socket.display()
        );
    }
    driver.start_again().await;
    assert_eq!(driver.list_all().await.len(), 1);
    driver.delete(&volume.volume_id).await.unwrap();
    for (socket, mode) in &sockets {
        let meta = fs::symlink_metadata(socket).unwrap();
        assert_eq!(
            meta.permissions().mode() & 0o777,
            *mode,
            "{}",
            socket.display()
        );
    }
    AdminClient::new(driver.admin_channel().await)
        .describe_volumes(DescribeVolumesRequest::default())
        .await
        .expect("the admin socket serves again");
    // A graceful stop removes the sockets.
    driver.stop().await;
    for (socket, _) in &sockets {
        assert!(!exists_no_follow(socket), "{} is left", socket.display());
    }
}

#[tokio::test]
async fn a_live_admin_socket_is_never_taken_over() {
    let driver = TestDriver::start().await;
    // A second driver on its own CSI socket and data dir, but the first one's admin socket.
    let mut second = TestDriver::prepare(Options::default());
    second.admin_socket = driver.admin_socket.clone();
    let status = second
        .try_start_again()
        .await
        .expect_err("a second driver took over a live admin socket");
    assert!(!status.success());
    let log = second.log_text();
    assert!(
        log.contains("another process is already serving on")
            && log.contains(&driver.admin_socket.display().to_string()),
        "{log}"
    );
    assert!(!exists_no_follow(&second.socket), "the CSI socket is left");
    assert!(
        fs::read_dir(&second.data).is_err(),
        "the refused driver opened its data dir"
    );
    AdminClient::new(driver.admin_channel().await)
        .describe_volumes(DescribeVolumesRequest::default())
        .await
        .expect("the first driver's admin socket still serves");
}

#[tokio::test]
async fn a_non_socket_file_at_the_endpoint_is_never_replaced() {
    let mut driver = TestDriver::prepare(Options::default());
    fs::write(&driver.socket, b"important").unwrap();
    let mut child = driver.command().spawn().unwrap();
    let status = wait_bounded(&mut child, Duration::from_secs(10))
        .await
        .expect("the driver exits");
    assert!(!status.success());
    assert_eq!(fs::read(&driver.socket).unwrap(), b"important");
    fs::remove_file(&driver.socket).unwrap();
    // Nor at the admin socket's path; the CSI socket bound before is removed again.
    fs::create_dir(driver.admin_socket.parent().unwrap()).unwrap();
    fs::write(&driver.admin_socket, b"also important").unwrap();
    let mut child = driver.command().spawn().unwrap();
    let status = wait_bounded(&mut child, Duration::from_secs(10))
        .await
        .expect("the driver exits");
    assert!(!status.success());
    assert_eq!(fs::read(&driver.admin_socket).unwrap(), b"also important");
    assert!(!exists_no_follow(&driver.socket));
    fs::remove_file(&driver.admin_socket).unwrap();
    driver.start_again().await;
}

/// The driver serves at any path the kernel takes for a socket (107 bytes): binding first in a
/// private directory beside it must not cost any of them. A longer one is refused at start,
/// saying why.
#[tokio::test]
async fn a_socket_path_of_any_length_the_kernel_takes_is_served_and_a_longer_one_refused() {
    let mut driver = TestDriver::prepare(Options::default());
    let name = "csi.sock";
    let root = driver.root.clone();
    let socket_of = |dir_len: usize| root.join("d".repeat(dir_len)).join(name);
    let longest = 107 - driver.root.as_os_str().len() - 2 - name.len();
    driver.socket = socket_of(longest);
    assert_eq!(driver.socket.as_os_str().len(), 107);
    driver.start_again().await;
    driver.stop().await;

    driver.socket = socket_of(longest + 1);
    let mut child = driver.command().spawn().unwrap();
    let status = wait_bounded(&mut child, Duration::from_secs(10))
        .await
        .expect("the driver exits");
    assert!(!status.success());
    let log = driver.log_text();
    assert!(
        log.contains("is 108 bytes long; a unix socket's path can be at most 107"),
        "{log}"
    );
    assert!(!exists_no_follow(&driver.socket));
}

#[tokio::test]
async fn a_second_driver_on_a_live_socket_refuses_and_touches_nothing() {
    let mut driver = TestDriver::start().await;
    let (volume, target) = driver.published_block_volume().await;
    let device = linked_device(&target);
    // Data of a CreateVolume the live driver is in the middle of: not an orphan to it.
    let in_flight = driver.data.join("volumes").join(unknown_volume_id());
    fs::create_dir(&in_flight).unwrap();

    let mut second = driver.command().spawn().unwrap();
    let status = wait_bounded(&mut second, Duration::from_secs(10)).await;
    let status = match status {
        Some(status) => status,
        None => {
            let _ = second.kill();
            let _ = second.wait();
            panic!("a second driver kept running on a live socket");
        }
    };
    assert!(!status.success());
    assert!(driver.log_text().contains("already serving"));
    assert!(
        in_flight.is_dir(),
        "the refused instance ran startup recovery"
    );
    assert_eq!(loop_devices_of(&host_path(&volume)), vec![device]);

    // The first driver is unharmed.
    assert!(driver.is_running());
    assert!(driver.socket.exists());
    let probe = driver.identity().probe(csi::ProbeRequest {}).await.unwrap();
    assert_eq!(probe.into_inner().ready, Some(true));
    assert_eq!(driver.list_all().await.len(), 1);
    driver.unpublish_ok(&volume, &target).await;
    assert_eq!(loop_devices_of(&host_path(&volume)), vec![]);
}

#[tokio::test]
async fn a_second_driver_on_the_same_data_dir_refuses_whatever_its_socket() {
    let driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    let in_flight = driver.data.join("volumes").join(unknown_volume_id());
    fs::create_dir(&in_flight).unwrap();
    let other_socket = driver.root.join("other.sock");
    let other_admin_socket = driver.root.join("other").join("admin.sock");
    let log = fs::File::create(driver.root.join("second.log")).unwrap();

    let mut second = std::process::Command::new(env!("CARGO_BIN_EXE_stickyvol"))
        .arg("serve")
        .arg(format!("--endpoint=unix://{}", other_socket.display()))
        .arg(format!("--admin-socket={}", other_admin_socket.display()))
        .arg(format!("--node-id={NODE_ID}"))
        .arg(format!("--kubelet-dir={}", driver.kubelet.display()))
        .arg(format!("--data-dir={}", driver.data.display()))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let status = match wait_bounded(&mut second, Duration::from_secs(10)).await {
        Some(status) => status,
        None => {
            let _ = second.kill();
            let _ = second.wait();
            panic!("a second driver kept running on a data directory in use");
        }
    };
    assert!(!status.success());
    let second_log = fs::read_to_string(driver.root.join("second.log")).unwrap();
    assert!(
        second_log.contains("another stickyvol instance is using the pool directory"),
        "{second_log}"
    );
    assert!(
        in_flight.is_dir(),
        "the refused instance ran startup recovery"
    );
    assert!(
        !other_socket.exists() && !other_admin_socket.exists(),
        "the refused instance left a socket"
    );
    assert_eq!(
        driver.list_all().await[0]
            .volume
            .as_ref()
            .unwrap()
            .volume_id,
        volume.volume_id
    );
}

#[tokio::test]
async fn volume_ids_never_become_paths() {
    let driver = TestDriver::start().await;
    let victim = driver.data.join("victim");
    fs::create_dir(&victim).unwrap();
    fs::write(victim.join("file"), b"keep").unwrap();
    let target = driver.mount_target();
    for id in [
        "../victim",
        "sv-../../victim",
        "../../data/victim",
        "sv-0123456789abcdef0123456789abcdef/../../victim",
    ] {
        driver
            .delete(id)
            .await
            .unwrap_or_else(|s| panic!("{id}: {s:?}"));
        let status = driver
            .node()
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: id.into(),
                target_path: path_str(&target),
                volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
                ..Default::default()
            })
            .await;
        expect_code(status, Code::NotFound);
        expect_code(driver.stats(id, &path_str(&target)).await, Code::NotFound);
    }
    assert_eq!(fs::read(victim.join("file")).unwrap(), b"keep");
    assert!(!exists_no_follow(&target));
}

#[tokio::test]
async fn logs_to_a_file_carry_no_terminal_colour_codes() {
    let driver = TestDriver::start().await;
    driver.create_fs_volume().await;
    let log = driver.log_text();
    assert!(log.contains("created volume"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "escape codes in a log file: {log:?}"
    );
}

/// The requests the first test does not send (snapshots, node expansion, listings), each with
/// secrets, logged as JSON at debug level: the secrets reach neither the text nor any field.
#[tokio::test]
async fn secrets_never_reach_the_json_log_of_snapshot_and_expand_requests() {
    let driver = TestDriver::start_with(Options {
        rust_log: Some("debug"),
        extra_args: vec!["--log-format".into(), "json".into()],
        ..Default::default()
    })
    .await;
    let (volume, target) = driver.published_fs_volume().await;
    let snapshot = driver
        .controller()
        .create_snapshot(csi::CreateSnapshotRequest {
            secrets: secrets(),
            ..snapshot_request(&new_snapshot_name(), &volume.volume_id)
        })
        .await
        .expect("CreateSnapshot with secrets")
        .into_inner()
        .snapshot
        .unwrap();
    driver
        .controller()
        .list_snapshots(csi::ListSnapshotsRequest {
            secrets: secrets(),
            ..Default::default()
        })
        .await
        .expect("ListSnapshots with secrets");
    let grown = 2 * SIZE;
    driver
        .expand(csi::NodeExpandVolumeRequest {
            secrets: secrets(),
            ..expand_request(&volume.volume_id, &target, grown, 0)
        })
        .await
        .expect("NodeExpandVolume with secrets");
    // A failing one too.
    expect_code(
        driver
            .controller()
            .create_snapshot(csi::CreateSnapshotRequest {
                secrets: secrets(),
                ..snapshot_request("", &volume.volume_id)
            })
            .await,
        Code::InvalidArgument,
    );
    driver
        .controller()
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: snapshot.snapshot_id.clone(),
            secrets: secrets(),
        })
        .await
        .expect("DeleteSnapshot with secrets");
    driver.unpublish_ok(&volume, &target).await;
    driver.delete(&volume.volume_id).await.unwrap();

    let log = driver.log_text();
    for line in log.lines().filter(|line| !line.trim().is_empty()) {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|err| panic!("not a JSON log line ({err}): {line}"));
    }
    for rpc in [
        "CreateSnapshot",
        "ListSnapshots",
        "NodeExpandVolume",
        "DeleteSnapshot",
    ] {
        assert!(log.contains(rpc), "debug logging names {rpc}:\n{log}");
    }
    assert!(!log.contains(SECRET), "a secret reached the log:\n{log}");
}

/// Two drivers with data directories of their own that name the same extra pool: the second
/// refuses to start, by the pool's lock, and touches nothing of the first's pool.
#[tokio::test]
async fn a_second_driver_on_another_drivers_extra_pool_is_refused_by_its_lock() {
    let shared = tempfile::tempdir_in("/var/tmp").unwrap();
    let pool = shared.path().join("extra");
    let pool_arg = format!("extra={}", pool.display());
    let mut first = TestDriver::prepare(Options::default());
    first.add_args(["--pool", pool_arg.as_str()]);
    first.start_again().await;
    let mut request = create_request(&new_name(), mount_cap(Mode::SingleNodeWriter), SIZE);
    request.parameters = params(&[("pool", "extra")]);
    let volume = first.create(request).await;

    let mut second = TestDriver::prepare(Options::default());
    second.add_args(["--pool", pool_arg.as_str()]);
    let status = second.try_start_again().await.unwrap_err();
    assert!(!status.success());
    let log = second.log_text();
    assert!(
        log.contains(&format!(
            "another stickyvol instance is using the pool directory {}",
            pool.display()
        )),
        "{log}"
    );
    // The first driver's volume is untouched and it still serves.
    assert!(host_path(&volume).is_dir());
    assert_eq!(
        first.listed_ids().await,
        std::slice::from_ref(&volume.volume_id)
    );
    first.delete(&volume.volume_id).await.unwrap();
    // Once the first is gone, the pool is free.
    first.stop().await;
    second.start_again().await;
    assert!(
        second.listed_ids().await.is_empty(),
        "the pool's volume is not the second's"
    );
}
