//! The admin API answers root on the node only: on a socket of its own (issue 31), which the
//! sidecars sharing the CSI socket's directory (as root) cannot reach, with mode 0600, and by
//! the credentials the kernel recorded for the connection (issue 19), whatever the socket's
//! mode. The CSI socket serves no admin call, while its CSI services stay open to every process
//! its mode lets connect (sidecars may run as non-root uids in the socket's group).
//!
//! Non-root callers connect from a thread that changed only its own credentials (raw
//! system calls, not glibc's process-wide wrappers) to uid/gid 65534, keeping group 0 (the
//! socket's group) where the socket's mode must let them in to reach the server's check.

mod common;

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use common::*;
use stickyvol::admin_api::admin_client::AdminClient;
use stickyvol::admin_api::{
    DescribeVolumeRequest, DescribeVolumesRequest, ExportVolumeRequest, ImportVolumeRequest,
    RemoveVolumeRequest, UnfenceVolumeRequest,
};
use stickyvol::csi::controller_client::ControllerClient;
use stickyvol::csi::identity_client::IdentityClient;
use stickyvol::csi::node_client::NodeClient;
use tonic::transport::{Channel, Endpoint};

const NOBODY: u32 = 65534;

/// Connects to `socket` from a thread running as uid and gid [`NOBODY`] with the supplementary
/// `groups`; the connection keeps those credentials whatever the thread does next.
fn connect_as_nobody(socket: &Path, groups: &[libc::gid_t]) -> io::Result<UnixStream> {
    let socket = socket.to_path_buf();
    let groups = groups.to_vec();
    std::thread::spawn(move || {
        // SAFETY: plain system calls changing this thread's credentials; the thread only
        // connects and ends.
        unsafe {
            let set = [
                libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()),
                libc::syscall(libc::SYS_setresgid, NOBODY, NOBODY, NOBODY),
                libc::syscall(libc::SYS_setresuid, NOBODY, NOBODY, NOBODY),
            ];
            assert_eq!(set, [0, 0, 0], "{}", io::Error::last_os_error());
            assert_eq!(libc::geteuid(), NOBODY);
        }
        UnixStream::connect(&socket)
    })
    .join()
    .expect("the connecting thread")
}

/// A gRPC channel over the one connection `stream` (no reconnect: that would be root's).
async fn channel_over(stream: UnixStream) -> Channel {
    stream.set_nonblocking(true).unwrap();
    let stream = Mutex::new(Some(tokio::net::UnixStream::from_std(stream).unwrap()));
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let taken = stream.lock().unwrap().take();
            async move {
                taken
                    .map(hyper_util::rt::TokioIo::new)
                    .ok_or_else(|| io::Error::other("this channel has one connection only"))
            }
        }))
        .await
        .expect("an HTTP/2 connection over the socket")
}

/// A driver whose sockets' directories uid 65534 can enter (its test dir is 0700 otherwise).
async fn reachable_driver() -> TestDriver {
    let driver = TestDriver::start().await;
    fs::set_permissions(&driver.root, fs::Permissions::from_mode(0o711)).unwrap();
    driver
}

/// A connection of uid 65534 in group 0 to `socket`.
async fn nobody_channel(socket: &Path) -> Channel {
    let stream = connect_as_nobody(socket, &[0]).expect("connecting as uid 65534");
    channel_over(stream).await
}

/// Opens the admin socket to everyone, as a careless chmod would: the server's own check is
/// what then stands between a caller and the admin API.
fn open_admin_socket_to_all(driver: &TestDriver) {
    fs::set_permissions(&driver.admin_socket, fs::Permissions::from_mode(0o666)).unwrap();
}

fn host_path(volume: &csi::Volume) -> PathBuf {
    PathBuf::from(&volume.volume_context[HOST_PATH_KEY])
}

#[track_caller]
fn assert_refused<T: std::fmt::Debug>(rpc: &str, result: Result<T, Status>) {
    let status = result.expect_err(rpc);
    assert_eq!(status.code(), Code::PermissionDenied, "{rpc}: {status:?}");
    assert!(
        status.message().contains("root on the node only")
            && status.message().contains("uid 65534"),
        "{rpc}: {}",
        status.message()
    );
}

#[tokio::test]
async fn every_admin_rpc_refuses_a_non_root_caller_and_serves_root() {
    let driver = reachable_driver().await;
    open_admin_socket_to_all(&driver);
    let volume = driver.create_fs_volume().await;
    fs::write(host_path(&volume).join("secret"), b"tenant data").unwrap();
    let id = volume.volume_id.clone();

    let mut nobody = AdminClient::new(nobody_channel(&driver.admin_socket).await);
    assert_refused(
        "DescribeVolumes",
        nobody
            .describe_volumes(DescribeVolumesRequest::default())
            .await,
    );
    assert_refused(
        "DescribeVolume",
        nobody
            .describe_volume(DescribeVolumeRequest {
                volume_id: id.clone(),
            })
            .await,
    );
    assert_refused(
        "ExportVolume",
        nobody
            .export_volume(ExportVolumeRequest {
                volume_id: id.clone(),
            })
            .await,
    );
    let import = ImportVolumeRequest {
        volume_id: id.clone(),
        replace: true,
        data: vec![0; 4096].into(),
    };
    assert_refused(
        "ImportVolume",
        nobody.import_volume(tokio_stream::iter(vec![import])).await,
    );
    assert_refused(
        "RemoveVolume",
        nobody
            .remove_volume(RemoveVolumeRequest {
                volume_id: id.clone(),
            })
            .await,
    );
    assert_refused(
        "UnfenceVolume",
        nobody
            .unfence_volume(UnfenceVolumeRequest {
                volume_id: id.clone(),
            })
            .await,
    );
    // Nothing of the refused calls happened.
    assert_eq!(
        fs::read(host_path(&volume).join("secret")).unwrap(),
        b"tenant data"
    );

    // Root, on the same socket, is served: listing, and exporting the volume's data.
    let mut root = AdminClient::new(driver.admin_channel().await);
    let listed = root
        .describe_volumes(DescribeVolumesRequest::default())
        .await
        .expect("DescribeVolumes as root")
        .into_inner();
    assert!(listed.volumes.iter().any(|v| v.volume_id == id));
    let mut export = root
        .export_volume(ExportVolumeRequest { volume_id: id })
        .await
        .expect("ExportVolume as root")
        .into_inner();
    let mut messages = 0;
    while export.message().await.expect("the export stream").is_some() {
        messages += 1;
    }
    assert!(messages > 0, "an export carries at least its header");
}

#[tokio::test]
async fn csi_calls_from_a_non_root_caller_in_the_socket_group_are_served() {
    let driver = reachable_driver().await;
    let channel = nobody_channel(&driver.socket).await;
    IdentityClient::new(channel.clone())
        .probe(csi::ProbeRequest {})
        .await
        .expect("Probe as uid 65534");
    let info = NodeClient::new(channel.clone())
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .expect("NodeGetInfo as uid 65534")
        .into_inner();
    assert_eq!(info.node_id, NODE_ID);
    let mut controller = ControllerClient::new(channel);
    let volume = controller
        .create_volume(create_request(
            &new_name(),
            mount_cap(Mode::SingleNodeWriter),
            SIZE,
        ))
        .await
        .expect("CreateVolume as uid 65534")
        .into_inner()
        .volume
        .unwrap();
    controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: volume.volume_id,
            secrets: Default::default(),
        })
        .await
        .expect("DeleteVolume as uid 65534");
}

#[tokio::test]
async fn outside_the_socket_group_a_non_root_process_cannot_even_connect() {
    let driver = reachable_driver().await;
    let err = connect_as_nobody(&driver.socket, &[]).expect_err("connecting as uid 65534");
    assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
}

#[tokio::test]
async fn the_admin_socket_lets_in_its_owner_alone() {
    let driver = reachable_driver().await;
    let meta = fs::symlink_metadata(&driver.admin_socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!((meta.uid(), meta.gid()), (0, 0));
    // Group 0 opens the CSI socket (0660), not this one.
    let err = connect_as_nobody(&driver.admin_socket, &[0]).expect_err("connecting as uid 65534");
    assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
}

/// `stickyvol volumes` as uid 65534 in group 0 (setpriv, util-linux): its exit code, stdout
/// and stderr.
fn volumes_as_nobody(driver: &TestDriver) -> (Option<i32>, Vec<u8>, String) {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--groups=0", "--"])
        .arg(env!("CARGO_BIN_EXE_stickyvol"))
        .arg("volumes")
        .env("ADMIN_SOCKET", &driver.admin_socket)
        .env_remove("RUST_LOG")
        .output()
        .expect("running setpriv (util-linux)");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), out.stdout, stderr)
}

#[tokio::test]
async fn the_admin_commands_tell_a_non_root_user_to_run_them_as_root() {
    let driver = reachable_driver().await;
    // Refused by the socket's mode...
    let (code, stdout, stderr) = volumes_as_nobody(&driver);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("permission denied on") && stderr.contains("run this as root"),
        "{stderr}"
    );
    assert!(stdout.is_empty());
    // ... and, were the mode to let them in, by the driver.
    open_admin_socket_to_all(&driver);
    let (code, stdout, stderr) = volumes_as_nobody(&driver);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("root on the node only") && stderr.contains("uid 65534"),
        "{stderr}"
    );
    assert!(stdout.is_empty());
}

#[tokio::test]
async fn the_csi_socket_does_not_answer_the_admin_api() {
    let driver = TestDriver::start().await;
    let volume = driver.create_fs_volume().await;
    fs::write(host_path(&volume).join("secret"), b"tenant data").unwrap();
    let id = volume.volume_id.clone();
    // Root on the CSI socket: what every sidecar sharing its directory runs as.
    let mut csi_socket = AdminClient::new(driver.channel());
    let unimplemented = |rpc: &str, result: Result<(), Status>| {
        let status = result.expect_err(rpc);
        assert_eq!(status.code(), Code::Unimplemented, "{rpc}: {status:?}");
    };
    unimplemented(
        "DescribeVolumes",
        csi_socket
            .describe_volumes(DescribeVolumesRequest::default())
            .await
            .map(drop),
    );
    unimplemented(
        "DescribeVolume",
        csi_socket
            .describe_volume(DescribeVolumeRequest {
                volume_id: id.clone(),
            })
            .await
            .map(drop),
    );
    unimplemented(
        "ExportVolume",
        csi_socket
            .export_volume(ExportVolumeRequest {
                volume_id: id.clone(),
            })
            .await
            .map(drop),
    );
    let import = ImportVolumeRequest {
        volume_id: id.clone(),
        replace: true,
        data: vec![0; 4096].into(),
    };
    unimplemented(
        "ImportVolume",
        csi_socket
            .import_volume(tokio_stream::iter(vec![import]))
            .await
            .map(drop),
    );
    unimplemented(
        "RemoveVolume",
        csi_socket
            .remove_volume(RemoveVolumeRequest {
                volume_id: id.clone(),
            })
            .await
            .map(drop),
    );
    unimplemented(
        "UnfenceVolume",
        csi_socket
            .unfence_volume(UnfenceVolumeRequest {
                volume_id: id.clone(),
            })
            .await
            .map(drop),
    );
    assert_eq!(
        fs::read(host_path(&volume).join("secret")).unwrap(),
        b"tenant data"
    );
    assert_eq!(driver.listed_ids().await, std::slice::from_ref(&id));

    // The admin socket, as root, answers.
    let described = AdminClient::new(driver.admin_channel().await)
        .describe_volume(DescribeVolumeRequest { volume_id: id })
        .await
        .expect("DescribeVolume on the admin socket")
        .into_inner();
    assert_eq!(described.volume_id, volume.volume_id);
}
