//! IO limits kept on pods' containers (`Volumes::keep_io_limits`): under cgroup v1 a limit set
//! on a pod's cgroup does not hold for the containers' cgroups below it, which kubelet makes
//! after the volume is published, so every `KEEP_EVERY` the limits of each pod using a limited
//! volume are set again, on its new containers too. A container's first writes, before the
//! next look, are not limited. Nothing is done under cgroup v2. No Kubernetes API is needed.

use std::sync::Arc;
use std::time::Duration;

use crate::cluster::kit::task::{Inputs, Loop, Shutdown};
use crate::volume::Volumes;

/// How soon a new container of a limited pod gets the limits.
const KEEP_EVERY: Duration = Duration::from_secs(2);

/// The loop, where this instance has volumes.
pub async fn start(inputs: &Inputs<'_>, shutdown: Shutdown) -> Result<Option<Loop>, kube::Error> {
    let Some(volumes) = inputs.volumes else {
        return Ok(None);
    };
    let run = keep(volumes.clone(), shutdown);
    Ok(Some(Loop::new("IO limits kept", Duration::ZERO, run)))
}

async fn keep(volumes: Arc<Volumes>, shutdown: Shutdown) {
    let stopped = shutdown.wait();
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = tokio::time::sleep(KEEP_EVERY) => {}
        }
        let look = volumes.clone();
        let _ = tokio::task::spawn_blocking(move || look.keep_io_limits()).await;
    }
}
