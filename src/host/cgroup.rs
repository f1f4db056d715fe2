//! The memory limit of this process's cgroup (v2 `memory.max`, or v1's memory controller
//! `memory.limit_in_bytes`): what the DaemonSet gives the driver, kernel memory charged for
//! the trees it walks included.

use std::fs;
use std::path::{Path, PathBuf};

/// Limits at or above this mean "none": cgroup v1 writes its "unlimited" as a page-rounded
/// i64::MAX.
const UNLIMITED: u64 = 1 << 60;

/// This process's memory limit in bytes; None if it has none or it cannot be read.
pub fn memory_limit() -> Option<u64> {
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    limit_from(&own, |path| fs::read_to_string(path).ok())
}

/// The limit `/proc/self/cgroup`'s text `own` leads to, reading files with `read`. On a hybrid
/// host the v2 line names a hierarchy without the memory controller: its file is absent, and the
/// v1 memory line decides.
fn limit_from(own: &str, read: impl Fn(&Path) -> Option<String>) -> Option<u64> {
    own.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        let file: PathBuf = if controllers.is_empty() {
            Path::new("/sys/fs/cgroup").join(path).join("memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            Path::new("/sys/fs/cgroup/memory")
                .join(path)
                .join("memory.limit_in_bytes")
        } else {
            return None;
        };
        let text = read(&file)?;
        let text = text.trim();
        if text == "max" {
            return Some(None);
        }
        Some(text.parse::<u64>().ok().filter(|&limit| limit < UNLIMITED))
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(entries: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let entries: Vec<(PathBuf, String)> = entries
            .iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect();
        move |path| {
            entries
                .iter()
                .find(|(p, _)| p == path)
                .map(|(_, t)| t.clone())
        }
    }

    #[test]
    fn reads_v2_v1_and_hybrid_hosts() {
        let v2 = files(&[("/sys/fs/cgroup/kubepods/pod1/memory.max", "268435456\n")]);
        assert_eq!(limit_from("0::/kubepods/pod1\n", v2), Some(256 << 20));
        let unlimited_v2 = files(&[("/sys/fs/cgroup/memory.max", "max\n")]);
        assert_eq!(limit_from("0::/\n", unlimited_v2), None);
        let hybrid = files(&[(
            "/sys/fs/cgroup/memory/stickyvol/memory.limit_in_bytes",
            "268435456\n",
        )]);
        let own = "12:cpu,cpuacct:/stickyvol\n5:memory:/stickyvol\n0::/stickyvol\n";
        assert_eq!(limit_from(own, hybrid), Some(256 << 20));
        let unlimited_v1 = files(&[(
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "9223372036854771712\n",
        )]);
        assert_eq!(limit_from("5:memory:/\n", unlimited_v1), None);
        assert_eq!(limit_from("garbage", files(&[])), None);
    }
}
