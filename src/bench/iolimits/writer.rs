//! The writers: each a process of its own (`stickyvol-bench io-writer`, hidden) that moves
//! itself into a pod's container cgroup, opens its volume's device or file with `O_DIRECT`,
//! says it is ready, waits for the word to start, then does `block-io`'s 4 KiB random writes at
//! queue depth 1 for the runtime and prints its figures as JSON.
//!
//! A process, not a thread of ours, is moved, by its pid in `cgroup.procs`: under cgroup v2 a
//! thread can leave its process's cgroup only within a threaded subtree, and the io controller
//! is not a threaded one, so an IO limit applies to whole processes; under v1 a thread could be
//! moved alone (its tid in `tasks`), but one way that holds on both is simpler, and our own
//! threads (the CSI client, the driver's pipe) stay outside every pod.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::blockio::{Case, Pattern, Side, run_case};
use crate::cli::IoWriterArgs;

/// The one case every writer runs.
const CASE: Case = Case {
    pattern: Pattern::RandWrite,
    block_size: 4096,
    queue_depth: 1,
};
/// How long past its runtime a writer may take before it is killed.
const GRACE: Duration = Duration::from_secs(60);

/// What a writer prints when done.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WriterOutput {
    pub side: Side,
    /// The I/O errors that stopped its thread.
    pub errors: Vec<String>,
}

/// The writer process's own work (`io-writer`): its figures, or why it could not write.
pub fn run(args: &IoWriterArgs) -> Result<WriterOutput, String> {
    let procs = &args.cgroup_procs;
    fs::write(procs, std::process::id().to_string())
        .map_err(|e| format!("joining {}: {e}", procs.display()))?;
    let file = open_direct(&args.path)?;
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "ready").map_err(|e| e.to_string())?;
    stdout.flush().map_err(|e| e.to_string())?;
    let mut go = String::new();
    io::stdin()
        .read_line(&mut go)
        .map_err(|e| format!("waiting for the start: {e}"))?;
    if go.trim() != "go" {
        return Err("not told to start".into());
    }
    let (side, errors) = run_case(&file, args.size, CASE, args.runtime);
    Ok(WriterOutput { side, errors })
}

/// A block device exclusively (refused if anyone else holds it), a file as it is; both for
/// direct IO, so that every write reaches the device as the writer's own.
fn open_direct(path: &Path) -> Result<File, String> {
    let block = fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
    let flags = libc::O_DIRECT | if block { libc::O_EXCL } else { 0 };
    OpenOptions::new()
        .write(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| format!("opening {} for direct IO: {e}", path.display()))
}

/// One writer to start: the cgroup it joins and what it writes (`size` bytes from the start).
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    pub(crate) cgroup_procs: PathBuf,
    pub(crate) path: PathBuf,
    pub(crate) size: u64,
}

/// A started writer process, killed and reaped if dropped before it is done (its cgroup can
/// only be removed once it has no process).
struct Running {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Runs `writers` together for `runtime` (each started once all are ready): each one's
/// figures, in order, or the first reason they could not run.
pub(crate) fn run_together(
    writers: &[Writer],
    runtime: Duration,
) -> Result<Vec<WriterOutput>, String> {
    // Our own binary as the kernel holds it: a rebuild that replaces the file on disk during a
    // run (a shared target directory) leaves `current_exe()` naming a deleted path.
    let exe = Path::new("/proc/self/exe");
    let mut running = Vec::new();
    for writer in writers {
        running.push(spawn(exe, writer, runtime)?);
    }
    for one in &mut running {
        let mut line = String::new();
        one.stdout.read_line(&mut line).map_err(|e| e.to_string())?;
        if line.trim() != "ready" {
            return Err(failure(one, "did not get ready"));
        }
    }
    for one in &mut running {
        let stdin = one.child.stdin.as_mut().expect("stdin is piped");
        stdin
            .write_all(b"go\n")
            .map_err(|e| format!("starting a writer: {e}"))?;
    }
    let deadline = Instant::now() + runtime + GRACE;
    running
        .iter_mut()
        .map(|one| finish(one, deadline))
        .collect()
}

fn spawn(exe: &Path, writer: &Writer, runtime: Duration) -> Result<Running, String> {
    let mut child = Command::new(exe)
        .arg("io-writer")
        .arg("--cgroup-procs")
        .arg(&writer.cgroup_procs)
        .arg("--path")
        .arg(&writer.path)
        .arg("--size")
        .arg(writer.size.to_string())
        .arg("--runtime")
        .arg(format!("{}ms", runtime.as_millis()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {} io-writer: {e}", exe.display()))?;
    let stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
    Ok(Running { child, stdout })
}

/// Waits for `one` until `deadline` (killed then) and reads its figures.
fn finish(one: &mut Running, deadline: Instant) -> Result<WriterOutput, String> {
    loop {
        match one.child.try_wait().map_err(|e| e.to_string())? {
            Some(status) if status.success() => break,
            Some(_) => return Err(failure(one, "failed")),
            None if Instant::now() >= deadline => {
                return Err(failure(one, "overstayed its runtime and was killed"));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let mut json = String::new();
    one.stdout
        .read_to_string(&mut json)
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&json).map_err(|e| format!("a writer's report {json:?}: {e}"))
}

/// Kills `one` (if still running) and says `what` with its stderr.
fn failure(one: &mut Running, what: &str) -> String {
    let _ = one.child.kill();
    let _ = one.child.wait();
    let mut stderr = String::new();
    if let Some(pipe) = one.child.stderr.as_mut() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    format!("a writer {what}: {}", stderr.trim())
}
