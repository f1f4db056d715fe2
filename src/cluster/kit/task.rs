//! What a background loop is: a name, a future that runs until its `Shutdown`, and how long its
//! stop may wait for it. Every loop of the cluster wing is made from the same `Inputs`, and
//! `cluster::loops` starts and stops them all in one place.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::error;

use super::client::{self, Retries};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::volume::Volumes;

/// What a loop may be made from.
pub struct Inputs<'a> {
    pub config: &'a Config,
    /// This instance's volumes (None in `--mode=controller`, which has none).
    pub volumes: Option<&'a Arc<Volumes>>,
    pub metrics: &'a Arc<Metrics>,
}

/// What a node's loop works with: a client, this node's volumes, the metrics.
pub struct NodeWork {
    pub client: kube::Client,
    pub volumes: Arc<Volumes>,
    pub metrics: Arc<Metrics>,
}

impl Inputs<'_> {
    /// What loop `what` on a node needs, or None: none where this instance has no volumes; none,
    /// said in the log, without a client (the node's volumes matter more than one loop, so the
    /// driver serves anyway).
    pub async fn node_work(&self, what: &str, retries: Retries) -> Option<NodeWork> {
        let volumes = self.volumes?.clone();
        match client::make(retries).await {
            Ok(client) => Some(NodeWork {
                client,
                volumes,
                metrics: self.metrics.clone(),
            }),
            Err(err) => {
                error!(error = %err, "{what} off: no Kubernetes client configuration (in-cluster or $KUBECONFIG)");
                None
            }
        }
    }
}

/// One background loop, made but not yet started.
pub struct Loop {
    pub name: &'static str,
    /// How long the stop waits for the loop to end by itself once told, before it is aborted.
    /// Zero for loops that hold nothing a cut would lose (a watch, a round that the next start
    /// does again).
    pub grace: Duration,
    pub run: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Loop {
    pub fn new(
        name: &'static str,
        grace: Duration,
        run: impl Future<Output = ()> + Send + 'static,
    ) -> Loop {
        Loop {
            name,
            grace,
            run: Box::pin(run),
        }
    }
}

/// The signal a loop ends at: completes once the server stops (or the sender is gone).
#[derive(Clone)]
pub struct Shutdown(watch::Receiver<bool>);

/// Tells every `Shutdown` made from it.
pub struct Stop(watch::Sender<bool>);

impl Shutdown {
    pub fn new() -> (Stop, Shutdown) {
        let (sender, receiver) = watch::channel(false);
        (Stop(sender), Shutdown(receiver))
    }

    /// Completes when told to stop.
    pub async fn wait(mut self) {
        let _ = self.0.wait_for(|stopped| *stopped).await;
    }
}

impl Stop {
    pub fn tell(&self) {
        let _ = self.0.send(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_copy_of_a_shutdown_completes_once_told_and_not_before() {
        let (stop, shutdown) = Shutdown::new();
        let copy = shutdown.clone();
        let waiting = tokio::spawn(copy.wait());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        stop.tell();
        waiting.await.unwrap();
        // A shutdown made after the signal sees it too.
        tokio::time::timeout(Duration::from_secs(1), shutdown.wait())
            .await
            .unwrap();
    }
}
