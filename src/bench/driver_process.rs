//! A driver we start ourselves (`sh -c COMMAND`): waiting until Probe says ready, its memory
//! from /proc, and stopping it with SIGTERM (SIGKILL if it does not stop, or when dropped).

use std::fs;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tonic::transport::Channel;

use crate::client::{self, Csi};

/// How often readiness is polled while the socket is not there yet.
const POLL: Duration = Duration::from_millis(1);
/// How long the driver may take to stop after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Shells that may stand between us and the driver when they do not exec a simple command.
const SHELLS: &[&str] = &["sh", "bash", "dash", "ash", "zsh", "busybox"];

pub struct DriverProcess {
    child: Option<Child>,
    started: Instant,
    /// The serving process, once known (see `driver_pid`).
    driver: Option<u32>,
}

/// A started driver that answered Probe with ready.
pub struct Ready {
    pub channel: Channel,
    /// From spawning the command to the first successful Probe.
    pub elapsed: Duration,
    /// The driver's own pid (below any shell).
    pub pid: u32,
}

impl DriverProcess {
    /// Runs `command` with `sh -c`. Its stdout goes to our stderr, so our stdout stays the report.
    pub fn start(command: &str) -> Result<DriverProcess, String> {
        use std::os::fd::AsFd;
        let stdout = std::io::stderr()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| format!("duplicating stderr: {e}"))?;
        let started = Instant::now();
        let child = Command::new("sh")
            .arg("-c")
            .arg(command)
            .stdin(Stdio::null())
            .stdout(stdout)
            .spawn()
            .map_err(|e| format!("starting `sh -c {command:?}`: {e}"))?;
        Ok(DriverProcess {
            child: Some(child),
            started,
            driver: None,
        })
    }

    /// Polls the socket until Probe answers ready, the process exits, or `timeout` passes.
    pub async fn wait_ready(
        &mut self,
        socket: &Path,
        deadline: Duration,
        timeout: Duration,
    ) -> Result<Ready, String> {
        loop {
            if let Some(status) = self.try_wait()? {
                return Err(format!(
                    "the driver exited with {status} before it was ready"
                ));
            }
            if let Ok(channel) = client::connect(socket, deadline).await {
                let csi = Csi::new(channel.clone(), deadline);
                if let Ok(true) = client::probe(&csi).await {
                    let elapsed = self.started.elapsed();
                    let pid = self.driver_pid();
                    self.driver = Some(pid);
                    return Ok(Ready {
                        channel,
                        elapsed,
                        pid,
                    });
                }
            }
            if self.started.elapsed() > timeout {
                return Err(format!(
                    "the driver was not ready on {} within {timeout:?}",
                    socket.display()
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn try_wait(&mut self) -> Result<Option<ExitStatus>, String> {
        match self.child.as_mut() {
            Some(child) => child
                .try_wait()
                .map_err(|e| format!("waiting for the driver: {e}")),
            None => Err("the driver was already stopped".into()),
        }
    }

    /// The process that serves: the spawned shell, or the one process it runs if it did not exec.
    fn driver_pid(&self) -> u32 {
        let mut pid = self.child.as_ref().map_or(0, Child::id);
        loop {
            let is_shell = comm(pid).is_some_and(|c| SHELLS.contains(&c.as_str()));
            match (is_shell, children(pid).as_slice()) {
                (true, [only]) => pid = *only,
                _ => return pid,
            }
        }
    }

    /// SIGTERM to the driver (a shell above it exits with it), then waits; SIGKILL to the whole
    /// tree after a timeout. Err when it had to be killed or exited unsuccessfully.
    pub async fn stop(&mut self) -> Result<(), String> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let driver = self.driver.unwrap_or(child.id());
        // SAFETY: kill(2) has no memory effects; the pid is our child or its descendant.
        unsafe { libc::kill(driver as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => return Err(format!("the driver exited with {status}")),
                Ok(None) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                Ok(None) => {
                    signal_tree(child.id(), libc::SIGKILL);
                    let _ = child.wait();
                    return Err(format!(
                        "the driver did not stop within {STOP_TIMEOUT:?} of SIGTERM; killed"
                    ));
                }
                Err(err) => return Err(format!("waiting for the driver: {err}")),
            }
        }
    }
}

impl Drop for DriverProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal_tree(child.id(), libc::SIGKILL);
            let _ = child.wait();
        }
    }
}

/// Sends `signal` to `root` and all its descendants, deepest first.
fn signal_tree(root: u32, signal: libc::c_int) {
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let kids = children(tree[i]);
        tree.extend(kids);
        i += 1;
    }
    for pid in tree.into_iter().rev() {
        // SAFETY: kill(2) has no memory effects; the pids are our descendants.
        unsafe { libc::kill(pid as libc::pid_t, signal) };
    }
}

/// Children of `pid`, from /proc/<pid>/task/*/children.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

fn comm(pid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// A field of /proc/<pid>/status given in kB (VmRSS, VmHWM).
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.trim().strip_suffix("kB")?.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_memory_is_readable() {
        let pid = std::process::id();
        assert!(status_kib(pid, "VmRSS").unwrap() > 0);
        assert!(status_kib(pid, "VmHWM").unwrap() >= status_kib(pid, "VmRSS").unwrap() / 2);
        assert_eq!(status_kib(pid, "Nope"), None);
    }
}
