//! `group-snapshot`: how long a group snapshot holds its members' writers.
//!
//! `--members` volumes (image volumes of `--fs-type`, or whatever the flags make) are created,
//! staged and published as kubelet would; each gets a writer thread rewriting 4 KiB blocks of a
//! 1 MiB region of a file of its own (so nothing grows and nothing waits for writeback), timing
//! every `pwrite`. Then `--cuts` times: the writers' longest write over a quiet spell as long as
//! the last cut (what a write costs without a cut), CreateVolumeGroupSnapshot of every volume,
//! the writers' longest write during it, and DeleteVolumeGroupSnapshot. A write caught by a
//! freeze waits until its filesystem is thawed, so the longest write during a cut, over all
//! members, is the window the writers were held, as they felt it. Everything is undone, also
//! after a failure: the writers stopped, the file removed, the volumes detached and deleted.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use stickyvol::csi;

use crate::cli::GroupSnapshotArgs;
use crate::client::{DriverInfo, timed};
use crate::paths::MadeDirs;
use crate::report::{Recorder, Rpc, RpcSummary, percentile};
use crate::workload::{Attachment, Fatal, Session, Target, ready_to_work};

/// The file each writer rewrites, in its volume.
const WRITER_FILE: &str = ".stickyvol-bench-group";
/// The region of it rewritten, in 4 KiB blocks.
const REGION_BLOCKS: u64 = 256;

#[derive(Debug, Serialize)]
pub struct GroupSnapshotReport {
    pub workload: &'static str,
    pub driver: DriverInfo,
    pub members: usize,
    pub fs_type: String,
    pub size_bytes: i64,
    pub cuts: usize,
    /// The longest write of any member during each cut: how long the writers were held.
    pub writers_held_us: Spread,
    /// The same over a quiet spell as long as the cut before it: a write's cost without one.
    pub quiet_longest_write_us: Spread,
    pub rpcs: std::collections::BTreeMap<&'static str, RpcSummary>,
    pub errors_total: u64,
    /// Writes that failed (a writer stops at its first).
    pub write_errors: Vec<String>,
    pub discovery: std::collections::BTreeMap<&'static str, RpcSummary>,
    pub leftovers: Vec<String>,
}

/// p50, p99 and the most of a sample, in microseconds.
#[derive(Debug, Default, Serialize)]
pub struct Spread {
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

impl Spread {
    fn of(mut sample: Vec<u64>) -> Spread {
        sample.sort_unstable();
        Spread {
            p50: percentile(&sample, 50.0),
            p99: percentile(&sample, 99.0),
            max: sample.last().copied().unwrap_or(0),
        }
    }
}

pub fn text(report: &GroupSnapshotReport) -> String {
    let ms = |us: u64| us as f64 / 1000.0;
    let line = |what: &str, s: &Spread| {
        format!(
            "{what:<40} p50 {:>8.2} ms   p99 {:>8.2} ms   max {:>8.2} ms\n",
            ms(s.p50),
            ms(s.p99),
            ms(s.max)
        )
    };
    let mut out = format!(
        "group-snapshot: {} ({}), {} members ({} bytes, fsType {:?}), {} cuts\n",
        report.driver.name,
        report.driver.vendor_version,
        report.members,
        report.size_bytes,
        report.fs_type,
        report.cuts
    );
    out += &line(
        "writers held (longest write in a cut)",
        &report.writers_held_us,
    );
    out += &line("longest write, no cut", &report.quiet_longest_write_us);
    for (rpc, summary) in &report.rpcs {
        out += &format!(
            "{rpc:<40} p50 {:>8.2} ms   p99 {:>8.2} ms   ({} calls, {} failed)\n",
            ms(summary.p50_us),
            ms(summary.p99_us),
            summary.count,
            summary.errors
        );
    }
    out
}

/// One member's writer: its longest write since the last `take`.
struct Writer {
    stop: Arc<AtomicBool>,
    longest_us: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<Option<String>>>,
    path: PathBuf,
}

impl Writer {
    fn start(dir: &Path) -> Result<Writer, Fatal> {
        let path = dir.join(WRITER_FILE);
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)
            .map_err(|e| format!("creating {}: {e}", path.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let longest_us = Arc::new(AtomicU64::new(0));
        let (flag, longest) = (stop.clone(), longest_us.clone());
        let thread = std::thread::Builder::new()
            .name("group-writer".into())
            .spawn(move || rewrite(&file, &flag, &longest))
            .map_err(|e| format!("starting a writer: {e}"))?;
        Ok(Writer {
            stop,
            longest_us,
            thread: Some(thread),
            path,
        })
    }

    fn take(&self) -> u64 {
        self.longest_us.swap(0, Ordering::Relaxed)
    }

    /// Stops the writer and removes its file: the write error that stopped it, if one did.
    fn finish(mut self) -> Option<String> {
        self.stop.store(true, Ordering::Relaxed);
        let failed = self.thread.take().and_then(|t| t.join().ok()).flatten();
        let _ = std::fs::remove_file(&self.path);
        failed
    }
}

/// Rewrites the region block by block until stopped, keeping the longest write.
fn rewrite(file: &File, stop: &AtomicBool, longest_us: &AtomicU64) -> Option<String> {
    let block = [0x5au8; 4096];
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        if let Err(err) = file.write_all_at(&block, (n % REGION_BLOCKS) * 4096) {
            return Some(format!("a writer's write failed: {err}"));
        }
        let took = started.elapsed().as_micros() as u64;
        longest_us.fetch_max(took, Ordering::Relaxed);
        n += 1;
        // A short pause: the writers share two cores with the driver.
        std::thread::sleep(Duration::from_micros(200));
    }
    None
}

/// What the run made, to undo.
struct Run {
    recorder: Recorder,
    dirs: MadeDirs,
    volumes: Vec<csi::Volume>,
    attachments: Vec<Attachment>,
    writers: Vec<Writer>,
    write_errors: Vec<String>,
    leftovers: Vec<String>,
}

pub async fn group_snapshot(args: &GroupSnapshotArgs) -> Result<GroupSnapshotReport, Fatal> {
    if args.members == 0 || args.cuts == 0 {
        return Err("--members and --cuts must be positive".into());
    }
    let common = args.common();
    let (session, target, discovery, base_dirs) =
        ready_to_work(Session::open(&common).await?, &common).await?;
    let mut run = Run {
        recorder: Recorder::default(),
        dirs: base_dirs,
        volumes: Vec::new(),
        attachments: Vec::new(),
        writers: Vec::new(),
        write_errors: Vec::new(),
        leftovers: Vec::new(),
    };
    let measured = match prepare(args, &target, &mut run).await {
        Ok(()) => measure(args, &target, &mut run).await,
        Err(err) => Err(err),
    };
    undo(&target, &mut run).await;
    if let Err(err) = session.close().await {
        run.leftovers.push(err);
    }
    let (held, quiet) = measured?;
    Ok(GroupSnapshotReport {
        workload: "group-snapshot",
        driver: target.info.clone(),
        members: args.members,
        fs_type: args.fs_type.clone(),
        size_bytes: args.size,
        cuts: args.cuts,
        writers_held_us: Spread::of(held),
        quiet_longest_write_us: Spread::of(quiet),
        rpcs: run.recorder.summary(),
        errors_total: discovery.errors() + run.recorder.errors() + run.write_errors.len() as u64,
        write_errors: run.write_errors,
        discovery: discovery.summary(),
        leftovers: run.leftovers,
    })
}

/// The members created, attached as kubelet attaches them, and a writer started on each.
async fn prepare(args: &GroupSnapshotArgs, target: &Target, run: &mut Run) -> Result<(), Fatal> {
    for i in 0..args.members {
        let name = format!("{}-group-{i}", target.run_id);
        let volume = target
            .create(&name, &mut run.recorder)
            .await
            .ok_or_else(|| format!("CreateVolume of member {i} failed"))?;
        run.volumes.push(volume.clone());
        let (attachment, attached) = target
            .attach(&volume, &name, &mut run.dirs, &mut run.recorder)
            .await;
        let target_dir = attachment.target.clone();
        run.attachments.push(attachment);
        attached.map_err(|err| format!("attaching member {i}: {err}"))?;
        run.writers.push(Writer::start(&target_dir)?);
    }
    Ok(())
}

/// `--cuts` group snapshots, each after a quiet spell as long as the cut before it: the
/// writers' longest write in each cut and in each spell.
async fn measure(
    args: &GroupSnapshotArgs,
    target: &Target,
    run: &mut Run,
) -> Result<(Vec<u64>, Vec<u64>), Fatal> {
    let sources: Vec<String> = run.volumes.iter().map(|v| v.volume_id.clone()).collect();
    let (mut held, mut quiet) = (Vec::new(), Vec::new());
    let mut spell = Duration::from_millis(20);
    for cut in 0..args.cuts {
        longest(&run.writers);
        tokio::time::sleep(spell).await;
        quiet.push(longest(&run.writers));
        let started = Instant::now();
        let request = csi::CreateVolumeGroupSnapshotRequest {
            name: format!("{}-cut-{cut}", target.run_id),
            source_volume_ids: sources.clone(),
            ..Default::default()
        };
        let mut group = target.csi.group.clone();
        let made = timed(
            &mut run.recorder,
            Rpc::CreateVolumeGroupSnapshot,
            group.create_volume_group_snapshot(target.csi.request(request)),
        )
        .await;
        spell = started.elapsed().max(Duration::from_millis(1));
        held.push(longest(&run.writers));
        let made = made
            .map_err(|s| format!("CreateVolumeGroupSnapshot: {:?}: {}", s.code(), s.message()))?;
        let id = made
            .group_snapshot
            .map(|g| g.group_snapshot_id)
            .unwrap_or_default();
        let delete = csi::DeleteVolumeGroupSnapshotRequest {
            group_snapshot_id: id,
            ..Default::default()
        };
        timed(
            &mut run.recorder,
            Rpc::DeleteVolumeGroupSnapshot,
            group.delete_volume_group_snapshot(target.csi.request(delete)),
        )
        .await
        .map_err(|s| format!("DeleteVolumeGroupSnapshot: {:?}: {}", s.code(), s.message()))?;
    }
    Ok((held, quiet))
}

/// The longest write of any writer since the last look.
fn longest(writers: &[Writer]) -> u64 {
    writers.iter().map(Writer::take).max().unwrap_or(0)
}

/// Writers stopped, volumes detached and deleted, directories removed; what could not be undone
/// goes to the leftovers.
async fn undo(target: &Target, run: &mut Run) {
    for writer in run.writers.drain(..) {
        if let Some(failed) = writer.finish() {
            run.write_errors.push(failed);
        }
    }
    for attachment in run.attachments.drain(..).rev() {
        if !target.detach(&attachment, &mut run.recorder).await.0 {
            run.leftovers
                .push(format!("volume {} not detached", attachment.volume_id));
        }
    }
    for volume in run.volumes.drain(..) {
        if !target.delete(&volume.volume_id, &mut run.recorder).await {
            run.leftovers
                .push(format!("volume {} not deleted", volume.volume_id));
        }
    }
    run.leftovers.extend(run.dirs.remove());
}
