//! The puller's side: copies a volume of another node into a volume of this one, straight from
//! that node's plugin (its advert's address, its pinned certificate), never through the API
//! server. The source decides whether to give it (`grant`); the import checks the stream's
//! checksum and kind, and leaves the target empty on any failure (`Volumes::import`).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::Api;
use tokio::io::BufReader;
use tokio_rustls::TlsConnector;
use tokio_util::io::SyncIoBridge;
use tracing::info;

use super::wire::{self, Answer, Ask};
use super::{Settings, advert, tls};
use crate::cluster::kit::affinity::pinned_by;
use crate::cluster::kit::names::MOVE_TO;
use crate::volume::Volumes;
use crate::volume::state::id::VolumeId;

const CONNECT: Duration = Duration::from_secs(10);

/// Why a pull failed, by who is to blame.
#[derive(Debug)]
pub enum PullError {
    /// The source, or the PV, says no: the move is not granted.
    Refused(String),
    /// The API server, the source's advert or the network.
    Unreachable(String),
    /// The import itself (the stream, the target volume).
    Import(crate::error::Error),
}

/// What a pull copied, and from which node.
pub struct Pulled {
    pub source_node: String,
    /// Bytes of the stream, of file data in it, entries of the tree (an image's: 0).
    pub stream_bytes: u64,
    pub data_bytes: u64,
    pub entries: u64,
    /// The stream's checksum, which the import checked, hex.
    pub sha256: String,
}

/// Pulls into this node's volumes.
pub struct Puller {
    pub client: kube::Client,
    pub volumes: Arc<Volumes>,
    pub settings: Settings,
}

impl Puller {
    /// Copies the volume of PV `source_pv` (on another node) into `target`, replacing what it
    /// holds.
    pub async fn pull(&self, target: &VolumeId, source_pv: &str) -> Result<Pulled, PullError> {
        let Source {
            node: source_node,
            volume,
            ..
        } = self.source_of(source_pv).await?;
        let settings = &self.settings;
        let advert = advert::read(
            &self.client,
            &settings.namespace,
            &settings.driver,
            &source_node,
        )
        .await
        .map_err(PullError::Unreachable)?;
        let token = std::fs::read_to_string(&settings.token_file).map_err(|err| {
            PullError::Unreachable(format!("reading this node's transfer token: {err}"))
        })?;
        let config = tls::client_config(&advert.fingerprint).map_err(PullError::Unreachable)?;
        let unreachable = |what: &str, err: String| {
            PullError::Unreachable(format!(
                "{what} node {source_node} at {}: {err}",
                advert.address
            ))
        };
        let tcp = tokio::time::timeout(CONNECT, tokio::net::TcpStream::connect(advert.address))
            .await
            .map_err(|_| unreachable("connecting to", "timed out".into()))?
            .map_err(|err| unreachable("connecting to", err.to_string()))?;
        let stream = TlsConnector::from(config)
            .connect(tls::server_name(), tcp)
            .await
            .map_err(|err| unreachable("TLS with", err.to_string()))?;
        let mut reader = BufReader::new(stream);
        let ask = Ask {
            pv: source_pv.to_string(),
            volume: volume.clone(),
            token: token.trim().to_string(),
        };
        wire::write_line(&mut reader, &ask)
            .await
            .map_err(|err| unreachable("asking", err.to_string()))?;
        let answer: Answer = wire::read_line(&mut reader)
            .await
            .map_err(|err| unreachable("reading the answer of", err.to_string()))?;
        if let Some(why) = answer.refused {
            return Err(PullError::Refused(format!(
                "node {source_node} refuses: {why}"
            )));
        }
        info!(target = %target, source = %volume, source_node, "transfer: pulling a volume");
        // The reader itself, not what it wraps: the stream's first bytes may have come with
        // the answer and sit in its buffer (an image's export starts at once).
        let input = SyncIoBridge::new(reader);
        let volumes = self.volumes.clone();
        let id = target.clone();
        let summary = tokio::task::spawn_blocking(move || volumes.import(&id, true, input))
            .await
            .map_err(|err| PullError::Unreachable(err.to_string()))?
            .map_err(PullError::Import)?;
        Ok(Pulled {
            source_node,
            stream_bytes: summary.stream_bytes,
            data_bytes: summary.data_bytes,
            entries: summary.entries,
            sha256: summary.sha256_hex(),
        })
    }

    /// What PV `name` says of its volume: one of ours, pinned to another node.
    pub(super) async fn source_of(&self, name: &str) -> Result<Source, PullError> {
        let settings = &self.settings;
        if !crate::config::is_object_name(name) {
            let shown: String = name.chars().take(80).collect();
            return Err(PullError::Refused(format!("{shown:?} is not a PV name")));
        }
        let pv = Api::<PersistentVolume>::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(|err| PullError::Unreachable(format!("reading PV {name}: {err}")))?
            .ok_or_else(|| PullError::Refused(format!("there is no PV {name}")))?;
        let spec = pv.spec.as_ref();
        let csi = spec
            .and_then(|s| s.csi.as_ref())
            .filter(|c| c.driver == settings.driver);
        let csi = csi.ok_or_else(|| {
            PullError::Refused(format!("PV {name} is not a volume of {}", settings.driver))
        })?;
        let affinity = spec.and_then(|s| s.node_affinity.as_ref());
        let node = pinned_by(affinity, &settings.topology_key)
            .ok_or_else(|| PullError::Refused(format!("PV {name} is not pinned to one node")))?;
        if node == settings.node {
            return Err(PullError::Refused(format!(
                "PV {name} is on this node already"
            )));
        }
        let move_to = (pv.metadata.annotations.as_ref()).and_then(|a| a.get(MOVE_TO).cloned());
        Ok(Source {
            node,
            volume: csi.volume_handle.clone(),
            move_to,
        })
    }
}

/// A source PV's volume, as the puller reads it.
pub(super) struct Source {
    pub node: String,
    pub volume: String,
    /// The node its `stickyvol.csi.io/move-to` names, if any.
    pub move_to: Option<String>,
}
