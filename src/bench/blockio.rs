//! The `block-io` workload: direct I/O through one published block volume, and the same cases
//! on a plain file of the same size on the filesystem of the volume's data, side by side.
//!
//! One volume is created and published (following the driver's capabilities, as `lifecycle`
//! does); the tool opens the published target with `O_DIRECT | O_EXCL` (a block device claimed
//! by a mount or by anyone else refuses `O_EXCL`) after checking it is a block device at least
//! as large as asked for. The plain file is made with `O_CREAT | O_EXCL` under a name of this
//! run and removed at the end, so nothing but our own device and our own file is ever written.
//!
//! Both start sparse, as the driver makes thin block files; before any case both are written
//! once from end to end (1 MiB direct writes, then fsync), so every case, reads and writes,
//! meets allocated, written blocks on either side. Each case then runs for `--runtime` on the
//! device and right after on the plain file. A queue depth of N is N threads, each doing
//! synchronous `pread`/`pwrite` on its own aligned buffer; sequential cases share one cursor
//! (each thread takes the next block, wrapping at the end), random cases draw block-aligned
//! offsets uniformly.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cli::BlockIoArgs;
use crate::client::DriverInfo;
use crate::paths::MadeDirs;
use crate::report::{Recorder, RpcSummary, percentile};
use crate::workload::{Fatal, Session, path_string, ready_to_work};

/// Alignment of every buffer and offset: enough for any logical block size up to 4 KiB.
const ALIGN: usize = 4096;
const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
/// Block size of the fill that writes both sides once before the cases.
const FILL_BLOCK: usize = MIB;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    RandRead,
    RandWrite,
    SeqRead,
    SeqWrite,
}

impl Pattern {
    fn name(self) -> &'static str {
        match self {
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
            Pattern::SeqRead => "seqread",
            Pattern::SeqWrite => "seqwrite",
        }
    }

    fn writes(self) -> bool {
        matches!(self, Pattern::RandWrite | Pattern::SeqWrite)
    }

    fn random(self) -> bool {
        matches!(self, Pattern::RandRead | Pattern::RandWrite)
    }
}

/// One case: a pattern, a block size, a queue depth (threads).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Case {
    pub(crate) pattern: Pattern,
    pub(crate) block_size: usize,
    pub(crate) queue_depth: usize,
}

impl Case {
    pub(crate) fn name(&self) -> String {
        let size = if self.block_size >= MIB {
            format!("{}m", self.block_size / MIB)
        } else {
            format!("{}k", self.block_size / KIB)
        };
        format!("{}-{size}-qd{}", self.pattern.name(), self.queue_depth)
    }
}

/// The eight cases, in the order they run: writes first, then reads of what was written.
pub(crate) fn cases() -> Vec<Case> {
    let mut all = Vec::new();
    for queue_depth in [1, 32] {
        for (pattern, block_size) in [
            (Pattern::SeqWrite, MIB),
            (Pattern::RandWrite, 4 * KIB),
            (Pattern::SeqRead, MIB),
            (Pattern::RandRead, 4 * KIB),
        ] {
            all.push(Case {
                pattern,
                block_size,
                queue_depth,
            });
        }
    }
    all
}

/// What one side (device or plain file) did in one case.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Side {
    pub ops: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub iops: f64,
    pub mib_per_s: f64,
    /// Latency of one pread/pwrite, from the full sample, µs.
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// Failed operations (each stops its thread); the first messages are in `io_errors`.
    pub errors: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    /// e.g. `randread-4k-qd32`.
    pub name: String,
    pub pattern: Pattern,
    pub block_size: usize,
    pub queue_depth: usize,
    pub device: Side,
    pub plain_file: Side,
    /// Device MiB/s (= IOPS) over the plain file's.
    pub ratio: f64,
}

/// The published device, as sysfs describes it (what the tuning changes).
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeviceInfo {
    /// The published target.
    pub target: String,
    /// What the target resolves to, e.g. /dev/loop3.
    pub device: String,
    pub size_bytes: u64,
    /// For loop devices: the backing file and whether the loop driver uses direct I/O on it.
    pub backing_file: Option<String>,
    pub loop_direct_io: Option<bool>,
    pub logical_block_size: Option<u64>,
    pub scheduler: Option<String>,
    pub nr_requests: Option<u64>,
    pub rotational: Option<u64>,
    pub max_sectors_kb: Option<u64>,
}

/// The one-time fill of both sides before the cases.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Fill {
    pub device_s: f64,
    pub plain_file_s: f64,
}

#[derive(Debug, Serialize)]
pub struct BlockIoReport {
    pub workload: &'static str,
    pub driver: DriverInfo,
    pub size_bytes: i64,
    pub runtime_s: f64,
    pub device: DeviceInfo,
    /// The plain file compared with (removed at the end).
    pub plain_file: String,
    /// Both sides written once from end to end before the cases.
    pub fill: Fill,
    pub cases: Vec<CaseReport>,
    /// CreateVolume, (ControllerPublish, NodeStage,) NodePublish and their teardown.
    pub rpcs: std::collections::BTreeMap<&'static str, RpcSummary>,
    pub discovery: std::collections::BTreeMap<&'static str, RpcSummary>,
    /// Failed calls and failed I/O operations.
    pub errors_total: u64,
    /// The first I/O error messages.
    pub io_errors: Vec<String>,
    /// Things of ours that could not be removed.
    pub leftovers: Vec<String>,
}

pub async fn block_io(args: &BlockIoArgs) -> Result<BlockIoReport, Fatal> {
    if args.size < FILL_BLOCK as i64 || args.size % FILL_BLOCK as i64 != 0 {
        return Err(format!(
            "--size {} must be a positive multiple of 1 MiB",
            args.size
        ));
    }
    let common = args.common();
    let session = Session::open(&common).await?;
    let (session, target, discovery, mut base_dirs) = ready_to_work(session, &common).await?;
    let mut recorder = Recorder::default();
    let mut dirs = MadeDirs::default();
    let mut leftovers = Vec::new();
    let name = format!("{}-blockio", target.run_id);
    let outcome = match target.create(&name, &mut recorder).await {
        None => Err("CreateVolume failed".to_string()),
        Some(volume) => {
            let (attachment, attached) = target
                .attach(&volume, &name, &mut dirs, &mut recorder)
                .await;
            let measured = match attached {
                Ok(_) => measure(args, &attachment.target).await,
                Err(failure) => Err(failure.to_string()),
            };
            target.detach(&attachment, &mut recorder).await;
            target.delete(&volume.volume_id, &mut recorder).await;
            measured
        }
    };
    leftovers.extend(dirs.remove());
    leftovers.extend(base_dirs.remove());
    if let Err(err) = session.close().await {
        leftovers.push(err);
    }
    let measured = outcome?;
    let io_error_count: u64 = measured
        .cases
        .iter()
        .map(|c| c.device.errors + c.plain_file.errors)
        .sum();
    Ok(BlockIoReport {
        workload: "block-io",
        driver: target.info,
        size_bytes: args.size,
        runtime_s: args.runtime.as_secs_f64(),
        device: measured.device,
        plain_file: path_string(&measured.plain_file),
        fill: measured.fill,
        cases: measured.cases,
        rpcs: recorder.summary(),
        discovery: discovery.summary(),
        errors_total: discovery.errors() + recorder.errors() + io_error_count,
        io_errors: measured.io_errors,
        leftovers: leftovers.into_iter().chain(measured.leftovers).collect(),
    })
}

struct Measured {
    device: DeviceInfo,
    plain_file: PathBuf,
    fill: Fill,
    cases: Vec<CaseReport>,
    io_errors: Vec<String>,
    leftovers: Vec<String>,
}

/// Opens both sides and runs every case on a blocking thread.
async fn measure(args: &BlockIoArgs, target: &Path) -> Result<Measured, Fatal> {
    let size = args.size as u64;
    let runtime = args.runtime;
    let target = target.to_path_buf();
    let plain_dir = args.plain_file_dir.clone();
    tokio::task::spawn_blocking(move || measure_blocking(&target, plain_dir, size, runtime))
        .await
        .map_err(|e| format!("the I/O thread failed: {e}"))?
}

fn measure_blocking(
    target: &Path,
    plain_dir: Option<PathBuf>,
    size: u64,
    runtime: Duration,
) -> Result<Measured, Fatal> {
    let (device_file, device) = open_device(target, size)?;
    let plain_dir = match plain_dir {
        Some(dir) => dir,
        None => default_plain_dir(&device)?,
    };
    let plain_path = plain_dir.join(format!(
        ".stickyvol-bench-plain-{}.img",
        uuid::Uuid::now_v7().simple()
    ));
    let plain = create_direct(&plain_path)
        .map_err(|e| format!("creating the plain file {}: {e}", plain_path.display()))?;
    let mut leftovers = Vec::new();
    let result = run_all(&device_file, &plain, &device, &plain_path, size, runtime);
    drop(plain);
    if let Err(err) = fs::remove_file(&plain_path) {
        leftovers.push(format!("{} left in place: {err}", plain_path.display()));
    }
    let (fill, cases, io_errors) = result?;
    Ok(Measured {
        device,
        plain_file: plain_path,
        fill,
        cases,
        io_errors,
        leftovers,
    })
}

fn run_all(
    device_file: &File,
    plain: &File,
    device: &DeviceInfo,
    plain_path: &Path,
    size: u64,
    runtime: Duration,
) -> Result<(Fill, Vec<CaseReport>, Vec<String>), Fatal> {
    // Sparse, as the driver makes a thin block file; on another filesystem than the device's
    // backing file the comparison means little, and a default directory is refused then.
    plain
        .set_len(size)
        .map_err(|e| format!("sizing {}: {e}", plain_path.display()))?;
    eprintln!(
        "filling {} and {} ({} MiB each)…",
        device.device,
        plain_path.display(),
        size >> 20
    );
    let fill = Fill {
        device_s: fill_once(device_file, size)
            .map_err(|e| format!("filling {}: {e}", device.device))?,
        plain_file_s: fill_once(plain, size)
            .map_err(|e| format!("filling {}: {e}", plain_path.display()))?,
    };
    let mut io_errors = Vec::new();
    let mut reports = Vec::new();
    for case in cases() {
        let (device_side, plain_side, ratio) =
            run_case_on_both([device_file, plain], size, case, runtime, &mut io_errors);
        reports.push(CaseReport {
            name: case.name(),
            pattern: case.pattern,
            block_size: case.block_size,
            queue_depth: case.queue_depth,
            device: device_side,
            plain_file: plain_side,
            ratio,
        });
    }
    io_errors.truncate(10);
    Ok((fill, reports, io_errors))
}

/// A new file of ours (never one that is there already) for direct I/O, readable and writable
/// by its owner alone.
pub(crate) fn create_direct(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

/// Opens the published target for direct I/O, after checking it is a block device of at least
/// `size` bytes that nobody else has claimed (O_EXCL fails on a mounted or claimed device).
fn open_device(target: &Path, size: u64) -> Result<(File, DeviceInfo), Fatal> {
    let resolved = fs::canonicalize(target)
        .map_err(|e| format!("resolving the published target {}: {e}", target.display()))?;
    let metadata = fs::metadata(&resolved).map_err(|e| format!("{}: {e}", resolved.display()))?;
    if !metadata.file_type().is_block_device() {
        return Err(format!(
            "the published target {} ({}) is not a block device",
            target.display(),
            resolved.display()
        ));
    }
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_EXCL)
        .open(&resolved)
        .map_err(|e| {
            format!(
                "opening {} exclusively for direct I/O: {e}",
                resolved.display()
            )
        })?;
    let device_size = file
        .seek(SeekFrom::End(0))
        .map_err(|e| format!("sizing {}: {e}", resolved.display()))?;
    if device_size < size {
        return Err(format!(
            "{} has {device_size} bytes, less than the {size} asked for",
            resolved.display()
        ));
    }
    let name = resolved
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let sys = Path::new("/sys/class/block").join(&name);
    let text = |attribute: &str| {
        fs::read_to_string(sys.join(attribute))
            .ok()
            .map(|t| t.trim().to_string())
    };
    let number = |attribute: &str| text(attribute).and_then(|t| t.parse::<u64>().ok());
    let info = DeviceInfo {
        target: path_string(target),
        device: path_string(&resolved),
        size_bytes: device_size,
        backing_file: text("loop/backing_file"),
        loop_direct_io: number("loop/dio").map(|d| d != 0),
        logical_block_size: number("queue/logical_block_size"),
        scheduler: text("queue/scheduler"),
        nr_requests: number("queue/nr_requests"),
        rotational: number("queue/rotational"),
        max_sectors_kb: number("queue/max_sectors_kb"),
    };
    Ok((file, info))
}

/// The parent of the pool directory holding the loop device's backing file
/// (`<pool>/volumes/<file>` → `<pool>/..`), if it is on the backing file's filesystem.
fn default_plain_dir(device: &DeviceInfo) -> Result<PathBuf, Fatal> {
    let Some(backing) = &device.backing_file else {
        return Err(format!(
            "{} is not a loop device: give --plain-file-dir on the filesystem of its data",
            device.device
        ));
    };
    let backing = Path::new(backing);
    let dir = backing
        .ancestors()
        .nth(3)
        .filter(|d| !d.as_os_str().is_empty())
        .ok_or_else(|| {
            format!(
                "no directory above the backing file {}: give --plain-file-dir",
                backing.display()
            )
        })?;
    let same = match (fs::metadata(backing), fs::metadata(dir)) {
        (Ok(b), Ok(d)) => b.dev() == d.dev(),
        _ => false,
    };
    if !same {
        return Err(format!(
            "{} is not on the filesystem of the backing file {}: give --plain-file-dir",
            dir.display(),
            backing.display()
        ));
    }
    Ok(dir.to_path_buf())
}

/// A zeroed buffer of `len` bytes aligned to [`ALIGN`], as an owned allocation and the
/// offset of the aligned part.
struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize, seed: u64) -> AlignedBuf {
        let mut raw = vec![0u8; len + ALIGN];
        let start = raw.as_ptr().align_offset(ALIGN);
        // Data that is not all zeros, different per thread.
        let mut state = seed | 1;
        for chunk in raw[start..start + len].chunks_mut(8) {
            state = xorshift(state);
            let bytes = state.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        AlignedBuf { raw, start, len }
    }

    fn get(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// Writes `size` bytes from the start in 1 MiB direct writes, then fsync; the seconds taken.
pub(crate) fn fill_once(file: &File, size: u64) -> io::Result<f64> {
    let started = Instant::now();
    let mut buf = AlignedBuf::new(FILL_BLOCK, 0x5eed);
    let mut offset = 0;
    while offset < size {
        file.write_all_at(buf.get(), offset)?;
        offset += FILL_BLOCK as u64;
    }
    file.sync_all()?;
    Ok(started.elapsed().as_secs_f64())
}

/// Runs `case` on the first file and then on the second, adding their I/O errors to
/// `io_errors`: both sides, and the first's MiB/s over the second's (0 if the second did none).
pub(crate) fn run_case_on_both(
    files: [&File; 2],
    size: u64,
    case: Case,
    runtime: Duration,
    io_errors: &mut Vec<String>,
) -> (Side, Side, f64) {
    eprintln!("{}…", case.name());
    let (first, mut errors) = run_case(files[0], size, case, runtime);
    io_errors.append(&mut errors);
    let (second, mut errors) = run_case(files[1], size, case, runtime);
    io_errors.append(&mut errors);
    let ratio = if second.mib_per_s > 0.0 {
        first.mib_per_s / second.mib_per_s
    } else {
        0.0
    };
    (first, second, ratio)
}

/// Runs one case on `file` for `runtime`; the figures and the I/O errors met.
pub(crate) fn run_case(
    file: &File,
    size: u64,
    case: Case,
    runtime: Duration,
) -> (Side, Vec<String>) {
    let shared = CaseRun {
        file,
        case,
        blocks: size / case.block_size as u64,
        runtime,
        cursor: AtomicU64::new(0),
        start: Barrier::new(case.queue_depth + 1),
        begun: OnceLock::new(),
    };
    let results: Vec<ThreadResult> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..case.queue_depth)
            .map(|thread| {
                let shared = &shared;
                scope.spawn(move || shared.thread(thread as u64 + 1))
            })
            .collect();
        shared.start.wait();
        workers
            .into_iter()
            .map(|w| w.join().expect("an I/O thread panicked"))
            .collect()
    });
    side(case, results)
}

/// What the threads of one case share.
struct CaseRun<'a> {
    file: &'a File,
    case: Case,
    blocks: u64,
    runtime: Duration,
    /// The next block of a sequential case, taken in turn by every thread.
    cursor: AtomicU64,
    /// Lets every thread and the caller start together, buffers made.
    start: Barrier,
    /// When the first thread began: all stop `runtime` after it.
    begun: OnceLock<Instant>,
}

/// One thread's latencies (ns), when it finished (ns after the start), and the error that
/// stopped it.
type ThreadResult = (Vec<u64>, u64, Option<String>);

impl CaseRun<'_> {
    /// One thread of the case: transfers a block at a time until the runtime is over or one
    /// fails. `seed` (1 and up) makes its buffer's data and its random offsets its own.
    fn thread(&self, seed: u64) -> ThreadResult {
        let case = self.case;
        let mut buf = AlignedBuf::new(case.block_size, seed);
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ (seed * 0x1000_0001);
        let mut latencies = Vec::with_capacity(1 << 16);
        let mut error = None;
        self.start.wait();
        let began: &Instant = self.begun.get_or_init(Instant::now);
        let until = *began + self.runtime;
        loop {
            let offset = self.next_block(&mut rng) * case.block_size as u64;
            let op = Instant::now();
            let done = if case.pattern.writes() {
                self.file.write_at(buf.get(), offset)
            } else {
                self.file.read_at(buf.get(), offset)
            };
            let finished = Instant::now();
            match done {
                Ok(n) if n == case.block_size => {
                    latencies.push((finished - op).as_nanos() as u64);
                }
                Ok(n) => {
                    error = Some(format!(
                        "{}: short transfer of {n} bytes at {offset}",
                        case.name()
                    ));
                    break;
                }
                Err(e) => {
                    error = Some(format!("{}: at offset {offset}: {e}", case.name()));
                    break;
                }
            }
            if finished >= until {
                break;
            }
        }
        (latencies, finished_at_nanos(began), error)
    }

    /// The block a thread transfers next: drawn from its `rng`, or the shared cursor's.
    fn next_block(&self, rng: &mut u64) -> u64 {
        if self.case.pattern.random() {
            *rng = xorshift(*rng);
            *rng % self.blocks
        } else {
            self.cursor.fetch_add(1, Ordering::Relaxed) % self.blocks
        }
    }
}

/// One side's figures from its threads' results, and the errors that stopped them. The wall
/// time is the last thread's.
fn side(case: Case, results: Vec<ThreadResult>) -> (Side, Vec<String>) {
    let mut latencies = Vec::new();
    let mut wall_ns = 0;
    let mut errors = Vec::new();
    for (mut part, ended, error) in results {
        latencies.append(&mut part);
        wall_ns = wall_ns.max(ended);
        errors.extend(error);
    }
    latencies.sort_unstable();
    let ops = latencies.len() as u64;
    let seconds = wall_ns as f64 / 1e9;
    let per_s = |count: f64| if seconds > 0.0 { count / seconds } else { 0.0 };
    let us = |ns: u64| (ns as f64 / 100.0).round() / 10.0;
    let bytes = ops * case.block_size as u64;
    let side = Side {
        ops,
        bytes,
        seconds,
        iops: per_s(ops as f64),
        mib_per_s: per_s(bytes as f64 / MIB as f64),
        p50_us: us(percentile(&latencies, 50.0)),
        p99_us: us(percentile(&latencies, 99.0)),
        max_us: us(latencies.last().copied().unwrap_or(0)),
        errors: errors.len() as u64,
    };
    (side, errors)
}

fn finished_at_nanos(began: &Instant) -> u64 {
    began.elapsed().as_nanos() as u64
}

/// The side-by-side table.
pub fn text(r: &BlockIoReport) -> String {
    use std::fmt::Write as _;
    let d = &r.device;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "block-io: {} ({} bytes) published at {}",
        d.device, d.size_bytes, d.target
    );
    let _ = writeln!(
        out,
        "device: backing file {}, loop direct I/O {}, logical block {}, scheduler {}, \
         nr_requests {}, rotational {}, max_sectors_kb {}",
        d.backing_file.as_deref().unwrap_or("-"),
        d.loop_direct_io.map_or("-".into(), |v| v.to_string()),
        opt(d.logical_block_size),
        d.scheduler.as_deref().unwrap_or("-"),
        opt(d.nr_requests),
        opt(d.rotational),
        opt(d.max_sectors_kb),
    );
    let _ = writeln!(
        out,
        "plain file: {} (removed); fill: device {:.2} s, plain file {:.2} s; {:.1} s per case and side",
        r.plain_file, r.fill.device_s, r.fill.plain_file_s, r.runtime_s
    );
    let _ = writeln!(
        out,
        "{:<18} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "case",
        "dev IOPS",
        "file IOPS",
        "dev MiB/s",
        "file MiB/s",
        "dev p50",
        "file p50",
        "dev p99",
        "file p99",
        "ratio"
    );
    for c in &r.cases {
        let _ = writeln!(
            out,
            "{:<18} {:>10.0} {:>10.0} {:>10.1} {:>10.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>6.2}",
            c.name,
            c.device.iops,
            c.plain_file.iops,
            c.device.mib_per_s,
            c.plain_file.mib_per_s,
            c.device.p50_us,
            c.plain_file.p50_us,
            c.device.p99_us,
            c.plain_file.p99_us,
            c.ratio
        );
    }
    let _ = writeln!(
        out,
        "(latencies in µs per operation; ratio = device / plain file throughput)"
    );
    push_errors(&mut out, &r.io_errors, &r.rpcs);
    out
}

/// The end of a report's text: the first I/O errors, then the calls that failed.
pub(crate) fn push_errors(
    out: &mut String,
    io_errors: &[String],
    rpcs: &std::collections::BTreeMap<&'static str, RpcSummary>,
) {
    use std::fmt::Write as _;
    for e in io_errors {
        let _ = writeln!(out, "I/O error: {e}");
    }
    *out += &crate::report::errors_section(&crate::report::error_lines_of(rpcs));
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_cases_with_distinct_names() {
        let names: Vec<String> = cases().iter().map(Case::name).collect();
        assert_eq!(names.len(), 8);
        assert!(names.contains(&"randread-4k-qd32".to_string()), "{names:?}");
        assert!(names.contains(&"seqwrite-1m-qd1".to_string()), "{names:?}");
        let unique: std::collections::HashSet<&String> = names.iter().collect();
        assert_eq!(unique.len(), 8);
    }

    #[test]
    fn buffers_are_aligned_and_cases_run_on_a_file() {
        let mut buf = AlignedBuf::new(8192, 3);
        assert_eq!(buf.get().as_ptr() as usize % ALIGN, 0);
        assert_eq!(buf.get().len(), 8192);
        // A plain (buffered) temp file is enough to check the accounting.
        let file = tempfile::tempfile().unwrap();
        file.set_len(4 * MIB as u64).unwrap();
        let case = Case {
            pattern: Pattern::RandWrite,
            block_size: 4 * KIB,
            queue_depth: 2,
        };
        let (side, errors) = run_case(&file, 4 * MIB as u64, case, Duration::from_millis(20));
        assert!(errors.is_empty(), "{errors:?}");
        assert!(side.ops > 0 && side.iops > 0.0 && side.p50_us <= side.p99_us);
        assert_eq!(side.bytes, side.ops * 4096);
    }
}
