//! `fs-io`: direct I/O in a file on a volume with a filesystem of its own (`--fs-type`, an
//! image volume for stickyvol), side by side with the same in a file on a directory volume
//! (fsType empty) of the same driver and pool: what the image's own filesystem and its loop
//! device cost. Both volumes are staged and published as kubelet would; the cases are
//! `block-io`'s.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::blockio::{Side, cases, create_direct, fill_once, push_errors, run_case_on_both};
use crate::cli::FsIoArgs;
use crate::client::DriverInfo;
use crate::paths::MadeDirs;
use crate::report::{Recorder, RpcSummary};
use crate::workload::{Attachment, Fatal, Session, Target, path_string, ready_to_work};

#[derive(Debug, Clone, Serialize)]
pub struct FsIoCase {
    pub name: String,
    pub block_size: usize,
    pub queue_depth: usize,
    pub image: Side,
    pub directory: Side,
    /// Image MiB/s over the directory's.
    pub ratio: f64,
}

#[derive(Debug, Serialize)]
pub struct FsIoReport {
    pub workload: &'static str,
    pub driver: DriverInfo,
    pub fs_type: String,
    pub file_bytes: u64,
    pub volume_bytes: i64,
    pub runtime_s: f64,
    pub fill_image_s: f64,
    pub fill_directory_s: f64,
    pub cases: Vec<FsIoCase>,
    pub rpcs: std::collections::BTreeMap<&'static str, RpcSummary>,
    pub io_errors: Vec<String>,
    pub errors_total: u64,
    pub leftovers: Vec<String>,
}

pub async fn fs_io(args: &FsIoArgs) -> Result<FsIoReport, Fatal> {
    let file_bytes = args.size;
    if file_bytes < (1 << 20) || file_bytes % (1 << 20) != 0 {
        return Err(format!(
            "--size {file_bytes} must be a positive multiple of 1 MiB"
        ));
    }
    // Room for the filesystem's own metadata around the file.
    let volume_bytes = file_bytes + file_bytes / 4 + (64 << 20);
    let common = args.common(volume_bytes);
    let session = Session::open(&common).await?;
    let (session, mut target, discovery, mut base_dirs) = ready_to_work(session, &common).await?;
    let mut recorder = Recorder::default();
    let mut dirs = MadeDirs::default();
    let mut attached = Vec::new();
    let mut outcome = Ok(None);
    for (side, fs_type) in [("image", args.fs_type.as_str()), ("directory", "")] {
        target.set_fs_type(fs_type);
        let name = format!("{}-fsio-{side}", target.run_id);
        let Some(volume) = target.create(&name, &mut recorder).await else {
            outcome = Err(format!("CreateVolume of the {side} volume failed"));
            break;
        };
        let (attachment, result) = target
            .attach(&volume, &name, &mut dirs, &mut recorder)
            .await;
        attached.push((attachment, volume.volume_id));
        if let Err(failure) = result {
            outcome = Err(format!("attaching the {side} volume: {failure}"));
            break;
        }
    }
    if outcome.is_ok() && attached.len() == 2 {
        let paths = [attached[0].0.target.clone(), attached[1].0.target.clone()];
        let runtime = args.runtime;
        let size = file_bytes;
        outcome = tokio::task::spawn_blocking(move || measure(&paths, size, runtime))
            .await
            .map_err(|e| format!("the I/O thread failed: {e}"))
            .and_then(|measured| measured.map(Some));
    }
    for (attachment, volume_id) in &attached {
        detach_and_delete(&target, attachment, volume_id, &mut recorder).await;
    }
    let mut leftovers: Vec<String> = dirs
        .remove()
        .into_iter()
        .chain(base_dirs.remove())
        .collect();
    if let Err(err) = session.close().await {
        leftovers.push(err);
    }
    let (fill, cases, io_errors) = outcome?.ok_or("no volumes to measure")?;
    let io_error_count: u64 = cases
        .iter()
        .map(|c| c.image.errors + c.directory.errors)
        .sum();
    Ok(FsIoReport {
        workload: "fs-io",
        driver: target.info.clone(),
        fs_type: args.fs_type.clone(),
        file_bytes: file_bytes as u64,
        volume_bytes,
        runtime_s: args.runtime.as_secs_f64(),
        fill_image_s: fill[0],
        fill_directory_s: fill[1],
        cases,
        rpcs: recorder.summary(),
        errors_total: discovery.errors() + recorder.errors() + io_error_count,
        io_errors,
        leftovers,
    })
}

async fn detach_and_delete(
    target: &Target,
    attachment: &Attachment,
    volume_id: &str,
    recorder: &mut Recorder,
) {
    target.detach(attachment, recorder).await;
    target.delete(volume_id, recorder).await;
}

type Measured = ([f64; 2], Vec<FsIoCase>, Vec<String>);

/// A file of `size` bytes in each published volume (image first), filled once, then every
/// case on one and then the other; the files are removed at the end.
fn measure(targets: &[PathBuf; 2], size: i64, runtime: Duration) -> Result<Measured, Fatal> {
    let size = size as u64;
    let paths = targets.clone().map(|dir| dir.join(".stickyvol-bench-fsio"));
    let files = [open(&paths[0], size)?, open(&paths[1], size)?];
    let result = run_all(&files, &paths, size, runtime);
    drop(files);
    for path in &paths {
        let _ = std::fs::remove_file(path);
    }
    result
}

fn open(path: &Path, size: u64) -> Result<File, Fatal> {
    let file = create_direct(path)
        .map_err(|e| format!("creating {} for direct I/O: {e}", path.display()))?;
    file.set_len(size)
        .map_err(|e| format!("sizing {}: {e}", path.display()))?;
    Ok(file)
}

fn run_all(
    files: &[File; 2],
    paths: &[PathBuf; 2],
    size: u64,
    runtime: Duration,
) -> Result<Measured, Fatal> {
    let mut fill = [0.0; 2];
    for (i, file) in files.iter().enumerate() {
        eprintln!("filling {} ({} MiB)…", path_string(&paths[i]), size >> 20);
        fill[i] =
            fill_once(file, size).map_err(|e| format!("filling {}: {e}", paths[i].display()))?;
    }
    let mut io_errors = Vec::new();
    let mut reports = Vec::new();
    for case in cases() {
        let (image, directory, ratio) =
            run_case_on_both([&files[0], &files[1]], size, case, runtime, &mut io_errors);
        reports.push(FsIoCase {
            name: case.name(),
            block_size: case.block_size,
            queue_depth: case.queue_depth,
            image,
            directory,
            ratio,
        });
    }
    io_errors.truncate(10);
    Ok((fill, reports, io_errors))
}

pub fn text(r: &FsIoReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "fs-io: a {} MiB file with O_DIRECT in a {} volume ({} bytes) and in a directory volume; fill {:.2} s / {:.2} s; {:.1} s per case and side",
        r.file_bytes >> 20,
        r.fs_type,
        r.volume_bytes,
        r.fill_image_s,
        r.fill_directory_s,
        r.runtime_s
    );
    let _ = writeln!(
        out,
        "{:<18} {:>11} {:>11} {:>11} {:>11} {:>9} {:>9} {:>6}",
        "case", "img IOPS", "dir IOPS", "img MiB/s", "dir MiB/s", "img p50", "dir p50", "ratio"
    );
    for c in &r.cases {
        let _ = writeln!(
            out,
            "{:<18} {:>11.0} {:>11.0} {:>11.1} {:>11.1} {:>9.1} {:>9.1} {:>6.2}",
            c.name,
            c.image.iops,
            c.directory.iops,
            c.image.mib_per_s,
            c.directory.mib_per_s,
            c.image.p50_us,
            c.directory.p50_us,
            c.ratio
        );
    }
    let _ = writeln!(
        out,
        "(latencies in µs; ratio = image / directory throughput)"
    );
    push_errors(&mut out, &r.io_errors, &r.rpcs);
    out
}
