//! The one list of background loops: each room of the cluster wing offers a `start` that makes
//! its loop from the configuration (or none, where the configuration or the mode does not ask
//! for it); here they are started in one place and stopped in one place. A new loop is a
//! `start` in its own room and one line in `start` below.

use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::controller::{class_check, evictions, moves, nodeloss::reconcile, placement};
use super::kit::task::{Inputs, Loop, Shutdown, Stop};
use super::node::{
    io_limits, modify, nodeloss::returned, overflow, pool_full, project_audit, transfer,
};

/// The loops running beside the CSI server.
pub struct Running {
    stop: Stop,
    loops: Vec<(&'static str, std::time::Duration, JoinHandle<()>)>,
}

/// Starts every loop the configuration asks for. A loop that cannot start without a client
/// fails the start (the controller's loops); the node's loops serve without one, and say so.
pub async fn start(inputs: &Inputs<'_>) -> Result<Running, kube::Error> {
    let (stop, shutdown) = Shutdown::new();
    let made: [Option<Loop>; 13] = [
        // Claims of StatefulSets pinned to a lost node are released (controller mode).
        reconcile::start(inputs, shutdown.clone()).await?,
        // Restores and clones go to their source's node (controller mode).
        placement::run::start(inputs, shutdown.clone()).await?,
        // Group snapshots go to the node of their volumes (controller mode).
        placement::groups::start(inputs, shutdown.clone()).await?,
        // Classes of ours with a mistake get an Event naming it (controller mode).
        class_check::start(inputs, shutdown.clone()).await?,
        // The pods the nodes' overflow checks ask for are evicted, if theirs (controller mode).
        evictions::start(inputs, shutdown.clone()).await?,
        // Claims asked to move go to their new node with their data (controller mode).
        moves::start(inputs, shutdown.clone()).await?,
        // A node that comes back: volumes whose PV is gone move to lost+found.
        returned::start(inputs, shutdown.clone()).await?,
        // Pods moving files out of their volume's project are caught and undone.
        project_audit::start(inputs, shutdown.clone()).await?,
        // Directory volumes above a size their pool cannot enforce: evicted or reported.
        overflow::start(inputs, shutdown.clone()).await?,
        // Thin block and image volumes of a full pool: an Event on each one's claim.
        pool_full::start(inputs, shutdown.clone()).await?,
        // Volumes copied straight to another node's plugin, when granted.
        transfer::start(inputs, shutdown.clone()).await?,
        // IO limits the controller hands over from csi-resizer (a VolumeAttributesClass changed).
        modify::start(inputs, shutdown.clone()).await?,
        // IO limits set again on pods' new containers' cgroups (cgroup v1).
        io_limits::start(inputs, shutdown).await?,
    ];
    Ok(Running::spawn(stop, made.into_iter().flatten()))
}

impl Running {
    fn spawn(stop: Stop, made: impl IntoIterator<Item = Loop>) -> Running {
        let loops = made
            .into_iter()
            .map(|made| (made.name, made.grace, tokio::spawn(made.run)))
            .collect();
        Running { stop, loops }
    }

    /// Tells every loop to stop, then gives each its grace to end before aborting it.
    pub async fn stop(self) {
        self.stop.tell();
        for (name, grace, mut task) in self.loops {
            if grace.is_zero() {
                task.abort();
            } else if tokio::time::timeout(grace, &mut task).await.is_err() {
                warn!(
                    name,
                    ?grace,
                    "background loop did not stop in time; aborted"
                );
                task.abort();
            }
            debug!(name, "background loop stopped");
        }
    }

    /// The names of the loops running, in the order they started.
    pub fn names(&self) -> Vec<&'static str> {
        self.loops.iter().map(|(name, ..)| *name).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn a_stop_tells_every_loop_waits_its_grace_and_aborts_the_rest() {
        let (stop, shutdown) = Shutdown::new();
        let cleaned = Arc::new(AtomicBool::new(false));
        let cleaning = cleaned.clone();
        let told = shutdown.clone();
        let graceful = Loop::new("graceful", Duration::from_secs(5), async move {
            told.wait().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            cleaning.store(true, Ordering::SeqCst);
        });
        let deaf = Loop::new("deaf", Duration::from_millis(100), std::future::pending());
        let watch = Loop::new("watch", Duration::ZERO, shutdown.wait());
        let running = Running::spawn(stop, [graceful, deaf, watch]);
        assert_eq!(running.names(), ["graceful", "deaf", "watch"]);
        let started = std::time::Instant::now();
        running.stop().await;
        assert!(
            cleaned.load(Ordering::SeqCst),
            "the graceful loop finished its work"
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "a loop that never ends is aborted after its grace: {:?}",
            started.elapsed()
        );
    }
}
