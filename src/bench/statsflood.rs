//! The `stats-flood` workload: what kubelet's volume-stats polling can do to a driver whose
//! volume holds many files. One filesystem volume is published and filled with `--files` empty
//! files through its published path, as a pod would (in directories of 1,000). Then, for
//! `--runtime`, `--callers` clients call NodeGetVolumeStats on it back to back, one client
//! calls Probe every `--probe-interval` (the livenessprobe sidecar gives each Probe 1 s), and
//! one publishes and unpublishes a second volume every second (a pod starting beside the busy
//! one). Probe is measured for a while before the flood too, for comparison. Both volumes are
//! deleted at the end, also after a failed step.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use stickyvol::csi;
use tokio::task::JoinSet;

use crate::cli::StatsFloodArgs;
use crate::client::{DriverInfo, timed};
use crate::paths::MadeDirs;
use crate::report::{Recorder, Rpc, RpcSummary, error_lines_of, errors_section};
use crate::workload::{Fatal, Session, Target, path_string, ready_to_work};

/// Files per directory of the fill: directories stay small, as in real trees.
const FILES_PER_DIR: usize = 1000;
/// Probes measured before the flood.
const IDLE_PROBES: usize = 20;
/// How often the second volume is published and unpublished during the flood.
const BYSTANDER_PERIOD: Duration = Duration::from_secs(1);

#[derive(Debug, Serialize)]
pub struct StatsFloodReport {
    pub workload: &'static str,
    pub driver: DriverInfo,
    pub files: usize,
    pub callers: u64,
    pub runtime_s: f64,
    /// Time to make the files through the published path.
    pub fill_s: f64,
    /// Probe before the flood.
    pub idle: BTreeMap<&'static str, RpcSummary>,
    /// Every call made during the flood: NodeGetVolumeStats, Probe, and the second volume's
    /// NodePublishVolume / NodeUnpublishVolume (and NodeStage/Unstage if the driver stages).
    pub flood: BTreeMap<&'static str, RpcSummary>,
    /// The calls that set the volumes up and tore them down (DeleteVolume of the filled
    /// volume removes every file).
    pub setup: BTreeMap<&'static str, RpcSummary>,
    pub discovery: BTreeMap<&'static str, RpcSummary>,
    pub errors_total: u64,
    pub leftovers: Vec<String>,
}

pub async fn stats_flood(args: &StatsFloodArgs) -> Result<StatsFloodReport, Fatal> {
    let common = args.common();
    let session = Session::open(&common).await?;
    let (session, target, discovery, mut base_dirs) = ready_to_work(session, &common).await?;
    let target = Arc::new(target);
    let mut setup = Recorder::default();
    let mut leftovers = Vec::new();
    let measured = if target.info.get_volume_stats {
        with_two_volumes(args, &target, &mut setup, &mut leftovers).await
    } else {
        Err(format!(
            "driver {:?} does not offer NodeGetVolumeStats (node capability GET_VOLUME_STATS)",
            target.info.name
        ))
    };
    leftovers.extend(base_dirs.remove());
    if let Err(err) = session.close().await {
        leftovers.push(err);
    }
    let measured = measured?;
    let target = Arc::try_unwrap(target).ok().expect("the flood is over");
    Ok(StatsFloodReport {
        workload: "stats-flood",
        driver: target.info,
        files: args.files,
        callers: args.callers,
        runtime_s: args.runtime.as_secs_f64(),
        fill_s: measured.fill.as_secs_f64(),
        errors_total: discovery.errors()
            + setup.errors()
            + measured.idle.errors()
            + measured.flood.errors(),
        idle: measured.idle.summary(),
        flood: measured.flood.summary(),
        setup: setup.summary(),
        discovery: discovery.summary(),
        leftovers,
    })
}

struct Measured {
    fill: Duration,
    idle: Recorder,
    flood: Recorder,
}

/// Creates and publishes the volume to flood and creates the bystander, measures, and then
/// unpublishes and deletes whatever was made.
async fn with_two_volumes(
    args: &StatsFloodArgs,
    target: &Arc<Target>,
    setup: &mut Recorder,
    leftovers: &mut Vec<String>,
) -> Result<Measured, Fatal> {
    let name = format!("{}-flooded", target.run_id);
    let Some(flooded) = target.create(&name, setup).await else {
        return Err("CreateVolume failed".into());
    };
    let bystander_name = format!("{}-bystander", target.run_id);
    let bystander = target.create(&bystander_name, setup).await;
    let mut dirs = MadeDirs::default();
    let (attachment, attached) = target.attach(&flooded, &name, &mut dirs, setup).await;
    let measured = match (attached, &bystander) {
        (Err(failure), _) => Err(failure.to_string()),
        (Ok(_), None) => Err("CreateVolume of the second volume failed".into()),
        (Ok(_), Some(bystander)) => {
            let volume = (flooded.volume_id.clone(), attachment.target.clone());
            let bystander = (bystander.clone(), bystander_name);
            measure(args, target, volume, bystander).await
        }
    };
    target.detach(&attachment, setup).await;
    target.delete(&flooded.volume_id, setup).await;
    if let Some(bystander) = bystander {
        target.delete(&bystander.volume_id, setup).await;
    }
    leftovers.extend(dirs.remove());
    measured
}

async fn measure(
    args: &StatsFloodArgs,
    target: &Arc<Target>,
    (volume_id, path): (String, PathBuf),
    bystander: (csi::Volume, String),
) -> Result<Measured, Fatal> {
    let fill = fill_volume(args.files, &path).await?;
    let mut idle = Recorder::default();
    for _ in 0..IDLE_PROBES {
        probe(target, &mut idle).await;
        tokio::time::sleep(args.probe_interval).await;
    }
    let flood = flood(args, target, volume_id, &path, bystander).await?;
    Ok(Measured { fill, idle, flood })
}

/// Makes `files` files in the published volume at `path`, as a pod would: the time it took.
async fn fill_volume(files: usize, path: &Path) -> Result<Duration, Fatal> {
    eprintln!("making {files} files in the volume…");
    let root = path.to_path_buf();
    let started = Instant::now();
    tokio::task::spawn_blocking(move || fill(&root, files))
        .await
        .map_err(|e| format!("the fill thread failed: {e}"))?
        .map_err(|e| format!("making files in {}: {e}", path.display()))?;
    Ok(started.elapsed())
}

/// For `--runtime`: the stats callers, the prober and the bystander's cycles at once; every
/// call they made, or what their cycles left behind.
async fn flood(
    args: &StatsFloodArgs,
    target: &Arc<Target>,
    volume_id: String,
    path: &Path,
    bystander: (csi::Volume, String),
) -> Result<Recorder, Fatal> {
    eprintln!(
        "flooding with {} NodeGetVolumeStats callers for {:.1} s…",
        args.callers,
        args.runtime.as_secs_f64()
    );
    let until = Instant::now() + args.runtime;
    let mut tasks = JoinSet::new();
    for _ in 0..args.callers {
        let (t, id, path) = (target.clone(), volume_id.clone(), path_string(path));
        tasks.spawn(stats_caller(t, id, path, until));
    }
    tasks.spawn(prober(target.clone(), args.probe_interval, until));
    tasks.spawn(bystander_cycles(target.clone(), bystander, until));
    let mut flood = Recorder::default();
    let mut problems = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (recorder, theirs) = joined.expect("a flood task panicked");
        flood.merge(recorder);
        problems.extend(theirs);
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    Ok(flood)
}

/// Calls NodeGetVolumeStats on the volume back to back until `until`. Like every task of the
/// flood, it returns its calls and (here none) the problems it left.
async fn stats_caller(
    t: Arc<Target>,
    id: String,
    path: String,
    until: Instant,
) -> (Recorder, Vec<String>) {
    let mut recorder = Recorder::default();
    while Instant::now() < until {
        let mut node = t.csi.node.clone();
        let call = node.node_get_volume_stats(t.csi.request(csi::NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: path.clone(),
            staging_target_path: String::new(),
        }));
        let _ = timed(&mut recorder, Rpc::NodeGetVolumeStats, call).await;
    }
    (recorder, Vec::new())
}

/// Calls Probe every `interval` until `until`, as the livenessprobe sidecar does.
async fn prober(t: Arc<Target>, interval: Duration, until: Instant) -> (Recorder, Vec<String>) {
    let mut recorder = Recorder::default();
    while Instant::now() < until {
        probe(&t, &mut recorder).await;
        tokio::time::sleep(interval).await;
    }
    (recorder, Vec::new())
}

/// Publishes and unpublishes the second volume every `BYSTANDER_PERIOD` until `until`: a pod
/// starting beside the busy one. The problems are directories it could not remove.
async fn bystander_cycles(
    t: Arc<Target>,
    (volume, name): (csi::Volume, String),
    until: Instant,
) -> (Recorder, Vec<String>) {
    let mut recorder = Recorder::default();
    let mut problems = Vec::new();
    while Instant::now() < until {
        let mut dirs = MadeDirs::default();
        let (attachment, _) = t.attach(&volume, &name, &mut dirs, &mut recorder).await;
        t.detach(&attachment, &mut recorder).await;
        problems.extend(dirs.remove_apart().await);
        tokio::time::sleep(BYSTANDER_PERIOD).await;
    }
    (recorder, problems)
}

async fn probe(target: &Target, recorder: &mut Recorder) {
    let mut identity = target.csi.identity.clone();
    let call = identity.probe(target.csi.request(csi::ProbeRequest {}));
    let _ = timed(recorder, Rpc::Probe, call).await;
}

/// Makes `count` empty files below `root`, `FILES_PER_DIR` per directory.
fn fill(root: &Path, count: usize) -> io::Result<()> {
    for dir_index in 0..count.div_ceil(FILES_PER_DIR) {
        let dir = root.join(format!("d{dir_index}"));
        fs::create_dir(&dir)?;
        let first = dir_index * FILES_PER_DIR;
        for file_index in first..count.min(first + FILES_PER_DIR) {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(dir.join(format!("f{file_index}")))?;
        }
    }
    Ok(())
}

pub fn text(r: &StatsFloodReport) -> String {
    let line = |label: &str, s: Option<&RpcSummary>| match s {
        None => format!("  {label}: no calls\n"),
        Some(s) => format!(
            "  {label}: {} calls, {} errors; p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms\n",
            s.count,
            s.errors,
            s.p50_us as f64 / 1e3,
            s.p99_us as f64 / 1e3,
            s.max_us as f64 / 1e3
        ),
    };
    let mut out = format!(
        "stats-flood: {} files made in {:.2} s; {} NodeGetVolumeStats callers for {:.1} s\n",
        r.files, r.fill_s, r.callers, r.runtime_s
    );
    out += "before the flood:\n";
    out += &line("Probe", r.idle.get("Probe"));
    out += "during the flood:\n";
    for rpc in [
        "Probe",
        "NodeGetVolumeStats",
        "NodePublishVolume",
        "NodeUnpublishVolume",
    ] {
        out += &line(rpc, r.flood.get(rpc));
    }
    out += "setup and teardown:\n";
    for (rpc, summary) in &r.setup {
        out += &line(rpc, Some(summary));
    }
    let errors: String = [&r.idle, &r.flood, &r.setup]
        .into_iter()
        .map(error_lines_of)
        .collect();
    out += &errors_section(&errors);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_makes_every_file_in_directories_of_a_thousand() {
        let dir = tempfile::tempdir().unwrap();
        fill(dir.path(), 2500).unwrap();
        let count = |d: &str| fs::read_dir(dir.path().join(d)).unwrap().count();
        assert_eq!((count("d0"), count("d1"), count("d2")), (1000, 1000, 500));
        assert!(dir.path().join("d2/f2499").is_file());
        assert!(!dir.path().join("d3").exists());
    }
}
