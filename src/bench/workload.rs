//! The workloads: `lifecycle` (full volume cycles, as provisioner + kubelet make them) and
//! `startup` (time to ready with many volumes on disk). Every volume we create is deleted again
//! (unless `--keep-preload`), also after a failed step.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use stickyvol::csi;
use tokio::task::JoinSet;
use tonic::Code;

use crate::cli::{AccessType, Common, LifecycleArgs, StartupArgs};
use crate::client::{self, Csi, DriverInfo, timed};
use crate::driver_process::{DriverProcess, status_kib};
use crate::paths::{KubeletLayout, MadeDirs};
use crate::report::{Memory, Phase, Recorder, Rpc, RpcSummary, median};

/// How long a started driver may take to answer Probe with ready.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Parallel calls for the preload and the final cleanup, at least.
const BULK_WIDTH: usize = 8;

/// A failure that stops the benchmark before or outside the measured calls.
pub type Fatal = String;

/// What every call needs: the clients, what the driver advertised, where kubelet's paths are.
pub(crate) struct Target {
    pub(crate) csi: Csi,
    pub(crate) info: DriverInfo,
    pub(crate) layout: KubeletLayout,
    access: AccessType,
    size: i64,
    fs_type: String,
    parameters: HashMap<String, String>,
    /// Prefix of every volume name of this run.
    pub(crate) run_id: String,
}

impl Target {
    /// The same target reached through `csi` (the driver started again).
    fn with_csi(&self, csi: Csi) -> Target {
        Target {
            csi,
            info: self.info.clone(),
            layout: self.layout.clone(),
            access: self.access,
            size: self.size,
            fs_type: self.fs_type.clone(),
            parameters: self.parameters.clone(),
            run_id: self.run_id.clone(),
        }
    }

    /// Volumes made from now on get `fs_type` (empty: the driver's default).
    pub(crate) fn set_fs_type(&mut self, fs_type: &str) {
        self.fs_type = fs_type.to_string();
    }

    /// Volumes made and attached from now on are of `access` (see `make_base_dirs` for the
    /// directories kubelet has for it).
    pub(crate) fn set_access(&mut self, access: AccessType) {
        self.access = access;
    }

    /// The StorageClass parameters volumes are made with.
    pub(crate) fn parameters(&self) -> &HashMap<String, String> {
        &self.parameters
    }

    pub(crate) fn capability(&self) -> csi::VolumeCapability {
        use csi::volume_capability::{AccessMode, AccessType as Type, BlockVolume, MountVolume};
        csi::VolumeCapability {
            access_type: Some(match self.access {
                AccessType::Mount => Type::Mount(MountVolume {
                    fs_type: self.fs_type.clone(),
                    ..Default::default()
                }),
                AccessType::Block => Type::Block(BlockVolume {}),
            }),
            access_mode: Some(AccessMode {
                mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
        }
    }

    /// CreateVolume as external-provisioner sends it, topology from NodeGetInfo, and a
    /// VolumeAttributesClass's parameters as `mutable_parameters`.
    fn create_request(
        &self,
        name: &str,
        mutable_parameters: &HashMap<String, String>,
    ) -> csi::CreateVolumeRequest {
        let topology = self.info.topology.as_ref().map(|segments| {
            let topology = csi::Topology {
                segments: segments.clone(),
            };
            csi::TopologyRequirement {
                requisite: vec![topology.clone()],
                preferred: vec![topology],
            }
        });
        csi::CreateVolumeRequest {
            name: name.to_string(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: self.size,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![self.capability()],
            parameters: self.parameters.clone(),
            mutable_parameters: mutable_parameters.clone(),
            accessibility_requirements: topology,
            ..Default::default()
        }
    }

    /// Creates a volume; an answer that leaves it uncertain whether the volume exists is
    /// followed by the same request again (as the provisioner retries) and a delete, so nothing
    /// stays behind. `None` when no volume is there to use.
    pub(crate) async fn create(&self, name: &str, recorder: &mut Recorder) -> Option<csi::Volume> {
        self.create_in_class(name, &HashMap::new(), recorder).await
    }

    /// `create` with a VolumeAttributesClass's `mutable_parameters`.
    pub(crate) async fn create_in_class(
        &self,
        name: &str,
        mutable_parameters: &HashMap<String, String>,
        recorder: &mut Recorder,
    ) -> Option<csi::Volume> {
        let mut controller = self.csi.controller.clone();
        let request = self.create_request(name, mutable_parameters);
        let call = controller.create_volume(self.csi.request(request.clone()));
        match timed(recorder, Rpc::CreateVolume, call).await {
            Ok(response) => response.volume,
            Err(status) if uncertain(status.code()) => {
                let again = controller.create_volume(self.csi.request(request));
                if let Ok(csi::CreateVolumeResponse {
                    volume: Some(volume),
                }) = timed(recorder, Rpc::CreateVolume, again).await
                {
                    self.delete(&volume.volume_id, recorder).await;
                }
                None
            }
            Err(_) => None,
        }
    }

    pub(crate) async fn delete(&self, volume_id: &str, recorder: &mut Recorder) -> bool {
        let mut controller = self.csi.controller.clone();
        let call = controller.delete_volume(self.csi.request(csi::DeleteVolumeRequest {
            volume_id: volume_id.to_string(),
            ..Default::default()
        }));
        timed(recorder, Rpc::DeleteVolume, call).await.is_ok()
    }

    /// One full cycle over a fresh volume. Teardown runs for every step that was attempted.
    async fn cycle(&self, index: usize, recorder: &mut Recorder) -> CycleOutcome {
        let mut outcome = CycleOutcome::default();
        let name = format!("{}-{index}", self.run_id);
        let Some(volume) = self.create(&name, recorder).await else {
            return outcome;
        };
        let mut dirs = MadeDirs::default();
        let (attachment, attached) = self.attach(&volume, &name, &mut dirs, recorder).await;
        let mut ok = match attached {
            Ok(took) => {
                recorder.record_derived(Rpc::Attach, took);
                true
            }
            Err(AttachFailure::Host(problem)) => {
                outcome.problems.push(problem);
                false
            }
            Err(AttachFailure::Driver(_)) => false,
        };
        let (detached, took) = self.detach(&attachment, recorder).await;
        if let Some(took) = took {
            recorder.record_derived(Rpc::Detach, took);
        }
        ok &= detached;
        ok &= self.delete(&volume.volume_id, recorder).await;
        outcome.problems.extend(dirs.remove_apart().await);
        outcome.completed = ok && outcome.problems.is_empty();
        outcome
    }

    /// ControllerPublish (when the driver asks for it), NodeStage (when it stages) and
    /// NodePublish of `volume`, named `name`, as kubelet makes them, with the directories
    /// kubelet would make (in `dirs`). The attachment says what was attempted, for `detach`;
    /// the result is the time stage + publish took, or the first failure.
    pub(crate) async fn attach(
        &self,
        volume: &csi::Volume,
        name: &str,
        dirs: &mut MadeDirs,
        recorder: &mut Recorder,
    ) -> (Attachment, Result<Duration, AttachFailure>) {
        let pod_uid = uuid::Uuid::now_v7().to_string();
        self.attach_for_pod(volume, name, &pod_uid, dirs, recorder)
            .await
    }

    /// `attach` for the pod with uid `pod_uid` (its target paths name it, as kubelet's do).
    pub(crate) async fn attach_for_pod(
        &self,
        volume: &csi::Volume,
        name: &str,
        pod_uid: &str,
        dirs: &mut MadeDirs,
        recorder: &mut Recorder,
    ) -> (Attachment, Result<Duration, AttachFailure>) {
        let id = volume.volume_id.clone();
        let mut done = Attachment {
            volume_id: id.clone(),
            target: match self.access {
                AccessType::Mount => self.layout.mount_target(pod_uid, name),
                AccessType::Block => self.layout.block_target(name, pod_uid),
            },
            staging: self.info.stage_unstage.then(|| match self.access {
                AccessType::Mount => self.layout.mount_staging(&id),
                AccessType::Block => self.layout.block_staging(name),
            }),
            controller_published: false,
            staged: false,
            published: false,
        };
        let result = self.attach_steps(volume, &mut done, dirs, recorder).await;
        (done, result)
    }

    async fn attach_steps(
        &self,
        volume: &csi::Volume,
        done: &mut Attachment,
        dirs: &mut MadeDirs,
        recorder: &mut Recorder,
    ) -> Result<Duration, AttachFailure> {
        let id = &done.volume_id;
        let capability = self.capability();
        let mut controller = self.csi.controller.clone();
        let mut node = self.csi.node.clone();
        let mut publish_context = HashMap::new();
        if self.info.controller_publish {
            done.controller_published = true;
            let call = controller.controller_publish_volume(self.csi.request(
                csi::ControllerPublishVolumeRequest {
                    volume_id: id.clone(),
                    node_id: self.info.node_id.clone(),
                    volume_capability: Some(capability.clone()),
                    readonly: false,
                    volume_context: volume.volume_context.clone(),
                    ..Default::default()
                },
            ));
            let response = timed(recorder, Rpc::ControllerPublishVolume, call)
                .await
                .map_err(|status| AttachFailure::driver("ControllerPublishVolume", status))?;
            publish_context = response.publish_context;
        }
        let mut took = Duration::ZERO;
        if let Some(staging) = done.staging.clone() {
            // Kubelet makes the staging directory itself.
            dirs.make_all_apart(staging.clone())
                .await
                .map_err(|err| AttachFailure::Host(err.to_string()))?;
            done.staged = true;
            let call = node.node_stage_volume(self.csi.request(csi::NodeStageVolumeRequest {
                volume_id: id.clone(),
                publish_context: publish_context.clone(),
                staging_target_path: path_string(&staging),
                volume_capability: Some(capability.clone()),
                volume_context: volume.volume_context.clone(),
                ..Default::default()
            }));
            let started = Instant::now();
            timed(recorder, Rpc::NodeStageVolume, call)
                .await
                .map_err(|status| AttachFailure::driver("NodeStageVolume", status))?;
            took += started.elapsed();
        }
        // Kubelet makes only the target's parent.
        let parent = done.target.parent().expect("targets have a parent");
        dirs.make_all_apart(parent.to_path_buf())
            .await
            .map_err(|err| AttachFailure::Host(err.to_string()))?;
        done.published = true;
        let call = node.node_publish_volume(self.csi.request(csi::NodePublishVolumeRequest {
            volume_id: id.clone(),
            publish_context,
            staging_target_path: done.staging.as_deref().map(path_string).unwrap_or_default(),
            target_path: path_string(&done.target),
            volume_capability: Some(capability),
            readonly: false,
            volume_context: volume.volume_context.clone(),
            ..Default::default()
        }));
        let started = Instant::now();
        timed(recorder, Rpc::NodePublishVolume, call)
            .await
            .map_err(|status| AttachFailure::driver("NodePublishVolume", status))?;
        Ok(took + started.elapsed())
    }

    /// Undoes what `attach` attempted, in kubelet's order: whether every call succeeded, and
    /// the time unpublish + unstage took when there was something to detach and it all went
    /// well.
    pub(crate) async fn detach(
        &self,
        done: &Attachment,
        recorder: &mut Recorder,
    ) -> (bool, Option<Duration>) {
        let id = &done.volume_id;
        let mut controller = self.csi.controller.clone();
        let mut node = self.csi.node.clone();
        let mut took = Duration::ZERO;
        let mut detached = true;
        if done.published {
            let call =
                node.node_unpublish_volume(self.csi.request(csi::NodeUnpublishVolumeRequest {
                    volume_id: id.clone(),
                    target_path: path_string(&done.target),
                }));
            let started = Instant::now();
            detached &= timed(recorder, Rpc::NodeUnpublishVolume, call)
                .await
                .is_ok();
            took += started.elapsed();
        }
        if let (true, Some(staging)) = (done.staged, &done.staging) {
            let call = node.node_unstage_volume(self.csi.request(csi::NodeUnstageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: path_string(staging),
            }));
            let started = Instant::now();
            detached &= timed(recorder, Rpc::NodeUnstageVolume, call).await.is_ok();
            took += started.elapsed();
        }
        let span = (detached && (done.published || done.staged)).then_some(took);
        let mut ok = detached;
        if done.controller_published {
            let call = controller.controller_unpublish_volume(self.csi.request(
                csi::ControllerUnpublishVolumeRequest {
                    volume_id: id.clone(),
                    node_id: self.info.node_id.clone(),
                    ..Default::default()
                },
            ));
            ok &= timed(recorder, Rpc::ControllerUnpublishVolume, call)
                .await
                .is_ok();
        }
        (ok, span)
    }
}

/// What `attach` attempted, so that `detach` undoes exactly that.
#[derive(Debug)]
pub(crate) struct Attachment {
    pub(crate) volume_id: String,
    pub(crate) target: std::path::PathBuf,
    staging: Option<std::path::PathBuf>,
    controller_published: bool,
    staged: bool,
    published: bool,
}

/// Why an attach stopped: the driver refused a call, or we could not make a directory.
#[derive(Debug)]
pub(crate) enum AttachFailure {
    Driver(String),
    Host(String),
}

impl AttachFailure {
    fn driver(call: &str, status: tonic::Status) -> AttachFailure {
        AttachFailure::Driver(format!("{call}: {:?}: {}", status.code(), status.message()))
    }
}

impl std::fmt::Display for AttachFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttachFailure::Driver(what) | AttachFailure::Host(what) => f.write_str(what),
        }
    }
}

#[derive(Debug, Default)]
struct CycleOutcome {
    completed: bool,
    /// Host-side trouble of ours (directories), not driver errors.
    problems: Vec<String>,
}

/// Codes after which a volume may exist although CreateVolume did not say so.
fn uncertain(code: Code) -> bool {
    matches!(
        code,
        Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Unavailable
            | Code::Aborted
            | Code::Unknown
    )
}

pub(crate) fn path_string(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// Runs `job(0..count)` on `width` tasks (each taking the next index when done), each with its
/// own recorder; the results and the merged recorder.
async fn run_workers<R, F, Fut>(width: usize, count: usize, job: F) -> (Vec<R>, Recorder)
where
    R: Send + 'static,
    F: Fn(usize, Recorder) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = (R, Recorder)> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..width.clamp(1, count.max(1)) {
        let job = job.clone();
        let next = next.clone();
        tasks.spawn(async move {
            let mut recorder = Recorder::default();
            let mut results = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= count {
                    break;
                }
                let (result, back) = job(index, recorder).await;
                recorder = back;
                results.push(result);
            }
            (results, recorder)
        });
    }
    let mut results = Vec::with_capacity(count);
    let mut recorder = Recorder::default();
    while let Some(joined) = tasks.join_next().await {
        let (part, part_recorder) = joined.expect("a benchmark task panicked");
        results.extend(part);
        recorder.merge(part_recorder);
    }
    (results, recorder)
}

/// Creates `count` volumes in parallel; the ids of those that exist.
async fn preload(target: &Arc<Target>, count: usize, width: usize) -> (Vec<String>, Phase, u64) {
    let started = Instant::now();
    let t = target.clone();
    let (ids, recorder) = run_workers(width.max(BULK_WIDTH), count, move |i, mut recorder| {
        let t = t.clone();
        async move {
            let name = format!("{}-preload-{i}", t.run_id);
            let volume = t.create(&name, &mut recorder).await;
            (volume.map(|v| v.volume_id), recorder)
        }
    })
    .await;
    let ids: Vec<String> = ids.into_iter().flatten().collect();
    let errors = recorder.errors();
    (ids, Phase::new(count, started.elapsed(), &recorder), errors)
}

/// Deletes `ids` in parallel.
async fn delete_all(target: &Arc<Target>, ids: Vec<String>) -> (Phase, u64) {
    let started = Instant::now();
    let count = ids.len();
    let ids = Arc::new(ids);
    let t = target.clone();
    let (_, recorder) = run_workers(BULK_WIDTH, count, move |i, mut recorder| {
        let t = t.clone();
        let ids = ids.clone();
        async move {
            t.delete(&ids[i], &mut recorder).await;
            ((), recorder)
        }
    })
    .await;
    let errors = recorder.errors();
    (Phase::new(count, started.elapsed(), &recorder), errors)
}

/// A driver to talk to: one we started or one already running.
pub(crate) struct Session {
    csi: Csi,
    process: Option<DriverProcess>,
    pub(crate) pid: Option<u32>,
}

impl Session {
    pub(crate) async fn open(common: &Common) -> Result<Session, Fatal> {
        let socket = client::socket_path(&common.driver.endpoint)?;
        match &common.driver.driver_cmd {
            Some(command) => {
                let (process, ready) = start(command, common).await?;
                Ok(Session {
                    csi: Csi::new(ready.channel, common.deadline),
                    process: Some(process),
                    pid: Some(ready.pid),
                })
            }
            None => {
                let channel = client::connect(&socket, common.deadline)
                    .await
                    .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
                let csi = Csi::new(channel, common.deadline);
                match client::probe(&csi).await {
                    Ok(true) => {}
                    Ok(false) => return Err("the driver's Probe answers ready: false".into()),
                    Err(status) => {
                        return Err(format!("Probe: {:?}: {}", status.code(), status.message()));
                    }
                }
                Ok(Session {
                    csi,
                    process: None,
                    pid: common.driver.driver_pid,
                })
            }
        }
    }

    /// Stops the driver if we started it.
    pub(crate) async fn close(mut self) -> Result<(), Fatal> {
        match self.process.as_mut() {
            Some(process) => process.stop().await,
            None => Ok(()),
        }
    }

    pub(crate) fn rss_kib(&self) -> Option<u64> {
        self.pid.and_then(|pid| status_kib(pid, "VmRSS"))
    }

    pub(crate) fn peak_kib(&self) -> Option<u64> {
        self.pid.and_then(|pid| status_kib(pid, "VmHWM"))
    }
}

async fn start(
    command: &str,
    common: &Common,
) -> Result<(DriverProcess, crate::driver_process::Ready), Fatal> {
    let socket = client::socket_path(&common.driver.endpoint)?;
    let mut process = DriverProcess::start(command)?;
    let ready = process
        .wait_ready(&socket, common.deadline, START_TIMEOUT)
        .await?;
    Ok((process, ready))
}

/// What every workload starts from: the volume target of `session`'s driver (with the calls
/// that discovered it) and kubelet's base directories made. On failure the session is closed.
pub(crate) async fn ready_to_work(
    session: Session,
    common: &Common,
) -> Result<(Session, Target, Recorder, MadeDirs), Fatal> {
    let found = target_for(&session, common)
        .await
        .and_then(|(target, discovery)| {
            let base_dirs = make_base_dirs(&target)?;
            Ok((target, discovery, base_dirs))
        });
    match found {
        Ok((target, discovery, base_dirs)) => Ok((session, target, discovery, base_dirs)),
        Err(err) => {
            let _ = session.close().await;
            Err(err)
        }
    }
}

/// Reads what the driver offers and refuses drivers that cannot create volumes.
async fn target_for(session: &Session, common: &Common) -> Result<(Target, Recorder), Fatal> {
    let mut recorder = Recorder::default();
    let info = client::discover(&session.csi, &mut recorder).await?;
    if !info.controller_service || !info.create_delete_volume {
        return Err(format!(
            "driver {:?} does not offer CreateVolume/DeleteVolume (plugin capability \
             CONTROLLER_SERVICE: {}, controller capability CREATE_DELETE_VOLUME: {}); \
             this benchmark provisions its own volumes and cannot run against it",
            info.name, info.controller_service, info.create_delete_volume
        ));
    }
    let run_id = format!("bench-{}", uuid::Uuid::now_v7().simple());
    let target = Target {
        csi: session.csi.clone(),
        layout: KubeletLayout::new(&common.driver.kubelet_dir, &info.name),
        info,
        access: common.access_type,
        size: common.size,
        fs_type: common.fs_type.clone(),
        parameters: common.parameters.iter().cloned().collect(),
        run_id,
    };
    Ok((target, recorder))
}

/// The shared directories kubelet would have (pods/, plugins/…) that the cycles need.
pub(crate) fn make_base_dirs(target: &Target) -> Result<MadeDirs, Fatal> {
    let layout = &target.layout;
    let mut bases = vec![layout.root().to_path_buf()];
    match target.access {
        AccessType::Mount => bases.push(layout.pods()),
        AccessType::Block => bases.push(layout.block_publish_base()),
    }
    if target.info.stage_unstage {
        bases.push(match target.access {
            AccessType::Mount => layout.mount_staging_base(),
            AccessType::Block => layout.block_staging_base(),
        });
    }
    let mut made = MadeDirs::default();
    for base in bases {
        if let Err(err) = made.make_all(&base) {
            made.remove();
            return Err(format!("preparing the kubelet directory: {err}"));
        }
    }
    Ok(made)
}

#[derive(Debug, Serialize)]
pub struct LifecycleReport {
    pub workload: &'static str,
    pub driver: DriverInfo,
    pub access_type: &'static str,
    pub volumes: usize,
    pub concurrency: u32,
    pub preload: usize,
    pub size_bytes: i64,
    pub cycles_completed: usize,
    pub cycles_failed: usize,
    /// Wall time of the measured cycles (preload and cleanup excluded).
    pub wall_time_s: f64,
    /// Completed cycles per second of wall time.
    pub cycles_per_s: f64,
    /// The measured cycles' calls; `attach(stage+publish)` and `detach(unpublish+unstage)` are
    /// per-cycle sums.
    pub rpcs: std::collections::BTreeMap<&'static str, RpcSummary>,
    /// The capability calls made at the start.
    pub discovery: std::collections::BTreeMap<&'static str, RpcSummary>,
    pub preload_phase: Option<Phase>,
    pub cleanup_phase: Option<Phase>,
    pub memory: Memory,
    /// Failed calls in every phase.
    pub errors_total: u64,
    /// Things of ours that could not be removed (directories still in use).
    pub leftovers: Vec<String>,
    #[serde(skip)]
    pub recorder: Recorder,
}

pub async fn lifecycle(args: &LifecycleArgs) -> Result<LifecycleReport, Fatal> {
    let common = &args.common;
    let session = Session::open(common).await?;
    let mut memory = Memory {
        pid: session.pid,
        idle_rss_kib: session.rss_kib(),
        ..Default::default()
    };
    let (session, target, discovery, mut base_dirs) = ready_to_work(session, common).await?;
    let target = Arc::new(target);
    let mut errors_total = discovery.errors();
    let (preloaded, preload_phase, errors) =
        preload_if_asked(&target, common.preload, args.concurrency as usize).await;
    errors_total += errors;
    memory.after_preload_rss_kib = session.rss_kib();

    let (outcomes, recorder, wall) = measured_cycles(args, &target).await;
    memory.end_rss_kib = session.rss_kib();
    memory.peak_rss_kib = session.peak_kib();
    errors_total += recorder.errors();
    let completed = outcomes.iter().filter(|o| o.completed).count();
    let mut leftovers: Vec<String> = outcomes.into_iter().flat_map(|o| o.problems).collect();

    let (cleanup_phase, errors) = delete_preload(&target, preloaded, common).await;
    errors_total += errors;
    leftovers.extend(base_dirs.remove());
    if let Err(err) = session.close().await {
        leftovers.push(err);
    }
    let target = Arc::try_unwrap(target).ok().expect("workers are done");
    Ok(LifecycleReport {
        workload: "lifecycle",
        driver: target.info,
        access_type: common.access_type.as_str(),
        volumes: args.volumes,
        concurrency: args.concurrency,
        preload: common.preload,
        size_bytes: common.size,
        cycles_completed: completed,
        cycles_failed: args.volumes - completed,
        wall_time_s: wall.as_secs_f64(),
        cycles_per_s: completed as f64 / wall.as_secs_f64().max(f64::EPSILON),
        rpcs: recorder.summary(),
        discovery: discovery.summary(),
        preload_phase,
        cleanup_phase,
        memory,
        errors_total,
        leftovers,
        recorder,
    })
}

/// `--preload`: volumes made `width` at a time before what is measured (none without it):
/// their ids, the phase if there was one, and its failed calls.
async fn preload_if_asked(
    target: &Arc<Target>,
    count: usize,
    width: usize,
) -> (Vec<String>, Option<Phase>, u64) {
    if count == 0 {
        return (Vec::new(), None, 0);
    }
    eprintln!("preloading {count} volumes…");
    let (ids, phase, errors) = preload(target, count, width).await;
    (ids, Some(phase), errors)
}

/// The measured part of `lifecycle`: `--volumes` cycles by `--concurrency` clients; each
/// cycle's outcome, their calls and the wall time.
async fn measured_cycles(
    args: &LifecycleArgs,
    target: &Arc<Target>,
) -> (Vec<CycleOutcome>, Recorder, Duration) {
    eprintln!(
        "running {} {} cycles with {} client(s)…",
        args.volumes,
        args.common.access_type.as_str(),
        args.concurrency
    );
    let started = Instant::now();
    let t = target.clone();
    let (outcomes, recorder) = run_workers(
        args.concurrency as usize,
        args.volumes,
        move |i, mut recorder| {
            let t = t.clone();
            async move {
                let outcome = t.cycle(i, &mut recorder).await;
                (outcome, recorder)
            }
        },
    )
    .await;
    (outcomes, recorder, started.elapsed())
}

/// Whether the preloaded volumes are deleted at the end: unless none are left or
/// `--keep-preload` keeps them. Says so on stderr when they are.
fn deleting_preload(preloaded: &[String], common: &Common) -> bool {
    let delete = !preloaded.is_empty() && !common.keep_preload;
    if delete {
        eprintln!("deleting {} preloaded volumes…", preloaded.len());
    }
    delete
}

/// Deletes the preloaded volumes (see `deleting_preload`): the phase if there was one, and
/// its failed calls.
async fn delete_preload(
    target: &Arc<Target>,
    preloaded: Vec<String>,
    common: &Common,
) -> (Option<Phase>, u64) {
    if !deleting_preload(&preloaded, common) {
        return (None, 0);
    }
    let (phase, errors) = delete_all(target, preloaded).await;
    (Some(phase), errors)
}

#[derive(Debug, Serialize)]
pub struct StartupRun {
    /// From spawning the command to the first Probe that answered ready.
    pub ready_us: u64,
    /// VmRSS right after ready.
    pub rss_kib: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct StartupReport {
    pub workload: &'static str,
    pub driver: DriverInfo,
    pub access_type: &'static str,
    pub preload: usize,
    pub runs: Vec<StartupRun>,
    pub median_ready_us: u64,
    pub median_rss_kib: Option<u64>,
    pub discovery: std::collections::BTreeMap<&'static str, RpcSummary>,
    pub preload_phase: Option<Phase>,
    pub cleanup_phase: Option<Phase>,
    pub errors_total: u64,
    pub leftovers: Vec<String>,
}

pub async fn startup(args: &StartupArgs) -> Result<StartupReport, Fatal> {
    let common = &args.common;
    let Some(command) = common.driver.driver_cmd.as_deref() else {
        return Err("the startup workload starts the driver itself: give --driver-cmd".into());
    };
    let session = Session::open(common).await?;
    let (target, discovery) = match target_for(&session, common).await {
        Ok(found) => found,
        Err(err) => {
            let _ = session.close().await;
            return Err(err);
        }
    };
    let target = Arc::new(target);
    let mut errors_total = discovery.errors();
    let mut leftovers = Vec::new();
    let (preloaded, preload_phase, errors) =
        preload_if_asked(&target, common.preload, BULK_WIDTH).await;
    errors_total += errors;
    // Every run starts the driver afresh: the one that preloaded is stopped first.
    if let Err(err) = session.close().await {
        leftovers.push(format!("after the preload: {err}"));
    }
    let runs = timed_starts(command, common, args.runs, &mut leftovers).await;
    let (cleanup_phase, errors) =
        delete_preload_restarted(command, common, &target, preloaded, &mut leftovers).await?;
    errors_total += errors;
    let ready: Vec<u64> = runs.iter().map(|r| r.ready_us).collect();
    let rss: Vec<u64> = runs.iter().filter_map(|r| r.rss_kib).collect();
    Ok(StartupReport {
        workload: "startup",
        driver: target.info.clone(),
        access_type: common.access_type.as_str(),
        preload: common.preload,
        median_ready_us: median(&ready),
        median_rss_kib: (!rss.is_empty()).then(|| median(&rss)),
        runs,
        discovery: discovery.summary(),
        preload_phase,
        cleanup_phase,
        errors_total,
        leftovers,
    })
}

/// Starts the driver `runs` times, each until ready and then stopped: how long it took and
/// its RSS then. A start that fails ends the runs; it and failed stops go to `leftovers`.
async fn timed_starts(
    command: &str,
    common: &Common,
    runs: u32,
    leftovers: &mut Vec<String>,
) -> Vec<StartupRun> {
    let mut timed = Vec::new();
    for run in 1..=runs {
        let (mut process, ready) = match start(command, common).await {
            Ok(started) => started,
            Err(err) => {
                leftovers.push(format!("run {run}: {err}"));
                break;
            }
        };
        let rss_kib = status_kib(ready.pid, "VmRSS");
        eprintln!(
            "run {run}: ready after {:.1} ms, RSS {}",
            ready.elapsed.as_secs_f64() * 1e3,
            crate::report::kib(rss_kib)
        );
        timed.push(StartupRun {
            ready_us: ready.elapsed.as_micros() as u64,
            rss_kib,
        });
        drop(ready.channel);
        if let Err(err) = process.stop().await {
            leftovers.push(format!("run {run}: {err}"));
        }
    }
    timed
}

/// `delete_preload` for `startup`, whose runs left no driver running: one is started for the
/// deletes and stopped after them.
async fn delete_preload_restarted(
    command: &str,
    common: &Common,
    target: &Target,
    preloaded: Vec<String>,
    leftovers: &mut Vec<String>,
) -> Result<(Option<Phase>, u64), Fatal> {
    if !deleting_preload(&preloaded, common) {
        return Ok((None, 0));
    }
    let (mut process, ready) = start(command, common).await?;
    let cleaner = Arc::new(target.with_csi(Csi::new(ready.channel, common.deadline)));
    let (phase, errors) = delete_all(&cleaner, preloaded).await;
    drop(cleaner);
    if let Err(err) = process.stop().await {
        leftovers.push(err);
    }
    Ok((Some(phase), errors))
}
