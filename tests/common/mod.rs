//! Integration-test harness: runs the real `stickyvol` binary on a private unix socket and
//! drives it over gRPC, as kubelet and external-provisioner would.
//!
//! Each test gets its own driver and its own directories (a fresh temp dir under /var/tmp, where
//! direct I/O works), so tests run in parallel and in any order. Dropping a [`TestDriver`] kills
//! the driver, unmounts everything under its temp dir, detaches every loop device backed by a
//! file in it and removes it, also when the test panicked (then the driver log is printed).
//!
//! Submodules: `apistub` (a stub Kubernetes API server), `scrape` (HTTP GET and Prometheus text parsing for the metrics server),
//! `fidelity` (a tree with every property a copy must keep, and comparing trees), `doctor` (running `stickyvol doctor` and reading its report), `mounts` (scratch tmpfs mounts
//! with chosen flags and propagation, unmounted on drop), `namespace` (another node on this
//! kernel: a mount namespace where a tmpfs hides a directory we use), `tenant` (a pod's
//! unprivileged user acting in its volume).

// Each test binary uses a different subset of the helpers.
#![allow(dead_code)]

pub mod apistub;
pub mod caps;
pub mod chain;
pub mod doctor;
pub mod fidelity;
pub mod fill;
pub mod mounts;
pub mod namespace;
pub mod scrape;
pub mod scratchfs;
pub mod skip;
pub mod tenant;

use std::collections::HashMap;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::future::Future;
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use scrape::{Exposition, HttpResponse, http_get};
pub use stickyvol::csi;
use stickyvol::csi::controller_client::ControllerClient;
use stickyvol::csi::group_controller_client::GroupControllerClient;
use stickyvol::csi::identity_client::IdentityClient;
use stickyvol::csi::node_client::NodeClient;
pub use stickyvol::csi::volume_capability::access_mode::Mode;
use stickyvol::host::loopdev::{self, LoopDevice};
use stickyvol::host::mountinfo::{self, MountEntry};
use stickyvol::volume::state::id::{NodeTag, VolumeId};
use tempfile::TempDir;
use tonic::transport::Channel;
pub use tonic::{Code, Status};

pub const NODE_ID: &str = "test-node";
pub const DRIVER_NAME: &str = "stickyvol.csi.io";
pub const TOPOLOGY_KEY: &str = "topology.stickyvol.csi.io/node";
pub const HOST_PATH_KEY: &str = "stickyvol.csi.io/host-path";
pub const MIB: i64 = 1 << 20;
/// Size of the volumes tests create unless they care.
pub const SIZE: i64 = 16 * MIB;

/// How long [`TestDriver::create_snapshot_ready`] waits for a snapshot's copy.
pub const SNAPSHOT_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the driver may take to start serving or to stop on SIGTERM.
const START_TIMEOUT: Duration = Duration::from_secs(10);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Fresh ports [`TestDriver::start_with_metrics`] tries when another process takes the one it
/// picked before the driver binds it.
const METRICS_PORT_ATTEMPTS: usize = 5;

/// Environment variables the driver reads as flag defaults: a CI environment must not leak in.
const DRIVER_ENV: &[&str] = &[
    "CSI_ENDPOINT",
    "ADMIN_SOCKET",
    "NODE_ID",
    "KUBELET_DIR",
    "DATA_DIR",
    "DRIVER_NAME",
    "STICKYVOL_MODE",
    "MAX_VOLUMES_PER_NODE",
    "METRICS_ADDRESS",
    "RUN_DIR",
    "POOLS",
    "OPTIONAL_POOLS",
    "ENFORCEMENT",
    "OVERCOMMIT",
    "KUBELET_EVICTION_RESERVE",
    "LOG_FORMAT",
    "RUST_LOG",
];

/// How to start the driver, beyond the flags every test passes.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--mode` (all, controller, node); the driver's default when None.
    pub mode: Option<&'static str>,
    pub max_volumes_per_node: Option<i64>,
    /// RUST_LOG for the driver; "info" when None.
    pub rust_log: Option<&'static str>,
    /// `--metrics-address`; metrics are off when None. [`TestDriver::start_with_metrics`]
    /// picks a free port itself.
    pub metrics_address: Option<SocketAddr>,
    /// More `serve` flags, e.g. `--pool NAME=PATH`.
    pub extra_args: Vec<String>,
    /// `--node-id`; [`NODE_ID`] when None. Lets a test run a second driver as another node
    /// (ids it issues carry that node's tag).
    pub node_id: Option<&'static str>,
    /// Runs the driver in a mount namespace of its own where a fresh tmpfs hides its data dir
    /// (see [`TestDriver::prepare_other_node_at_same_paths`]). Not carried by
    /// [`TestDriver::shell_command`].
    pub data_dir_in_own_namespace: bool,
    /// `KUBECONFIG` for the driver (the Kubernetes API it reads, e.g. a stub); none when None.
    pub kubeconfig: Option<PathBuf>,
    /// The driver's PATH (where it finds mkfs and the grow tools); the test's own plus the
    /// sbin directories, as in the image, when None.
    pub path: Option<String>,
    /// `--kubelet-eviction-reserve` left at its default (10%), as deployed; otherwise 0.
    pub kubelet_reserve_as_deployed: bool,
}

/// A running (or stopped) driver and the directories it works in.
pub struct TestDriver {
    /// Canonical path of the temp dir; everything of this test lives beneath it.
    pub root: PathBuf,
    pub kubelet: PathBuf,
    pub data: PathBuf,
    /// `--run-dir`: where the driver keeps publications (a tmpfs /run in production).
    pub run: PathBuf,
    pub socket: PathBuf,
    /// `--admin-socket` (not passed in controller mode, which serves no admin API).
    pub admin_socket: PathBuf,
    /// The driver's stderr and stdout, appended across restarts.
    pub log: PathBuf,
    options: Options,
    child: Option<Child>,
    channel: Option<Channel>,
    tmp: Option<TempDir>,
}

impl TestDriver {
    /// Starts a driver with the default options.
    pub async fn start() -> TestDriver {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(options: Options) -> TestDriver {
        let mut driver = Self::prepare(options);
        driver.start_again().await;
        driver
    }

    /// Starts a driver that also serves metrics on a free port of 127.0.0.1
    /// ([`TestDriver::metrics_address`]). The port is found by binding port 0 and letting it
    /// go, so another process may take it before the driver binds it: then another port is
    /// tried, in a fresh test directory.
    pub async fn start_with_metrics(options: Options) -> TestDriver {
        Self::start_with_metrics_after(options, |_| ()).await
    }

    /// [`TestDriver::start_with_metrics`], with `plant` run on each fresh test directory before
    /// the driver starts (as [`TestDriver::prepare`] allows).
    pub async fn start_with_metrics_after(
        mut options: Options,
        plant: impl Fn(&TestDriver),
    ) -> TestDriver {
        for _ in 0..METRICS_PORT_ATTEMPTS {
            let address = free_local_address();
            options.metrics_address = Some(address);
            let mut driver = Self::prepare(options.clone());
            plant(&driver);
            let Err(status) = driver.try_start_again().await else {
                return driver;
            };
            let log = driver.log_text();
            if !(log.contains(&format!("metrics address {address}"))
                && log.contains("Address already in use"))
            {
                panic!("stickyvol exited with {status} before serving; log:\n{log}");
            }
            eprintln!("port of {address} taken before the driver bound it; trying another");
        }
        panic!("no free metrics port in {METRICS_PORT_ATTEMPTS} attempts");
    }

    /// Creates the directories (kubelet dir included) but does not start the driver, so a test
    /// can plant files first; then call [`TestDriver::start_again`].
    pub fn prepare(options: Options) -> TestDriver {
        let tmp = tempfile::Builder::new()
            .prefix("stickyvol-test-")
            .tempdir_in("/var/tmp")
            .expect("creating the test directory under /var/tmp");
        let root = tmp.path().canonicalize().expect("resolving the test dir");
        let kubelet = root.join("kubelet");
        fs::create_dir(&kubelet).expect("creating the kubelet dir");
        TestDriver {
            data: root.join("data"),
            run: root.join("run"),
            socket: root.join("csi.sock"),
            admin_socket: root.join("admin").join("admin.sock"),
            log: root.join("driver.log"),
            kubelet,
            root,
            options,
            child: None,
            channel: None,
            tmp: Some(tmp),
        }
    }

    /// A driver for another node (`node_id`) on this kernel, as in every multi-node kind
    /// cluster: its data dir is at the path of `this` driver's, hidden under a tmpfs in its own
    /// mount namespace, so each sees only its own files there while loop devices are shared.
    /// Its other directories are its own. Not started (see [`TestDriver::start_again`]).
    pub fn prepare_other_node_at_same_paths(
        this: &TestDriver,
        node_id: &'static str,
    ) -> TestDriver {
        let mut other = Self::prepare(Options {
            node_id: Some(node_id),
            data_dir_in_own_namespace: true,
            ..Options::default()
        });
        fs::create_dir_all(&this.data).expect("creating the shared data dir path");
        other.data = this.data.clone();
        other
    }

    /// The options the next start uses.
    pub fn options_mut(&mut self) -> &mut Options {
        &mut self.options
    }

    /// Adds `serve` flags for the next start (e.g. pools beneath [`TestDriver::root`]).
    pub fn add_args<I: IntoIterator<Item = S>, S: Into<String>>(&mut self, args: I) {
        self.options
            .extra_args
            .extend(args.into_iter().map(Into::into));
    }

    /// The command that starts a driver on this test's socket and directories.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stickyvol"));
        cmd.arg("serve")
            .arg("--endpoint")
            .arg(format!("unix://{}", self.socket.display()))
            .args(["--node-id", self.node_id()])
            .arg("--kubelet-dir")
            .arg(&self.kubelet)
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--run-dir")
            .arg(&self.run);
        if let Some(mode) = self.options.mode {
            cmd.args(["--mode", mode]);
        }
        if self.options.mode != Some("controller") {
            cmd.arg("--admin-socket").arg(&self.admin_socket);
        }
        if let Some(max) = self.options.max_volumes_per_node {
            cmd.arg("--max-volumes-per-node").arg(max.to_string());
        }
        if let Some(address) = self.options.metrics_address {
            cmd.arg("--metrics-address").arg(address.to_string());
        }
        cmd.args(&self.options.extra_args);
        if self.options.data_dir_in_own_namespace {
            let data = namespace::c_path(&self.data);
            // SAFETY: the hook makes system calls only: no allocation, no lock.
            unsafe {
                cmd.pre_exec(move || namespace::enter_with_tmpfs_at(&data));
            }
        }
        for var in DRIVER_ENV {
            cmd.env_remove(var);
        }
        // The tests' pools share the host's disk with their kubelet directory: with the
        // deployed 10% kept back, whether a test's volumes fit would hang on how full this
        // machine's disk is. Off unless a test asks (a flag given overrides the variable).
        if !self.options.kubelet_reserve_as_deployed {
            cmd.env("KUBELET_EVICTION_RESERVE", "0");
        }
        // Kubernetes credentials only where a test gives them.
        for var in [
            "KUBECONFIG",
            "KUBERNETES_SERVICE_HOST",
            "KUBERNETES_SERVICE_PORT",
        ] {
            cmd.env_remove(var);
        }
        if let Some(kubeconfig) = &self.options.kubeconfig {
            cmd.env("KUBECONFIG", kubeconfig);
        }
        let path = self.options.path.clone().unwrap_or_else(|| {
            format!(
                "{}:/usr/sbin:/sbin",
                std::env::var("PATH").unwrap_or_default()
            )
        });
        cmd.env("PATH", path);
        cmd.env("RUST_LOG", self.options.rust_log.unwrap_or("info"));
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("opening the driver log");
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("duplicating the log fd"))
            .stderr(log);
        cmd
    }

    /// [`TestDriver::command`] as one `sh -c` line (environment, program, flags, log
    /// redirection), for tools that start the driver themselves.
    pub fn shell_command(&self) -> String {
        let command = self.command();
        let mut words = vec!["exec".to_string(), "env".to_string()];
        // env takes its options (-u) before any assignment.
        let mut assignments = Vec::new();
        for (key, value) in command.get_envs() {
            let key = key.to_str().expect("UTF-8 variable names");
            match value {
                None => words.extend(["-u".to_string(), shell_quote(key)]),
                Some(value) => assignments.push(shell_quote(&format!(
                    "{key}={}",
                    value.to_str().expect("UTF-8 values")
                ))),
            }
        }
        words.extend(assignments);
        words.push(shell_quote(
            command.get_program().to_str().expect("UTF-8 program path"),
        ));
        for arg in command.get_args() {
            words.push(shell_quote(arg.to_str().expect("UTF-8 arguments")));
        }
        let log = shell_quote(&path_str(&self.log));
        format!("{} >>{log} 2>&1", words.join(" "))
    }

    /// The `--node-id` this driver runs as.
    pub fn node_id(&self) -> &'static str {
        self.options.node_id.unwrap_or(NODE_ID)
    }

    /// The running driver's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the driver is not running").id()
    }

    /// Starts the driver on the existing directories and waits until it answers Probe.
    pub async fn start_again(&mut self) {
        if let Err(status) = self.try_start_again().await {
            panic!(
                "stickyvol exited with {status} before serving; log:\n{}",
                self.log_text()
            );
        }
    }

    /// [`TestDriver::start_again`], but a driver that exits before serving is an `Err` with its
    /// exit status, not a panic.
    pub async fn try_start_again(&mut self) -> Result<(), ExitStatus> {
        assert!(self.child.is_none(), "the driver is already running");
        let child = self.command().spawn().expect("spawning stickyvol");
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Err(status);
            }
            if let Ok(channel) = connect(&self.socket).await {
                let probe = IdentityClient::new(channel.clone())
                    .probe(csi::ProbeRequest {})
                    .await;
                if probe.is_ok() {
                    self.channel = Some(channel);
                    return Ok(());
                }
            }
            assert!(
                Instant::now() < deadline,
                "stickyvol did not serve on {} within {START_TIMEOUT:?}; log:\n{}",
                self.socket.display(),
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM, then waits for a clean exit (bounded). Clients obtained before are dead after.
    pub async fn stop(&mut self) {
        self.channel = None;
        let mut child = self.child.take().expect("the driver is not running");
        signal(&child, libc::SIGTERM);
        let status = wait_bounded(&mut child, STOP_TIMEOUT).await;
        let Some(status) = status else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "stickyvol did not stop within {STOP_TIMEOUT:?} of SIGTERM; log:\n{}",
                self.log_text()
            );
        };
        assert!(
            status.success(),
            "stickyvol exited with {status} on SIGTERM; log:\n{}",
            self.log_text()
        );
    }

    /// SIGKILL: the driver gets no chance to tidy up (its socket file stays behind).
    pub fn kill9(&mut self) {
        self.channel = None;
        let mut child = self.child.take().expect("the driver is not running");
        child.kill().expect("SIGKILL");
        child.wait().expect("reaping the driver");
    }

    pub async fn restart(&mut self) {
        self.stop().await;
        self.start_again().await;
    }

    pub async fn kill9_and_restart(&mut self) {
        self.kill9();
        self.start_again().await;
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn channel(&self) -> Channel {
        self.channel.clone().expect("the driver is not running")
    }

    pub fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel())
    }

    pub fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel())
    }

    pub fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel())
    }

    pub fn group_controller(&self) -> GroupControllerClient<Channel> {
        GroupControllerClient::new(self.channel())
    }

    /// A channel to the driver's admin socket, as root.
    pub async fn admin_channel(&self) -> Channel {
        connect(&self.admin_socket)
            .await
            .unwrap_or_else(|e| panic!("connecting to {}: {e}", self.admin_socket.display()))
    }

    /// Where the driver serves metrics (started with [`TestDriver::start_with_metrics`]).
    pub fn metrics_address(&self) -> SocketAddr {
        self.options
            .metrics_address
            .expect("the driver was started without --metrics-address")
    }

    /// GET `path` from the driver's metrics server.
    pub fn metrics_get(&self, path: &str) -> HttpResponse {
        http_get(self.metrics_address(), path)
    }

    /// GET /metrics, which must answer 200, parsed.
    pub fn scrape(&self) -> Exposition {
        let response = self.metrics_get("/metrics");
        assert_eq!(response.status, 200, "GET /metrics: {response:?}");
        Exposition::parse(&response.body)
    }

    // ---- requests as external-provisioner and kubelet make them ----

    /// CreateVolume that must succeed.
    pub async fn create(&self, request: csi::CreateVolumeRequest) -> csi::Volume {
        let name = request.name.clone();
        self.controller()
            .create_volume(request)
            .await
            .unwrap_or_else(|s| panic!("CreateVolume {name:?}: {s:?}"))
            .into_inner()
            .volume
            .expect("CreateVolume returned no volume")
    }

    /// A fresh volume of [`SIZE`] with `capability` (which decides filesystem or block).
    pub async fn create_with_capability(&self, capability: csi::VolumeCapability) -> csi::Volume {
        self.create(create_request(&new_name(), capability, SIZE))
            .await
    }

    /// A fresh SINGLE_NODE_WRITER filesystem volume of [`SIZE`].
    pub async fn create_fs_volume(&self) -> csi::Volume {
        self.create_with_capability(mount_cap(Mode::SingleNodeWriter))
            .await
    }

    /// A fresh SINGLE_NODE_WRITER block volume of [`SIZE`].
    /// A fresh SINGLE_NODE_WRITER block volume of [`SIZE`], thin (a sparse file): its class
    /// says so, because on the pools tests use (no directory limits) thick is the default.
    pub async fn create_block_volume(&self) -> csi::Volume {
        let request = create_request(&new_name(), block_cap(Mode::SingleNodeWriter), SIZE);
        self.create(thin(request)).await
    }

    /// A fresh SINGLE_NODE_WRITER filesystem volume of [`SIZE`], published at a new target
    /// ([`TestDriver::publish_at_new_target`]); the volume and its target.
    pub async fn published_fs_volume(&self) -> (csi::Volume, PathBuf) {
        let volume = self.create_fs_volume().await;
        let target = self
            .publish_at_new_target(&volume, mount_cap(Mode::SingleNodeWriter))
            .await;
        (volume, target)
    }

    /// A fresh SINGLE_NODE_WRITER block volume of [`SIZE`], published at a new target
    /// ([`TestDriver::publish_at_new_target`]); the volume and its target.
    pub async fn published_block_volume(&self) -> (csi::Volume, PathBuf) {
        let volume = self.create_block_volume().await;
        let target = self
            .publish_at_new_target(&volume, block_cap(Mode::SingleNodeWriter))
            .await;
        (volume, target)
    }

    /// CreateVolume as the provisioner retries it: again while ABORTED, then it must succeed.
    pub async fn create_retrying(&self, request: &csi::CreateVolumeRequest) -> csi::Volume {
        retry_aborted(|| {
            let mut client = self.controller();
            let request = request.clone();
            async move { client.create_volume(request).await }
        })
        .await
        .unwrap_or_else(|s| panic!("CreateVolume {:?}: {s:?}", request.name))
        .into_inner()
        .volume
        .expect("CreateVolume returned no volume")
    }

    pub async fn delete(&self, volume_id: &str) -> Result<(), Status> {
        self.controller()
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: volume_id.into(),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    /// ControllerGetVolume.
    pub async fn get_volume(
        &self,
        volume_id: &str,
    ) -> Result<csi::ControllerGetVolumeResponse, Status> {
        self.controller()
            .controller_get_volume(csi::ControllerGetVolumeRequest {
                volume_id: volume_id.into(),
            })
            .await
            .map(tonic::Response::into_inner)
    }

    /// The capacity ControllerGetVolume reports for a volume that must exist.
    /// GetCapacity's answer (panics on an error status).
    pub async fn get_capacity(&self, request: csi::GetCapacityRequest) -> csi::GetCapacityResponse {
        self.controller()
            .get_capacity(request)
            .await
            .expect("GetCapacity")
            .into_inner()
    }

    /// What GetCapacity offers for StorageClass `parameters` and `capability` on this node.
    pub async fn available_capacity(
        &self,
        parameters: &[(&str, &str)],
        capability: csi::VolumeCapability,
    ) -> i64 {
        self.get_capacity(csi::GetCapacityRequest {
            volume_capabilities: vec![capability],
            parameters: params(parameters),
            accessible_topology: Some(topology(NODE_ID)),
        })
        .await
        .available_capacity
    }

    /// The volume_condition ControllerGetVolume reports (panics on an error status).
    pub async fn condition_of(&self, volume_id: &str) -> csi::VolumeCondition {
        self.get_volume(volume_id)
            .await
            .unwrap_or_else(|s| panic!("ControllerGetVolume {volume_id}: {s:?}"))
            .status
            .expect("status")
            .volume_condition
            .expect("volume_condition")
    }

    pub async fn capacity_of(&self, volume_id: &str) -> i64 {
        self.get_volume(volume_id)
            .await
            .unwrap_or_else(|s| panic!("ControllerGetVolume {volume_id}: {s:?}"))
            .volume
            .expect("ControllerGetVolume returned no volume")
            .capacity_bytes
    }

    /// NodeExpandVolume; the capacity it answers.
    pub async fn expand(&self, request: csi::NodeExpandVolumeRequest) -> Result<i64, Status> {
        self.node()
            .node_expand_volume(request)
            .await
            .map(|r| r.into_inner().capacity_bytes)
    }

    /// Every volume, in one ListVolumes call.
    /// Every volume id ListVolumes returns, sorted.
    pub async fn listed_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .list_all()
            .await
            .into_iter()
            .filter_map(|e| e.volume.map(|v| v.volume_id))
            .collect();
        ids.sort();
        ids
    }

    pub async fn list_all(&self) -> Vec<csi::list_volumes_response::Entry> {
        let response = self
            .controller()
            .list_volumes(csi::ListVolumesRequest::default())
            .await
            .expect("ListVolumes")
            .into_inner();
        assert!(
            response.next_token.is_empty(),
            "next_token set without max_entries"
        );
        response.entries
    }

    // ---- snapshots, as csi-snapshotter calls them ----

    /// CreateSnapshot; the snapshot it answers (ready or not).
    pub async fn create_snapshot(
        &self,
        request: csi::CreateSnapshotRequest,
    ) -> Result<csi::Snapshot, Status> {
        self.controller().create_snapshot(request).await.map(|r| {
            r.into_inner()
                .snapshot
                .expect("CreateSnapshot returned no snapshot")
        })
    }

    /// CreateSnapshot as csi-snapshotter repeats it: again (same request) while the answer is
    /// not ready or ABORTED, until ready (panics after [`SNAPSHOT_READY_TIMEOUT`] or on any
    /// other error). Every answer must carry the first answer's snapshot id.
    pub async fn create_snapshot_ready(
        &self,
        request: &csi::CreateSnapshotRequest,
    ) -> csi::Snapshot {
        let deadline = Instant::now() + SNAPSHOT_READY_TIMEOUT;
        let mut first_id: Option<String> = None;
        loop {
            match self.create_snapshot(request.clone()).await {
                Ok(snapshot) => {
                    let first = first_id.get_or_insert_with(|| snapshot.snapshot_id.clone());
                    assert_eq!(
                        &snapshot.snapshot_id, first,
                        "CreateSnapshot {:?} changed its snapshot id",
                        request.name
                    );
                    if snapshot.ready_to_use {
                        return snapshot;
                    }
                }
                Err(status) if status.code() == Code::Aborted => {}
                Err(status) => panic!("CreateSnapshot {:?}: {status:?}", request.name),
            }
            assert!(
                Instant::now() < deadline,
                "snapshot {:?} not ready within {SNAPSHOT_READY_TIMEOUT:?}",
                request.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A ready snapshot of `volume_id` under a fresh name ([`snapshot_request`]).
    pub async fn snapshot_of(&self, volume_id: &str) -> csi::Snapshot {
        self.create_snapshot_ready(&snapshot_request(&new_snapshot_name(), volume_id))
            .await
    }

    pub async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), Status> {
        self.controller()
            .delete_snapshot(csi::DeleteSnapshotRequest {
                snapshot_id: snapshot_id.into(),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    pub async fn list_snapshots(
        &self,
        request: csi::ListSnapshotsRequest,
    ) -> Result<csi::ListSnapshotsResponse, Status> {
        self.controller()
            .list_snapshots(request)
            .await
            .map(tonic::Response::into_inner)
    }

    /// Every snapshot, in one ListSnapshots call.
    pub async fn list_all_snapshots(&self) -> Vec<csi::Snapshot> {
        let response = self
            .list_snapshots(csi::ListSnapshotsRequest::default())
            .await
            .expect("ListSnapshots");
        assert!(
            response.next_token.is_empty(),
            "next_token set without max_entries"
        );
        response
            .entries
            .into_iter()
            .map(|e| e.snapshot.expect("ListSnapshots entry without snapshot"))
            .collect()
    }

    /// Asserts that one ListVolumes call reports each of `volumes` as published on exactly
    /// `nodes`.
    pub async fn assert_published_on(&self, volumes: &[&csi::Volume], nodes: &[&str]) {
        let entries = self.list_all().await;
        for volume in volumes {
            assert_eq!(
                published_nodes(&entries, &volume.volume_id),
                nodes,
                "published_node_ids of {}",
                volume.volume_id
            );
        }
    }

    /// A filesystem target as kubelet makes it: the parent exists, `…/mount` does not.
    pub fn mount_target(&self) -> PathBuf {
        let parent = self
            .kubelet
            .join("pods")
            .join(uuid::Uuid::now_v7().to_string())
            .join("volumes/kubernetes.io~csi")
            .join(new_name());
        fs::create_dir_all(&parent).expect("creating the target's parent");
        parent.join("mount")
    }

    /// A block target as kubelet makes it: the parent exists, the target does not.
    pub fn block_target(&self) -> PathBuf {
        let parent = self
            .kubelet
            .join("plugins/kubernetes.io/csi/volumeDevices/publish")
            .join(new_name());
        fs::create_dir_all(&parent).expect("creating the target's parent");
        parent.join(uuid::Uuid::now_v7().to_string())
    }

    /// A new target of the kind `capability` asks for: [`TestDriver::block_target`] for block
    /// access, [`TestDriver::mount_target`] otherwise.
    pub fn target_for(&self, capability: &csi::VolumeCapability) -> PathBuf {
        match capability.access_type {
            Some(csi::volume_capability::AccessType::Block(_)) => self.block_target(),
            _ => self.mount_target(),
        }
    }

    /// [`TestDriver::publish_ok`] at a new target ([`TestDriver::target_for`]); the target.
    pub async fn publish_at_new_target(
        &self,
        volume: &csi::Volume,
        capability: csi::VolumeCapability,
    ) -> PathBuf {
        let target = self.target_for(&capability);
        self.publish_ok(volume, &target, capability).await;
        target
    }

    /// NodePublishVolume as kubelet sends it for a pod that did not ask for read-only (the
    /// access mode may still make it read-only), which must succeed.
    pub async fn publish_ok(
        &self,
        volume: &csi::Volume,
        target: &Path,
        capability: csi::VolumeCapability,
    ) {
        self.publish(volume, target, capability, false)
            .await
            .unwrap_or_else(|s| {
                panic!(
                    "NodePublishVolume {} at {}: {s:?}",
                    volume.volume_id,
                    target.display()
                )
            });
    }

    pub async fn publish(
        &self,
        volume: &csi::Volume,
        target: &Path,
        capability: csi::VolumeCapability,
        readonly: bool,
    ) -> Result<(), Status> {
        self.node()
            .node_publish_volume(publish_request(volume, target, capability, readonly))
            .await
            .map(drop)
    }

    /// A fresh per-volume staging path as kubelet makes one:
    /// `plugins/kubernetes.io/csi/<driver>/<hash>/globalmount`, created.
    pub fn staging_path(&self) -> PathBuf {
        let dir = self
            .kubelet
            .join("plugins/kubernetes.io/csi/stickyvol.csi.io")
            .join(uuid::Uuid::now_v7().simple().to_string())
            .join("globalmount");
        fs::create_dir_all(&dir).expect("creating a staging path");
        dir
    }

    /// NodeStageVolume of `volume` at `staging`, as kubelet sends it (volume_context from
    /// CreateVolume).
    pub async fn stage(
        &self,
        volume: &csi::Volume,
        staging: &Path,
        cap: csi::VolumeCapability,
    ) -> Result<(), Status> {
        self.node()
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: volume.volume_id.clone(),
                staging_target_path: path_str(staging),
                volume_capability: Some(cap),
                volume_context: volume.volume_context.clone(),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    /// NodeUnstageVolume of `volume_id` at `staging`.
    pub async fn unstage(&self, volume_id: &str, staging: &Path) -> Result<(), Status> {
        self.node()
            .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: volume_id.to_string(),
                staging_target_path: path_str(staging),
            })
            .await
            .map(drop)
    }

    /// NodeUnpublishVolume, which must succeed: retried for up to 3 s while it answers
    /// UNAVAILABLE, as kubelet retries it. (An unmount is refused with EBUSY while any process
    /// holds a file in the mount. Seen once, under load, right after a test wrote through the
    /// mount: most likely a driver another test was starting held copies of this process's
    /// descriptors between its fork and its exec.)
    pub async fn unpublish_ok(&self, volume: &csi::Volume, target: &Path) {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            match self.unpublish(&volume.volume_id, target).await {
                Ok(()) => return,
                Err(s) if s.code() == Code::Unavailable && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(s) => panic!(
                    "NodeUnpublishVolume {} at {}: {s:?}",
                    volume.volume_id,
                    target.display()
                ),
            }
        }
    }

    pub async fn unpublish(&self, volume_id: &str, target: &Path) -> Result<(), Status> {
        self.node()
            .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: volume_id.into(),
                target_path: path_str(target),
            })
            .await
            .map(drop)
    }

    pub async fn stats(
        &self,
        volume_id: &str,
        path: &str,
    ) -> Result<csi::NodeGetVolumeStatsResponse, Status> {
        self.node()
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: volume_id.into(),
                volume_path: path.into(),
                staging_target_path: String::new(),
            })
            .await
            .map(tonic::Response::into_inner)
    }

    /// `volumes/` under the data dir: one entry per volume's data.
    pub fn data_entries(&self) -> Vec<String> {
        dir_names(&self.data.join("volumes"))
    }

    /// `state/` under the data dir: one record per volume (plus leftovers), and the snapshot
    /// records of `state/snapshots/` as `snapshots/<name>`. At rest: a running driver is
    /// restarted first, because record files lag the journal until a compaction, and a clean
    /// stop writes every record back.
    pub async fn state_entries(&mut self) -> Vec<String> {
        if self.child.is_some() {
            self.restart().await;
        }
        let state = self.data.join("state");
        let records_of = |dir: &'static str| {
            dir_names(&state.join(dir))
                .into_iter()
                .map(move |name| format!("{dir}/{name}"))
        };
        // `journal/` holds the journal of record changes, not records.
        dir_names(&state)
            .into_iter()
            .filter(|name| !["snapshots", "groups", "journal"].contains(&name.as_str()))
            .chain(records_of("snapshots"))
            .chain(records_of("groups"))
            .collect()
    }

    /// Mount points at or under this test's directory.
    pub fn mounts_left(&self) -> Vec<PathBuf> {
        let entries = mountinfo::read_self().expect("reading mountinfo");
        mountinfo::mounts_at_or_under(&entries, &self.root)
            .map(|e| e.mount_point.clone())
            .collect()
    }

    /// Loop devices backed by a file under this test's directory.
    pub fn loop_devices_left(&self) -> Vec<LoopDevice> {
        loopdev::list_attached()
            .expect("listing loop devices")
            .into_iter()
            .filter(|(_, file)| file.starts_with(&self.root))
            .map(|(device, _)| device)
            .collect()
    }

    /// Unmounts, detaches and removes everything of this test. Idempotent.
    fn cleanup(&mut self) {
        self.channel = None;
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let mut clean = true;
        match mountinfo::read_self() {
            Ok(entries) => {
                let mut ours: Vec<PathBuf> = mountinfo::mounts_at_or_under(&entries, &self.root)
                    .map(|e| e.mount_point.clone())
                    .collect();
                // Deepest first; a stacked mount point appears once per layer.
                ours.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
                for mount_point in ours {
                    if let Err(err) = unmount(&mount_point) {
                        eprintln!("cleanup: unmounting {}: {err}", mount_point.display());
                        clean = false;
                    }
                }
            }
            Err(err) => {
                eprintln!("cleanup: reading mountinfo: {err}");
                clean = false;
            }
        }
        match loopdev::list_attached() {
            Ok(attached) => {
                for (device, file) in attached {
                    if !file.starts_with(&self.root) {
                        continue;
                    }
                    if let Err(err) = loopdev::detach(&device) {
                        eprintln!("cleanup: detaching {}: {err}", device.name());
                    }
                }
            }
            Err(err) => eprintln!("cleanup: listing loop devices: {err}"),
        }
        if let Some(tmp) = self.tmp.take() {
            if clean {
                drop(tmp);
            } else {
                // Never recurse into something still mounted: leave it for a human.
                eprintln!("cleanup: leaving {} in place", tmp.keep().display());
            }
        }
    }
}

impl Drop for TestDriver {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- stickyvol log ({}) ----\n{}---- end of log ----",
                self.log.display(),
                self.log_text()
            );
        }
        self.cleanup();
    }
}

/// Whether a driver serves on `socket`: Probe answers there (a connect alone succeeds as soon as
/// the socket is in place, before the driver has finished starting).
pub async fn probe_answers(socket: &Path) -> bool {
    let Ok(channel) = connect(socket).await else {
        return false;
    };
    IdentityClient::new(channel)
        .probe(csi::ProbeRequest {})
        .await
        .is_ok()
}

async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    stickyvol::unix_channel::connect(socket, None).await
}

fn signal(child: &Child, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
    // SAFETY: kill(2) on our own, not yet reaped, child.
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(rc, 0, "kill({pid}, {signal})");
}

/// Waits for `child` to exit, at most `timeout`, without blocking the async runtime.
pub async fn wait_bounded(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for a child") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `word` in single quotes for sh.
pub fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

fn unmount(path: &Path) -> nix::Result<()> {
    use nix::mount::{MntFlags, umount2};
    umount2(path, MntFlags::empty()).or_else(|_| umount2(path, MntFlags::MNT_DETACH))
}

/// Names in `dir`, sorted (none when it does not exist).
pub fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(err) => panic!("listing {}: {err}", dir.display()),
    };
    names.sort();
    names
}

// ---- request builders ----

/// StorageClass parameters from pairs.
pub fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A PV-like name, unique across tests.
pub fn new_name() -> String {
    format!("pvc-{}", uuid::Uuid::now_v7())
}

pub fn access_mode(mode: Mode) -> Option<csi::volume_capability::AccessMode> {
    Some(csi::volume_capability::AccessMode { mode: mode as i32 })
}

pub fn mount_cap(mode: Mode) -> csi::VolumeCapability {
    mount_cap_with_flags(mode, &[])
}

pub fn mount_cap_with_flags(mode: Mode, flags: &[&str]) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: String::new(),
                mount_flags: flags.iter().map(|f| f.to_string()).collect(),
                volume_mount_group: String::new(),
            },
        )),
        access_mode: access_mode(mode),
    }
}

pub fn block_cap(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Block(
            csi::volume_capability::BlockVolume {},
        )),
        access_mode: access_mode(mode),
    }
}

/// NodeExpandVolume as kubelet sends it: the volume as published at `volume_path`, the new size.
pub fn expand_request(
    volume_id: &str,
    volume_path: &Path,
    required_bytes: i64,
    limit_bytes: i64,
) -> csi::NodeExpandVolumeRequest {
    csi::NodeExpandVolumeRequest {
        volume_id: volume_id.into(),
        volume_path: path_str(volume_path),
        capacity_range: Some(csi::CapacityRange {
            required_bytes,
            limit_bytes,
        }),
        ..Default::default()
    }
}

/// `request` with `blockAllocation: thin`: a sparse block or image file whatever the pool's
/// default (thick on a pool that cannot limit directories, as the test pools are).
pub fn thin(mut request: csi::CreateVolumeRequest) -> csi::CreateVolumeRequest {
    request
        .parameters
        .insert("blockAllocation".into(), "thin".into());
    request
}

/// An absolute time bound meant for real hardware (livenessprobe's 1 s for Probe, say), times
/// `STICKYVOL_TEST_TIME_SCALE` on a machine that runs everything that much slower: the
/// project's VM sets it under software emulation (tests/vm/init), where the same work takes
/// 10 to 30 times as long. Bounds relative to a measured call need no scaling.
pub fn on_this_machine(bound: Duration) -> Duration {
    let scale = std::env::var("STICKYVOL_TEST_TIME_SCALE")
        .ok()
        .and_then(|text| text.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1);
    bound * scale
}

/// CreateVolume as external-provisioner sends it: name, one capability, required bytes.
pub fn create_request(
    name: &str,
    capability: csi::VolumeCapability,
    required_bytes: i64,
) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability],
        ..Default::default()
    }
}

/// A VolumeSnapshotContent-like name, unique across tests.
/// Waits until `done` holds, checking every 50 ms; panics naming `what` after 30 s. For work
/// the driver does in the background once it serves (e.g. removing what a crash left).
pub async fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "not within 30 s: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn new_snapshot_name() -> String {
    format!("snapshot-{}", uuid::Uuid::now_v7())
}

/// CreateSnapshot as csi-snapshotter sends it: name and source, no parameters.
pub fn snapshot_request(name: &str, source_volume_id: &str) -> csi::CreateSnapshotRequest {
    csi::CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: source_volume_id.into(),
        ..Default::default()
    }
}

/// A volume_content_source restoring snapshot `snapshot_id`.
pub fn from_snapshot(snapshot_id: &str) -> csi::VolumeContentSource {
    use csi::volume_content_source::{SnapshotSource, Type};
    csi::VolumeContentSource {
        r#type: Some(Type::Snapshot(SnapshotSource {
            snapshot_id: snapshot_id.into(),
        })),
    }
}

/// A volume_content_source cloning volume `volume_id`.
pub fn from_volume(volume_id: &str) -> csi::VolumeContentSource {
    use csi::volume_content_source::{Type, VolumeSource};
    csi::VolumeContentSource {
        r#type: Some(Type::Volume(VolumeSource {
            volume_id: volume_id.into(),
        })),
    }
}

/// NodePublishVolume as kubelet sends it (volume_context from CreateVolume).
pub fn publish_request(
    volume: &csi::Volume,
    target: &Path,
    capability: csi::VolumeCapability,
    readonly: bool,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        target_path: path_str(target),
        volume_capability: Some(capability),
        readonly,
        volume_context: volume.volume_context.clone(),
        ..Default::default()
    }
}

pub fn topology(node: &str) -> csi::Topology {
    csi::Topology {
        segments: HashMap::from([(TOPOLOGY_KEY.to_string(), node.to_string())]),
    }
}

pub fn path_str(path: &Path) -> String {
    path.to_str().expect("test paths are UTF-8").to_string()
}

/// A well-formed id of this test node that no driver ever issued.
pub fn unknown_volume_id() -> String {
    VolumeId::generate(&NodeTag::of(NODE_ID)).to_string()
}

// ---- assertions and host inspection ----

/// The error of `result`, which must carry `code`.
#[track_caller]
pub fn expect_code<T: Debug>(result: Result<T, Status>, code: Code) -> Status {
    match result {
        Ok(value) => panic!("expected {code:?}, got Ok({value:?})"),
        Err(status) => {
            assert_eq!(status.code(), code, "unexpected status: {status:?}");
            status
        }
    }
}

/// Retries `op` while it answers ABORTED (another operation on the same volume is running).
pub async fn retry_aborted<T, F, Fut>(mut op: F) -> Result<T, Status>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    for _ in 0..500 {
        match op().await {
            Err(status) if status.code() == Code::Aborted => {
                tokio::time::sleep(Duration::from_millis(5)).await
            }
            other => return other,
        }
    }
    panic!("still ABORTED after 500 attempts")
}

/// `status.published_node_ids` of volume `id` in a ListVolumes answer.
pub fn published_nodes(entries: &[csi::list_volumes_response::Entry], id: &str) -> Vec<String> {
    entries
        .iter()
        .find(|e| e.volume.as_ref().is_some_and(|v| v.volume_id == id))
        .unwrap_or_else(|| panic!("{id} not listed"))
        .status
        .clone()
        .expect("ListVolumes entry without status")
        .published_node_ids
}

/// A driver whose pool "fast" is on a fresh btrfs with quota (`--enforcement fast=btrfs`).
/// Field order matters: the driver (and its mounts) goes before the filesystem.
pub struct BtrfsDriver {
    pub driver: TestDriver,
    pub pool: PathBuf,
    pub _fs: scratchfs::ScratchFs,
}

pub async fn start_on_btrfs() -> BtrfsDriver {
    // Not a skip: CI installs btrfs-progs, and a silently skipped test proves nothing.
    let fs = scratchfs::ScratchFs::new("btrfs", 1 << 30, &["-q"], "");
    let pool = fs.mount_point.join("pool");
    let mut driver = TestDriver::prepare(Options::default());
    driver.add_args([
        "--pool".to_string(),
        format!("fast={}", pool.display()),
        "--enforcement".to_string(),
        "fast=btrfs".to_string(),
    ]);
    driver.start_again().await;
    BtrfsDriver {
        driver,
        pool,
        _fs: fs,
    }
}

/// Where the volume's data lives on the host, from its volume_context.
pub fn host_path(volume: &csi::Volume) -> PathBuf {
    PathBuf::from(
        volume
            .volume_context
            .get(HOST_PATH_KEY)
            .unwrap_or_else(|| panic!("no {HOST_PATH_KEY} in {:?}", volume.volume_context)),
    )
}

/// The mountinfo entries whose mount point is exactly `path` (one per stacked mount).
pub fn mounts_at(path: &Path) -> Vec<MountEntry> {
    mountinfo::read_self()
        .expect("reading mountinfo")
        .into_iter()
        .filter(|e| e.mount_point == path)
        .collect()
}

/// Whether the mount's per-mount options include `option` (e.g. "ro", "noexec").
pub fn has_option(entry: &MountEntry, option: &str) -> bool {
    entry.mount_options.split(',').any(|o| o == option)
}

/// Loop devices whose backing file is `file`.
pub fn loop_devices_of(file: &Path) -> Vec<LoopDevice> {
    loopdev::list_attached()
        .expect("listing loop devices")
        .into_iter()
        .filter(|(_, backing)| backing == file)
        .map(|(device, _)| device)
        .collect()
}

/// The loop device a block target links to.
pub fn linked_device(target: &Path) -> LoopDevice {
    let link = fs::read_link(target)
        .unwrap_or_else(|e| panic!("{} is not a symlink: {e}", target.display()));
    LoopDevice::from_path(&link)
        .unwrap_or_else(|| panic!("{} links to {}", target.display(), link.display()))
}

pub fn exists_no_follow(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok()
}

/// Writes `bytes` in 1 MiB chunks (each synced) into a new file; returns how much went in and
/// the error that stopped it, if any.
pub fn fill(path: &Path, bytes: i64) -> (i64, Option<std::io::Error>) {
    let mut file = File::create(path).unwrap();
    let chunk = pattern(MIB as usize, 7);
    let mut written = 0;
    while written < bytes {
        if let Err(err) = file.write_all(&chunk).and_then(|()| file.sync_data()) {
            return (written, Some(err));
        }
        written += MIB;
    }
    (written, None)
}

/// Writing stopped with EDQUOT (or ENOSPC) once `total` bytes were in, within `slack` below
/// the volume's `limit`.
#[track_caller]
pub fn assert_stopped_at_limit(err: Option<std::io::Error>, total: i64, limit: i64, slack: i64) {
    let err = err.unwrap_or_else(|| panic!("{total} bytes fit in a volume of {limit}"));
    assert!(
        matches!(err.raw_os_error(), Some(libc::EDQUOT) | Some(libc::ENOSPC)),
        "writing past the size failed with {err}, not EDQUOT/ENOSPC"
    );
    assert!(
        total <= limit && total >= limit - slack,
        "stopped after {total} bytes, limit {limit}"
    );
}

/// A deterministic pattern, different for each `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

const DIRECT_IO_ALIGN: usize = 4096;

/// Writes `data` at offset 0 of a block device with O_DIRECT, then fsyncs.
pub fn write_direct(device: &Path, data: &[u8]) {
    write_direct_at(device, 0, data);
}

/// Writes `data` at `offset` (a multiple of 4096) of a block device with O_DIRECT, then fsyncs.
pub fn write_direct_at(device: &Path, offset: u64, data: &[u8]) {
    let mut storage = vec![0u8; data.len() + DIRECT_IO_ALIGN];
    let start = storage.as_ptr().align_offset(DIRECT_IO_ALIGN);
    let buf = &mut storage[start..start + data.len()];
    buf.copy_from_slice(data);
    let file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(device)
        .unwrap_or_else(|e| panic!("opening {} for direct writes: {e}", device.display()));
    file.write_all_at(buf, offset)
        .unwrap_or_else(|e| panic!("direct write at {offset} of {}: {e}", device.display()));
    file.sync_all().expect("fsync");
}

/// Reads `len` bytes at offset 0 of a block device with O_DIRECT.
pub fn read_direct(device: &Path, len: usize) -> Vec<u8> {
    read_direct_at(device, 0, len)
}

/// Reads `len` bytes at `offset` (a multiple of 4096) of a block device with O_DIRECT.
pub fn read_direct_at(device: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut storage = vec![0u8; len + DIRECT_IO_ALIGN];
    let start = storage.as_ptr().align_offset(DIRECT_IO_ALIGN);
    let buf = &mut storage[start..start + len];
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(device)
        .unwrap_or_else(|e| panic!("opening {} for direct reads: {e}", device.display()));
    file.read_exact_at(buf, offset)
        .unwrap_or_else(|e| panic!("direct read at {offset} of {}: {e}", device.display()));
    buf.to_vec()
}

/// The first `len` bytes of a file.
pub fn read_prefix(path: &Path, len: usize) -> Vec<u8> {
    read_at(path, 0, len)
}

/// `len` bytes at `offset` of a file.
pub fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    File::open(path)
        .and_then(|f| f.read_exact_at(&mut buf, offset))
        .unwrap_or_else(|e| panic!("reading {len} bytes at {offset} of {}: {e}", path.display()));
    buf
}

/// The size a block device exposes, as the kernel reports it: /sys/block/<name>/size × 512.
pub fn sysfs_size_bytes(device: &LoopDevice) -> u64 {
    let attribute = Path::new("/sys/block").join(device.name()).join("size");
    let sectors: u64 = fs::read_to_string(&attribute)
        .unwrap_or_else(|e| panic!("reading {}: {e}", attribute.display()))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", attribute.display()));
    sectors * 512
}

/// A 127.0.0.1 address with a port that was free a moment ago (bound to port 0, released).
pub fn free_local_address() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("binding 127.0.0.1:0")
}

fn statvfs(path: &Path) -> nix::sys::statvfs::Statvfs {
    nix::sys::statvfs::statvfs(path).unwrap_or_else(|e| panic!("statvfs {}: {e}", path.display()))
}

/// Free space of the filesystem holding `path`, as statvfs reports it to unprivileged writers.
pub fn available_bytes(path: &Path) -> u64 {
    let st = statvfs(path);
    st.blocks_available() * st.fragment_size()
}

/// Size of the filesystem holding `path`: no amount of freeing makes more space than this.
pub fn filesystem_bytes(path: &Path) -> u64 {
    let st = statvfs(path);
    st.blocks() * st.fragment_size()
}

/// Writes a file and makes it durable, so allocation shows in statx.
pub fn write_synced(path: &Path, data: &[u8]) {
    let mut file =
        File::create(path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
    file.write_all(data).expect("write");
    file.sync_all().expect("fsync");
}

/// The error a write past a project's hard limit gets: XFS answers ENOSPC for project quota
/// (the project's directory tree looks like a full filesystem, as df shows it), ext4 (the VFS
/// quota code) EDQUOT.
pub fn over_project_limit_errno(fs_type: &str) -> i32 {
    match fs_type {
        "xfs" => libc::ENOSPC,
        _ => libc::EDQUOT,
    }
}

/// fallocate(2) with mode 0: allocates (and extends to) `offset + len`.
pub fn fallocate(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on an open fd.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, offset as i64, len as i64) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Usage entries by unit.
pub fn usage_of(
    response: &csi::NodeGetVolumeStatsResponse,
    unit: csi::volume_usage::Unit,
) -> Option<csi::VolumeUsage> {
    response
        .usage
        .iter()
        .find(|u| u.unit == unit as i32)
        .copied()
}

// ---- image volumes, staged and published as kubelet does ----

pub fn image_cap(fs: &str, mode: Mode) -> csi::VolumeCapability {
    let mut cap = mount_cap(mode);
    if let Some(csi::volume_capability::AccessType::Mount(mount)) = &mut cap.access_type {
        mount.fs_type = fs.to_string();
    }
    cap
}

/// Publishes with the staging path, as kubelet does for a driver that stages.
pub async fn publish(
    driver: &TestDriver,
    volume: &csi::Volume,
    staging: &Path,
    cap: csi::VolumeCapability,
) -> Result<PathBuf, tonic::Status> {
    let target = driver.mount_target();
    let mut request = publish_request(volume, &target, cap, false);
    request.staging_target_path = path_str(staging);
    driver.node().node_publish_volume(request).await?;
    Ok(target)
}

/// A staged and published thin image volume of `bytes`: the volume, its staging path and its
/// pod target.
pub async fn published_image(
    driver: &TestDriver,
    cap: csi::VolumeCapability,
    bytes: i64,
) -> (csi::Volume, PathBuf, PathBuf) {
    let request = thin(create_request(&new_name(), cap.clone(), bytes));
    staged_and_published(driver, request, cap).await
}

/// The volume `request` makes, staged and published with `cap` as kubelet does: the volume,
/// its staging path and its pod target.
pub async fn staged_and_published(
    driver: &TestDriver,
    request: csi::CreateVolumeRequest,
    cap: csi::VolumeCapability,
) -> (csi::Volume, PathBuf, PathBuf) {
    let volume = driver.create(request).await;
    let staging = driver.staging_path();
    driver
        .stage(&volume, &staging, cap.clone())
        .await
        .expect("NodeStageVolume");
    let target = publish(driver, &volume, &staging, cap)
        .await
        .expect("NodePublishVolume");
    (volume, staging, target)
}

pub async fn tear_down(
    driver: &TestDriver,
    volume: &csi::Volume,
    staging: &Path,
    targets: &[&Path],
) {
    for target in targets {
        driver.unpublish_ok(volume, target).await;
    }
    driver
        .unstage(&volume.volume_id, staging)
        .await
        .expect("NodeUnstageVolume");
    driver
        .delete(&volume.volume_id)
        .await
        .expect("DeleteVolume");
}

/// A driver whose default pool is on a scratch XFS with reflinks, where a snapshot or clone of
/// a staged image freezes it only for an instant (a pool that copies data refuses them).
pub async fn on_reflink_xfs() -> (scratchfs::ScratchFs, TestDriver) {
    on_reflink_xfs_of(1 << 30).await
}

/// The same, the scratch XFS `bytes` big (a sparse file).
pub async fn on_reflink_xfs_of(bytes: u64) -> (scratchfs::ScratchFs, TestDriver) {
    let fs = scratchfs::ScratchFs::new("xfs", bytes, &["-q", "-m", "reflink=1"], "");
    let mut driver = TestDriver::prepare(Options::default());
    driver.data = fs.mount_point.join("data");
    driver.start_again().await;
    (fs, driver)
}
