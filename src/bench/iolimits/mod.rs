//! `io-limits`: what a VolumeAttributesClass's `writeIOPS` does, measured as a node sees it.
//!
//! For each kind (a block volume, then an image volume with `--fs-type`), two volumes of the
//! same pool, so on the same disk: one created in a class with `writeIOPS=--write-iops`, and an
//! unlimited neighbour. Each is published to a pod of its own whose cgroup is laid out as
//! kubelet's (`cgroup`), made before the publish (the driver finds the pod by the uid in the
//! target path); both are written once end to end by us, outside every pod. Each pod then gets
//! a container cgroup, where its writer process runs (`writer`), and:
//!
//! 1. once the limit is in the limited writer's cgroup (under cgroup v1 the driver sets it on
//!    containers made after the publish, by a look every 2 s), the neighbour writes alone (its
//!    rate unlimited), then both write at once, then the neighbour alone again (its unlimited
//!    rate is the mean of the two runs alone);
//! 2. the class is changed on the running pod (ControllerModifyVolume with
//!    `writeIOPS=--changed-write-iops`), and once the new limit is in the cgroup the same two
//!    runs again.
//!
//! A limited volume above its limit × (1 + `--limit-slack`) or a neighbour below
//! `--neighbour-share` of its rate alone fails the run (exit status 1). Everything is undone,
//! also after a failure: files, publications, volumes, cgroups, the driver we started.

mod cgroup;
pub mod report;
pub mod writer;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use stickyvol::csi;
use stickyvol::host::blkio::{DeviceNumber, Hierarchy};

use crate::blockio::{Side, create_direct, fill_once};
use crate::cli::{IoLimitsArgs, LimitedKind};
use crate::client::timed;
use crate::paths::MadeDirs;
use crate::report::{Recorder, Rpc};
use crate::workload::{Attachment, Fatal, Session, Target, make_base_dirs, ready_to_work};
use cgroup::{Pods, device_number};
use report::{IoLimitsReport, KindReport, Phase, failed_checks};
use writer::{Writer, WriterOutput};

/// How long the driver may take to put a limit in the writer's cgroup (v1: its look every 2 s).
const LIMIT_TIMEOUT: Duration = Duration::from_secs(20);
/// The name of the file written in an image volume.
const IMAGE_FILE: &str = ".stickyvol-bench-iolimits";

/// What the run makes and must undo, and what it counts.
struct Run {
    pods: Pods,
    recorder: Recorder,
    /// Kubelet's directories for the targets and staging paths.
    dirs: MadeDirs,
    /// Kubelet's base directories of each access type.
    base_dirs: Vec<MadeDirs>,
    io_errors: Vec<String>,
    leftovers: Vec<String>,
}

/// One of the two volumes of a kind, its pod, and what was done with it.
struct PodVolume {
    role: &'static str,
    uid: String,
    volume_id: String,
    attachment: Option<Attachment>,
    /// What its writer writes: the published device, or a file of ours in the image.
    path: PathBuf,
    made_file: bool,
}

pub async fn io_limits(args: &IoLimitsArgs) -> Result<IoLimitsReport, Fatal> {
    check_args(args)?;
    let run_id = uuid::Uuid::now_v7().simple().to_string();
    let mut pods = Pods::make(&args.cgroup_root, &run_id)?;
    let common = args.common();
    let opened = match Session::open(&common).await {
        Ok(session) => ready_to_work(session, &common).await,
        Err(err) => Err(err),
    };
    let (session, mut target, discovery, base_dirs) = match opened {
        Ok(opened) => opened,
        Err(err) => {
            pods.remove();
            return Err(err);
        }
    };
    let cgroup = match pods.hierarchy {
        Hierarchy::V1 => "v1",
        Hierarchy::V2 => "v2",
    };
    let mut run = Run {
        pods,
        recorder: Recorder::default(),
        dirs: MadeDirs::default(),
        base_dirs: vec![base_dirs],
        io_errors: Vec::new(),
        leftovers: Vec::new(),
    };
    let measured = measure_kinds(args, &mut target, &mut run).await;
    run.leftovers.extend(run.dirs.remove());
    for mut dirs in run.base_dirs.drain(..).rev() {
        run.leftovers.extend(dirs.remove());
    }
    run.leftovers.extend(run.pods.remove());
    if let Err(err) = session.close().await {
        run.leftovers.push(err);
    }
    let kinds = measured.map_err(|err| with_leftovers(err, &run.leftovers))?;
    let write_errors = write_errors(&kinds);
    run.io_errors.truncate(10);
    Ok(IoLimitsReport {
        workload: "io-limits",
        driver: target.info.clone(),
        cgroup,
        size_bytes: args.size,
        runtime_s: args.runtime.as_secs_f64(),
        limit_slack: args.limit_slack,
        min_neighbour_share: args.neighbour_share,
        failed_checks: failed_checks(&kinds, args.neighbour_share),
        kinds,
        rpcs: run.recorder.summary(),
        errors_total: discovery.errors() + run.recorder.errors() + write_errors,
        discovery: discovery.summary(),
        io_errors: run.io_errors,
        leftovers: run.leftovers,
    })
}

/// The writes that failed, in every run.
fn write_errors(kinds: &[KindReport]) -> u64 {
    (kinds.iter())
        .flat_map(|kind| kind.phases.iter())
        .flat_map(|p| {
            [
                &p.neighbour_alone_before,
                &p.neighbour_alone_after,
                &p.limited,
                &p.neighbour,
            ]
        })
        .map(|side| side.errors)
        .sum()
}

fn check_args(args: &IoLimitsArgs) -> Result<(), Fatal> {
    if args.size < 1 << 20 || !args.size.is_multiple_of(1 << 20) {
        return Err(format!(
            "--size {} must be a positive multiple of 1 MiB",
            args.size
        ));
    }
    if args.write_iops == 0 || args.changed_write_iops == 0 {
        return Err("--write-iops and --changed-write-iops must be positive".into());
    }
    if !(args.limit_slack >= 0.0 && args.neighbour_share > 0.0 && args.neighbour_share <= 1.0) {
        return Err("--limit-slack must be ≥ 0 and --neighbour-share in (0, 1]".into());
    }
    Ok(())
}

fn with_leftovers(err: Fatal, leftovers: &[String]) -> Fatal {
    match leftovers.is_empty() {
        true => err,
        false => format!("{err}; left behind: {}", leftovers.join("; ")),
    }
}

/// Every kind asked for, in order; the first failure stops the run.
async fn measure_kinds(
    args: &IoLimitsArgs,
    target: &mut Target,
    run: &mut Run,
) -> Result<Vec<KindReport>, Fatal> {
    let mut kinds = Vec::new();
    for &kind in &args.kinds {
        let report = measure_kind(args, target, kind, run)
            .await
            .map_err(|err| format!("{} volumes: {err}", kind.name()))?;
        kinds.push(report);
    }
    Ok(kinds)
}

/// One kind: both volumes made, attached, measured and undone (also after a failure).
async fn measure_kind(
    args: &IoLimitsArgs,
    target: &mut Target,
    kind: LimitedKind,
    run: &mut Run,
) -> Result<KindReport, Fatal> {
    target.set_access(kind.access());
    target.set_fs_type(match kind {
        LimitedKind::Block => "",
        LimitedKind::Image => &args.fs_type,
    });
    run.base_dirs.push(make_base_dirs(target)?);
    let mut volumes = Vec::new();
    let mut measured = attach_both(args, target, kind, run, &mut volumes).await;
    if measured.is_ok() {
        measured = prepare(&volumes, args.size).await;
    }
    let report = match measured {
        Ok(()) => measure(args, target, kind, run, &volumes).await,
        Err(err) => Err(err),
    };
    for volume in &volumes {
        undo(target, volume, run).await;
    }
    report
}

/// Creates the limited volume (in its class) and the neighbour, each published to a pod of its
/// own whose cgroup is made first; `volumes` gets each as soon as it exists.
async fn attach_both(
    args: &IoLimitsArgs,
    target: &Target,
    kind: LimitedKind,
    run: &mut Run,
    volumes: &mut Vec<PodVolume>,
) -> Result<(), Fatal> {
    for (role, class) in [
        ("limited", class(args.write_iops)),
        ("neighbour", HashMap::new()),
    ] {
        let name = format!("{}-iolimits-{}-{role}", target.run_id, kind.name());
        let volume = (target
            .create_in_class(&name, &class, &mut run.recorder)
            .await)
            .ok_or_else(|| format!("CreateVolume of the {role} volume failed"))?;
        let uid = uuid::Uuid::now_v7().to_string();
        volumes.push(PodVolume {
            role,
            uid: uid.clone(),
            volume_id: volume.volume_id.clone(),
            attachment: None,
            path: PathBuf::new(),
            made_file: false,
        });
        run.pods.make_pod(&uid)?;
        let (attachment, attached) = target
            .attach_for_pod(&volume, &name, &uid, &mut run.dirs, &mut run.recorder)
            .await;
        let this = volumes.last_mut().expect("pushed above");
        this.path = match kind {
            LimitedKind::Block => attachment.target.clone(),
            LimitedKind::Image => attachment.target.join(IMAGE_FILE),
        };
        this.made_file = kind == LimitedKind::Image;
        this.attachment = Some(attachment);
        attached.map_err(|failure| format!("attaching the {role} volume: {failure}"))?;
    }
    Ok(())
}

/// A class with `writeIOPS` alone, as a VolumeAttributesClass's parameters.
fn class(write_iops: u64) -> HashMap<String, String> {
    HashMap::from([("writeIOPS".to_string(), write_iops.to_string())])
}

/// Makes each image's file, and writes each volume's `size` bytes once from end to end (from
/// here, in no pod's cgroup), so that no run meets unallocated blocks.
async fn prepare(volumes: &[PodVolume], size: u64) -> Result<(), Fatal> {
    let targets: Vec<(PathBuf, bool)> = (volumes.iter())
        .map(|v| (v.path.clone(), v.made_file))
        .collect();
    tokio::task::spawn_blocking(move || {
        for (path, is_file) in targets {
            let file = match is_file {
                true => create_direct(&path).and_then(|f| f.set_len(size).map(|()| f)),
                false => writable_direct(&path),
            }
            .map_err(|e| format!("opening {} for direct IO: {e}", path.display()))?;
            eprintln!("filling {} ({} MiB)…", path.display(), size >> 20);
            fill_once(&file, size).map_err(|e| format!("filling {}: {e}", path.display()))?;
        }
        Ok(())
    })
    .await
    .map_err(|e| format!("the fill thread failed: {e}"))?
}

fn writable_direct(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_EXCL)
        .open(path)
}

/// The runs of one kind, its volumes attached and written once.
async fn measure(
    args: &IoLimitsArgs,
    target: &Target,
    kind: LimitedKind,
    run: &mut Run,
    volumes: &[PodVolume],
) -> Result<KindReport, Fatal> {
    let [limited, neighbour] = volumes else {
        return Err("two volumes expected".into());
    };
    let devices = [
        device_number(&limited.path)?,
        device_number(&neighbour.path)?,
    ];
    let mut writers = Vec::new();
    for volume in volumes {
        writers.push(Writer {
            cgroup_procs: run.pods.make_container(&volume.uid)?,
            path: volume.path.clone(),
            size: args.size,
        });
    }
    let mut phases = Vec::new();
    for (changed, write_iops) in [(false, args.write_iops), (true, args.changed_write_iops)] {
        if changed {
            modify(target, &limited.volume_id, write_iops, &mut run.recorder).await?;
        }
        let in_cgroup = (run.pods)
            .wait_for_write_iops(&limited.uid, devices[0], Some(write_iops), LIMIT_TIMEOUT)
            .await?;
        // The neighbour's rate alone right before and right after, so that the machine's
        // load drifting between runs does not pass for the limited volume's doing.
        let alone_before = write_alone(&writers[1], kind, args, run).await?;
        eprintln!(
            "{}: writeIOPS={write_iops} beside the neighbour…",
            kind.name()
        );
        let both = write_together(&writers, args.runtime, run).await?;
        let alone_after = write_alone(&writers[1], kind, args, run).await?;
        let alone_iops = (alone_before.iops + alone_after.iops) / 2.0;
        phases.push(Phase {
            changed,
            write_iops,
            write_iops_in_cgroup: in_cgroup,
            limited_bound: write_iops as f64 * (1.0 + args.limit_slack),
            neighbour_share: share(both[1].iops, alone_iops),
            neighbour_alone_before: alone_before,
            neighbour_alone_after: alone_after,
            neighbour_alone_iops: alone_iops,
            limited: both[0].clone(),
            neighbour: both[1].clone(),
        });
    }
    Ok(KindReport {
        kind: kind.name(),
        limited_device: number_text(devices[0]),
        neighbour_device: number_text(devices[1]),
        phases,
    })
}

/// The neighbour's writer alone.
async fn write_alone(
    neighbour: &Writer,
    kind: LimitedKind,
    args: &IoLimitsArgs,
    run: &mut Run,
) -> Result<Side, Fatal> {
    eprintln!("{}: the neighbour alone…", kind.name());
    let sides = write_together(std::slice::from_ref(neighbour), args.runtime, run).await?;
    Ok(sides.into_iter().next().expect("one writer"))
}

/// `writers` started together for `runtime`: their figures, their write errors kept in `run`.
async fn write_together(
    writers: &[Writer],
    runtime: Duration,
    run: &mut Run,
) -> Result<Vec<Side>, Fatal> {
    let writers = writers.to_vec();
    let outputs: Vec<WriterOutput> =
        tokio::task::spawn_blocking(move || writer::run_together(&writers, runtime))
            .await
            .map_err(|e| format!("the writers' thread failed: {e}"))??;
    Ok(outputs
        .into_iter()
        .map(|output| {
            run.io_errors.extend(output.errors);
            output.side
        })
        .collect())
}

/// ControllerModifyVolume as csi-resizer sends it when a claim's class changes.
async fn modify(
    target: &Target,
    volume_id: &str,
    write_iops: u64,
    recorder: &mut Recorder,
) -> Result<(), Fatal> {
    let mut controller = target.csi.controller.clone();
    let call = controller.controller_modify_volume(target.csi.request(
        csi::ControllerModifyVolumeRequest {
            volume_id: volume_id.to_string(),
            mutable_parameters: class(write_iops),
            ..Default::default()
        },
    ));
    timed(recorder, Rpc::ControllerModifyVolume, call)
        .await
        .map(drop)
        .map_err(|s| format!("ControllerModifyVolume: {:?}: {}", s.code(), s.message()))
}

fn share(beside: f64, alone: f64) -> f64 {
    match alone > 0.0 {
        true => beside / alone,
        false => 0.0,
    }
}

fn number_text(number: DeviceNumber) -> String {
    format!("{}:{}", number.major, number.minor)
}

/// Removes our file from `volume`, detaches and deletes it; what could not be removed goes to
/// the run's leftovers (failed calls are counted by the recorder).
async fn undo(target: &Target, volume: &PodVolume, run: &mut Run) {
    if volume.made_file {
        match std::fs::remove_file(&volume.path) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => run.leftovers.push(format!(
                "{} ({}) left in place: {err}",
                volume.path.display(),
                volume.role
            )),
        }
    }
    if let Some(attachment) = &volume.attachment {
        target.detach(attachment, &mut run.recorder).await;
    }
    target.delete(&volume.volume_id, &mut run.recorder).await;
}
