//! Node-to-node transfers (node plugin, `--transfer-address`): a volume's data copied straight
//! from the node plugin that holds it into a volume of another node, never through the API
//! server; what `stickyvol volume pull` does, and what moving a claim to another node builds on.
//!
//! - `tls`: each node plugin's self-signed certificate, made at start, and the pinning client;
//! - `advert`: where a node's endpoint and certificate are found (a ConfigMap only it writes);
//! - `wire`: what the two ends say before the stream;
//! - `grant`: whom a source gives a volume to: the node plugin (token reviewed by the API server,
//!   bound to a pod on that node) of the node the volume's PV is marked to move to;
//! - `source`: the listener; `target`: the pull; `disk`: the same from a dead node's disk
//!   attached here; `requests`: pulls asked for on this node's PVs (what a move asks), their
//!   results written back there.
//!
//! What it protects against: a pod, or any other program, that reaches the address and knows a
//! volume's id gets nothing without a token of this driver's node plugins bound to the node the
//! PV names (the token's audience is the transfer's own, so a token taken from another API
//! cannot be replayed here, nor this one there); nobody on the path reads or changes the data
//! (TLS 1.3; the puller pins the source's certificate from an advert only the source's node may
//! write); a stream damaged or cut anyway fails the import's checksum, leaving the target empty.

pub mod advert;
pub mod disk;
pub mod grant;
pub mod requests;
pub mod source;
pub mod target;
pub mod tls;
pub mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tracing::{error, info, warn};

use crate::cluster::kit::client::{self, Retries};
use crate::cluster::kit::task::{Inputs, Loop, Shutdown};
use crate::volume::Volumes;

/// What both sides need to know.
#[derive(Debug, Clone)]
pub struct Settings {
    pub driver: String,
    pub topology_key: String,
    pub node: String,
    /// The driver's namespace, where the adverts are.
    pub namespace: String,
    /// Where the source listens; what the advert says (the port once bound, if 0 was asked).
    pub address: SocketAddr,
    /// This node plugin's token for the transfer audience (projected by kubelet).
    pub token_file: PathBuf,
    /// Where dead nodes' disks are mounted to adopt their volumes (`disk`).
    pub adopt_root: PathBuf,
}

/// The settings, where the configuration asks for transfers (a node plugin with an address).
pub fn settings(config: &crate::config::Config) -> Option<Settings> {
    let transfer = config.transfer.as_ref()?;
    Some(Settings {
        driver: config.driver_name.clone(),
        topology_key: config.topology_key(),
        node: config.node_id.clone(),
        namespace: transfer.namespace.clone(),
        address: transfer.address,
        token_file: transfer.token_file.clone(),
        adopt_root: config.data_dir.join(disk::ADOPT_DIR),
    })
}

/// The puller the admin API uses, where transfers are configured and a client can be made.
pub async fn puller(
    config: &crate::config::Config,
    volumes: &Arc<Volumes>,
) -> Option<target::Puller> {
    let settings = settings(config)?;
    let client = match client::make(Retries::On).await {
        Ok(client) => client,
        Err(err) => {
            error!(error = %err, "transfers off: no Kubernetes client configuration");
            return None;
        }
    };
    Some(target::Puller {
        client,
        volumes: volumes.clone(),
        settings,
    })
}

/// The listener and the watch of this node's pull requests, and the advert written (again after
/// a failure) until it is. All three run inside this future, not as tasks of their own: the stop
/// aborts the loop at once, and a task spawned here would outlive it holding the volumes (the
/// server's stop then waited its whole grace for them).
async fn run(source: Arc<source::Source>, listener: TcpListener, shutdown: Shutdown) {
    let advert = advert::Advert {
        node: source.settings.node.clone(),
        address: source.settings.address,
        fingerprint: source.fingerprint.clone(),
    };
    let settings = source.settings.clone();
    let client = source.client.clone();
    let puller = Arc::new(target::Puller {
        client: client.clone(),
        volumes: source.volumes.clone(),
        settings: settings.clone(),
    });
    let publishing = async {
        loop {
            match advert::publish(&client, &settings.namespace, &settings.driver, &advert).await {
                Ok(()) => {
                    info!(address = %advert.address, certificate = %advert.fingerprint, "transfer: endpoint advertised");
                    return std::future::pending().await;
                }
                Err(err) => {
                    warn!(error = %err, "transfer: could not write this node's advert; retrying in 10 s");
                    tokio::time::sleep(Duration::from_secs(10)).await;
                }
            }
        }
    };
    tokio::select! {
        () = source::serve(listener, source.clone()) => {}
        () = requests::run(puller) => {}
        () = publishing => {}
        () = shutdown.wait() => {}
    }
}

/// The transfer listener, where the configuration asks for one and this instance has volumes.
pub async fn start(inputs: &Inputs<'_>, shutdown: Shutdown) -> Result<Option<Loop>, kube::Error> {
    let Some(mut settings) = settings(inputs.config) else {
        return Ok(None);
    };
    let Some(work) = inputs.node_work("transfers", Retries::On).await else {
        return Ok(None);
    };
    let made = tls::Identity::generate().and_then(|identity| {
        let config = identity.server_config()?;
        Ok((identity.fingerprint, TlsAcceptor::from(config)))
    });
    let (fingerprint, acceptor) = match made {
        Ok(made) => made,
        Err(why) => {
            error!(why, "transfers off");
            return Ok(None);
        }
    };
    let listener = match TcpListener::bind(settings.address).await {
        Ok(listener) => listener,
        Err(err) => {
            error!(address = %settings.address, error = %err, "transfers off: cannot listen");
            return Ok(None);
        }
    };
    settings.address = listener.local_addr().unwrap_or(settings.address);
    info!(address = %settings.address, "transfers starting");
    let source = Arc::new(source::Source {
        client: work.client,
        volumes: work.volumes,
        settings,
        acceptor,
        fingerprint,
        streams: source::stream_slots(),
    });
    Ok(Some(Loop::new(
        "transfers",
        Duration::ZERO,
        run(source, listener, shutdown),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(path: PathBuf) -> crate::config::PoolConfig {
        crate::config::PoolConfig {
            name: "default".into(),
            path,
            optional: false,
            enforcement: crate::config::EnforcementChoice::Auto,
            overcommit: 1.0,
            kubelet_reserve: crate::config::KubeletReserve {
                kubelet_dir: "/var/lib/kubelet".into(),
                percent: 0,
            },
        }
    }

    /// The stop aborts this loop without waiting (grace zero), before it may have seen its
    /// shutdown: what it started must end with it, or the server's stop waits for the volumes
    /// it holds (10 s, what CI saw once).
    #[tokio::test(flavor = "multi_thread")]
    async fn the_loop_aborted_before_it_sees_its_shutdown_lets_go_of_the_volumes() {
        let dir = tempfile::tempdir().unwrap();
        let opened = Volumes::open(
            &[pool(dir.path().join("data"))],
            &dir.path().join("kubelet"),
            "node-a",
            None,
        );
        let volumes = Arc::new(opened.unwrap());
        // An API server that is not there: the watch of pull requests retries for ever.
        let api = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let identity = tls::Identity::generate().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let source = Arc::new(source::Source {
            client: kube::Client::try_from(api).unwrap(),
            volumes: volumes.clone(),
            settings: Settings {
                driver: "stickyvol.csi.io".into(),
                topology_key: "topology.stickyvol.csi.io/node".into(),
                node: "node-a".into(),
                namespace: "stickyvol".into(),
                address: listener.local_addr().unwrap(),
                token_file: dir.path().join("token"),
                adopt_root: dir.path().join("adopt"),
            },
            acceptor: TlsAcceptor::from(identity.server_config().unwrap()),
            fingerprint: identity.fingerprint,
            streams: source::stream_slots(),
        });
        let (_stop, shutdown) = Shutdown::new();
        let running = tokio::spawn(run(source, listener, shutdown));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            Arc::strong_count(&volumes) > 1,
            "the loop holds the volumes"
        );
        running.abort();
        assert!(running.await.unwrap_err().is_cancelled());
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while Arc::strong_count(&volumes) > 1 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            Arc::strong_count(&volumes),
            1,
            "something of the loop lives on"
        );
    }
}
