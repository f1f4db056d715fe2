//! The memory limit of this process's cgroup (v2 `memory.max`, or v1's memory controller
//! `memory.limit_in_bytes`): what the DaemonSet gives the driver, kernel memory charged for
//! the trees it walks included; and on cgroup v2 the softer `memory.high` set below it.

use std::fs;
use std::io;
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

/// The share of `memory.max`, in percent, `soften_memory_limit` sets as `memory.high`.
pub const HIGH_PERCENT_OF_MAX: u64 = 75;

/// On cgroup v2, sets this process's cgroup's `memory.high` to `HIGH_PERCENT_OF_MAX` of its
/// `memory.max`, when it has a max and no high yet (one set by the operator, or by kubelet's
/// MemoryQoS, stays). Why: most of what the driver's tree work charges is kernel memory, the
/// inodes and names a copy or an import makes; reclaimable, but at the hard limit the kernel
/// OOM-kills when reclaim falls behind (Debian 12's 6.1 killed a 256 MiB driver importing
/// 262,144 empty files, with 30 MiB of its own), while above `memory.high` it reclaims and
/// slows the thread that allocates, and never kills. The value set, or None when nothing was
/// to be set; an error when the file could not be written (a read-only cgroupfs).
pub fn soften_memory_limit() -> io::Result<Option<u64>> {
    let own = fs::read_to_string("/proc/self/cgroup")?;
    soften_from(
        &own,
        |path| fs::read_to_string(path).ok(),
        |path, text| fs::write(path, text),
    )
}

fn soften_from(
    own: &str,
    read: impl Fn(&Path) -> Option<String>,
    write: impl Fn(&Path, &str) -> io::Result<()>,
) -> io::Result<Option<u64>> {
    // cgroup v2 only: v1 has no such limit (its soft limit only orders reclaim between groups).
    let Some(path) = own.lines().find_map(|line| line.strip_prefix("0::")) else {
        return Ok(None);
    };
    let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    let value = |name: &str| read(&dir.join(name)).map(|text| text.trim().to_string());
    let (Some(max), Some(high)) = (value("memory.max"), value("memory.high")) else {
        return Ok(None);
    };
    let Ok(max) = max.parse::<u64>() else {
        return Ok(None);
    };
    if high != "max" {
        return Ok(None);
    }
    let page = 4096;
    let soft = (u128::from(max) * u128::from(HIGH_PERCENT_OF_MAX) / 100) as u64 / page * page;
    write(&dir.join("memory.high"), &soft.to_string())?;
    Ok(Some(soft))
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

    /// What `soften_from` writes, given these files.
    fn softened(own: &str, entries: &[(&str, &str)]) -> Vec<(PathBuf, String)> {
        let written = std::cell::RefCell::new(Vec::new());
        let write = |path: &Path, text: &str| {
            written
                .borrow_mut()
                .push((path.to_path_buf(), text.to_string()));
            Ok(())
        };
        soften_from(own, files(entries), write).unwrap();
        written.into_inner()
    }

    #[test]
    fn sets_a_high_below_a_v2_max_and_leaves_everything_else() {
        let pod = "/sys/fs/cgroup/kubepods/pod1";
        let limited = [
            ("/sys/fs/cgroup/kubepods/pod1/memory.max", "268435456\n"),
            ("/sys/fs/cgroup/kubepods/pod1/memory.high", "max\n"),
        ];
        let want = (
            PathBuf::from(pod).join("memory.high"),
            (192 << 20).to_string(),
        );
        assert_eq!(softened("0::/kubepods/pod1\n", &limited), vec![want]);
        // A high already set (the operator's, kubelet's MemoryQoS), no max, cgroup v1: untouched.
        let set = [
            limited[0],
            ("/sys/fs/cgroup/kubepods/pod1/memory.high", "234881024\n"),
        ];
        assert!(softened("0::/kubepods/pod1\n", &set).is_empty());
        let unlimited = [
            ("/sys/fs/cgroup/memory.max", "max\n"),
            ("/sys/fs/cgroup/memory.high", "max\n"),
        ];
        assert!(softened("0::/\n", &unlimited).is_empty());
        assert!(softened("5:memory:/stickyvol\n", &limited).is_empty());
        assert!(softened("garbage", &[]).is_empty());
    }
}
