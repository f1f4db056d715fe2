//! Pods' cgroups as kubelet's cgroupfs driver lays them out, below a directory of this run
//! (`<hierarchy>/stickyvol-bench-<run>/kubepods/burstable/pod<uid>`, a `cgroupRoot` of our
//! own), each with a container's cgroup (`ctr`) made after the publish, as kubelet makes
//! containers after the volumes: the driver finds the pod by the uid its target path names.
//! Everything made here is removed again, deepest first.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use stickyvol::host::blkio::{self, DeviceNumber, Hierarchy};

use crate::workload::Fatal;

/// The container's cgroup below each pod's, where its writer runs.
const CONTAINER: &str = "ctr";
/// How often a limit is looked for while waiting for the driver to set it.
const POLL: Duration = Duration::from_millis(100);

/// The run's pods' cgroups, removed by `remove`.
pub(crate) struct Pods {
    root: PathBuf,
    pub(crate) hierarchy: Hierarchy,
    /// `<hierarchy>/stickyvol-bench-<run>/kubepods/burstable`.
    burstable: PathBuf,
    /// Every directory made, in the order made.
    made: Vec<PathBuf>,
}

impl Pods {
    /// The run's `kubepods/burstable` below the hierarchy with the IO controller under `root`.
    pub(crate) fn make(root: &Path, run_id: &str) -> Result<Pods, Fatal> {
        let (hierarchy, base) = blkio::io_hierarchy(root).ok_or_else(|| {
            format!(
                "no cgroup hierarchy with the IO controller under {}",
                root.display()
            )
        })?;
        let top = base.join(format!("stickyvol-bench-{run_id}"));
        let kubepods = top.join("kubepods");
        let mut pods = Pods {
            root: root.to_path_buf(),
            hierarchy,
            burstable: kubepods.join("burstable"),
            made: Vec::new(),
        };
        let levels = [
            (base, top.clone()),
            (top, kubepods.clone()),
            (kubepods, pods.burstable.clone()),
        ];
        for (parent, dir) in levels {
            if let Err(err) = pods.make_below(&parent, &dir) {
                pods.remove();
                return Err(err);
            }
        }
        Ok(pods)
    }

    /// The cgroup of the pod with uid `uid`: made before its volumes are published (the driver
    /// refuses to publish a limited volume to a pod it cannot find).
    pub(crate) fn make_pod(&mut self, uid: &str) -> Result<(), Fatal> {
        let pod = self.pod_dir(uid);
        self.make_below(&self.burstable.clone(), &pod)
    }

    /// The pod's container cgroup, made now; the `cgroup.procs` its writer joins.
    pub(crate) fn make_container(&mut self, uid: &str) -> Result<PathBuf, Fatal> {
        let pod = self.pod_dir(uid);
        let container = pod.join(CONTAINER);
        self.make_below(&pod, &container)?;
        Ok(container.join("cgroup.procs"))
    }

    fn pod_dir(&self, uid: &str) -> PathBuf {
        self.burstable.join(format!("pod{uid}"))
    }

    /// Makes `dir` below `parent`. Under cgroup v2 the parent first hands the io controller
    /// down (runc does so for every level it makes), so that each level has io files.
    fn make_below(&mut self, parent: &Path, dir: &Path) -> Result<(), Fatal> {
        if self.hierarchy == Hierarchy::V2 {
            let control = parent.join("cgroup.subtree_control");
            fs::write(&control, "+io")
                .map_err(|e| format!("enabling io in {}: {e}", control.display()))?;
        }
        fs::create_dir(dir).map_err(|e| format!("making the cgroup {}: {e}", dir.display()))?;
        self.made.push(dir.to_path_buf());
        Ok(())
    }

    /// The write IOPS limit on `device` where pod `uid`'s writer runs: its container's cgroup
    /// under v1 (v1's throttling does not reach down from the pod's), the pod's under v2 (it
    /// holds for everything below); None when there is none.
    pub(crate) fn write_iops(&self, uid: &str, device: DeviceNumber) -> io::Result<Option<u64>> {
        let pod = blkio::find_pod(&self.root, uid)?
            .ok_or_else(|| io::Error::other(format!("the driver finds no cgroup for pod {uid}")))?;
        let limits = match self.hierarchy {
            Hierarchy::V2 => blkio::limits_of(&pod, device)?,
            Hierarchy::V1 => {
                let children = blkio::children(&pod)?;
                let container = (children.iter())
                    .find(|c| c.path.file_name() == Some(CONTAINER.as_ref()))
                    .ok_or_else(|| io::Error::other(format!("pod {uid} has no container")))?;
                blkio::limits_of(container, device)?
            }
        };
        Ok(limits.write_iops)
    }

    /// Waits up to `timeout` until pod `uid`'s writer's cgroup has `wanted` (the driver sets it
    /// at publish and on a change, and under v1 on containers made later by a look every 2 s);
    /// the last value read.
    pub(crate) async fn wait_for_write_iops(
        &self,
        uid: &str,
        device: DeviceNumber,
        wanted: Option<u64>,
        timeout: Duration,
    ) -> Result<Option<u64>, Fatal> {
        let started = Instant::now();
        loop {
            let now = self
                .write_iops(uid, device)
                .map_err(|e| format!("reading pod {uid}'s limits: {e}"))?;
            if now == wanted || started.elapsed() >= timeout {
                return Ok(now);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Removes every cgroup made, deepest first (their writers have exited); what could not be
    /// removed.
    pub(crate) fn remove(&mut self) -> Vec<String> {
        let mut left = Vec::new();
        while let Some(dir) = self.made.pop() {
            match fs::remove_dir(&dir) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => left.push(format!("cgroup {} left in place: {err}", dir.display())),
            }
        }
        left
    }
}

/// The number of the device whose IO the limit is on: the block device `path` is, or the one
/// holding the filesystem `path` is in (an image volume's loop device).
pub(crate) fn device_number(path: &Path) -> Result<DeviceNumber, Fatal> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let metadata = fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let dev = match metadata.file_type().is_block_device() {
        true => metadata.rdev(),
        false => metadata.dev(),
    };
    Ok(DeviceNumber {
        major: nix::sys::stat::major(dev) as u32,
        minor: nix::sys::stat::minor(dev) as u32,
    })
}
