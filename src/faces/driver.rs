//! What every service shares: the configuration and, when this instance works on the host, the volumes.

use std::sync::Arc;

use tonic::Status;

use crate::config::{Config, Mode};
use crate::csi;
use crate::error::{Error, Result};
use crate::host::caller::Presence;
use crate::volume::Volumes;

/// Keys of the volume_context we return: where an admin finds a volume's data.
pub const CONTEXT_HOST_PATH: &str = "stickyvol.csi.io/host-path";
pub const CONTEXT_NODE: &str = "stickyvol.csi.io/node";
pub const CONTEXT_ACCESS_TYPE: &str = "stickyvol.csi.io/access-type";

#[derive(Debug)]
pub struct Driver {
    pub config: Config,
    volumes: Option<Arc<Volumes>>,
}

impl Driver {
    /// Opens the data directory unless this instance runs in controller mode.
    pub fn new(config: Config) -> Result<Driver> {
        let volumes = if config.mode.works_on_host() {
            let mut volumes = Volumes::open(
                &config.pools,
                &config.kubelet_dir,
                &config.node_id,
                config.run_dir.as_deref(),
            )?;
            volumes.set_cgroup_root(config.cgroup_root.clone());
            Some(Arc::new(volumes))
        } else {
            None
        };
        Ok(Driver { config, volumes })
    }

    /// Starts the work a restart interrupted (removing what crashes left, snapshot copies,
    /// emptying interrupted imports), in the background. Called once the socket serves, so Probe, unpublish and delete never
    /// wait for it, nor die with it.
    pub fn resume_interrupted_work(&self) {
        if let Some(volumes) = &self.volumes {
            volumes.reapply_io_limits();
            volumes.remove_leftovers();
            volumes.finish_interrupted_imports();
            volumes.resume_snapshot_copies();
        }
    }

    /// Waits, at most `timeout`, until no background work (a snapshot copy, a removal) holds
    /// the volumes any more.
    pub fn wait_for_background_work(&self, timeout: std::time::Duration) {
        let Some(volumes) = &self.volumes else {
            return;
        };
        let deadline = std::time::Instant::now() + timeout;
        while Arc::strong_count(volumes) > 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// The node's volumes, or UNIMPLEMENTED when this instance does no host work.
    pub fn volumes(&self) -> Result<Arc<Volumes>> {
        self.volumes.clone().ok_or_else(|| {
            Error::Unimplemented(format!(
                "this instance runs in {:?} mode and does no volume work; the node DaemonSet does",
                self.config.mode
            ))
        })
    }

    pub fn serves_controller(&self) -> bool {
        self.config.mode != Mode::Node
    }

    /// The topology that pins a volume to this node.
    pub fn topology(&self) -> csi::Topology {
        csi::Topology {
            segments: [(self.config.topology_key(), self.config.node_id.clone())].into(),
        }
    }
}

/// Runs host work off the async runtime. tonic drops the request future when a deadline
/// expires or the caller hangs up; the blocking work still finishes (every operation is
/// idempotent for the retry), but what it only waits for it stops waiting for (`host::caller`).
pub async fn blocking<T, F>(work: F) -> Result<T, Status>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    let presence = Presence::default();
    let flag = presence.flag();
    let done = tokio::task::spawn_blocking(move || Presence::serve(flag, work)).await;
    drop(presence);
    match done {
        Ok(result) => result.map_err(Status::from),
        Err(join) => Err(Status::internal(format!(
            "operation failed unexpectedly: {join}"
        ))),
    }
}
