//! The source's side: a TLS listener that gives a volume's export stream to the node plugin the
//! volume's PV is marked to move to (`grant`), and to nobody else.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::BufReader;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::io::SyncIoBridge;
use tracing::{debug, info, warn};

use super::wire::{self, Answer, Ask};
use super::{Settings, grant};
use crate::volume::Volumes;
use crate::volume::state::id::VolumeId;

/// How long a peer may take to finish the TLS handshake and say what it wants.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// Connections handled at once (handshakes, asks, streams); more wait for their TCP accept. A
/// peer that opens some and says nothing holds one for `HANDSHAKE` at most.
const CONNECTIONS: usize = 16;
/// Streams sent at once (each reads a whole volume); a granted ask beyond waits its turn.
const STREAMS: usize = 4;

/// What every connection is served with.
pub struct Source {
    pub client: kube::Client,
    pub volumes: Arc<Volumes>,
    pub settings: Settings,
    pub acceptor: TlsAcceptor,
    /// SHA-256 of the certificate `acceptor` serves, hex.
    pub fingerprint: String,
    /// Taken by each stream while it is sent (`STREAMS`).
    pub streams: Arc<tokio::sync::Semaphore>,
}

/// The stream slots a `Source` starts with.
pub fn stream_slots() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(STREAMS))
}

/// Serves connections on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, source: Arc<Source>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                warn!(error = %err, "transfer: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let source = source.clone();
        tokio::spawn(async move {
            if let Err(why) = handle(tcp, &source).await {
                warn!(peer = %peer, why, "transfer: not served");
            }
            drop(slot);
        });
    }
}

/// One connection: the handshake, the ask, the grant, then the stream.
async fn handle(tcp: TcpStream, source: &Source) -> Result<(), String> {
    let tls = tokio::time::timeout(HANDSHAKE, source.acceptor.accept(tcp))
        .await
        .map_err(|_| "no TLS handshake in time".to_string())?
        .map_err(|err| format!("TLS handshake: {err}"))?;
    let mut reader = BufReader::new(tls);
    let ask: Ask = tokio::time::timeout(HANDSHAKE, wire::read_line(&mut reader))
        .await
        .map_err(|_| "no ask in time".to_string())?
        .map_err(|err| err.to_string())?;
    let (export, peer) = match open(source, &ask).await {
        Ok(opened) => opened,
        Err(why) => {
            let refused = Answer {
                refused: Some(why.clone()),
            };
            (wire::write_line(&mut reader, &refused).await)
                .map_err(|err| format!("answering: {err}"))?;
            return Err(why);
        }
    };
    let _turn = source
        .streams
        .acquire()
        .await
        .map_err(|err| err.to_string())?;
    let out = SyncIoBridge::new(reader.into_inner());
    let volume = ask.volume.clone();
    // The answer and the stream's start go out together, in one buffer: fewer TLS records, and
    // the puller must (and does) read the stream from behind the answer in its own buffer.
    let sent = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut out = std::io::BufWriter::with_capacity(64 << 10, out);
        let mut answer = serde_json::to_vec(&Answer { refused: None }).unwrap_or_default();
        answer.push(b'\n');
        out.write_all(&answer)
            .map_err(|err| format!("answering: {err}"))?;
        let summary = export.write_to(&mut out).map_err(|err| err.to_string())?;
        out.flush().map_err(|err| err.to_string())?;
        let mut out = out.into_inner().map_err(|err| err.to_string())?;
        // The stream is whole once flushed, and the puller, who checks it, may close first: a
        // close that fails then is no failure of the transfer.
        if let Err(err) = out.shutdown() {
            debug!(error = %err, "transfer: closing after the stream");
        }
        Ok::<_, String>(summary)
    })
    .await
    .map_err(|err| err.to_string())??;
    let sha256 = sent.sha256_hex();
    info!(
        volume,
        peer,
        bytes = sent.stream_bytes,
        sha256,
        "transfer: volume sent"
    );
    Ok(())
}

/// The export the ask may have, and the asking node; else why not.
async fn open(
    source: &Source,
    ask: &Ask,
) -> Result<(crate::volume::copies::transfer::ExportSource, String), String> {
    let settings = &source.settings;
    // Both go into URLs and logs: names Kubernetes allows, or nothing is read.
    let id = VolumeId::parse(&ask.volume).filter(|_| crate::config::is_object_name(&ask.pv));
    let Some(id) = id else {
        return Err("the ask names no PV or volume of this driver".into());
    };
    let own_token = std::fs::read_to_string(&settings.token_file)
        .map_err(|err| format!("the source cannot read its own token: {err}"))?;
    let ours = (
        settings.driver.as_str(),
        settings.topology_key.as_str(),
        settings.node.as_str(),
    );
    let asked = (ask.pv.as_str(), ask.volume.as_str(), ask.token.as_str());
    let peer = grant::grant(&source.client, own_token.trim(), ours, asked).await?;
    let volumes = source.volumes.clone();
    let export = tokio::task::spawn_blocking(move || volumes.open_export(&id))
        .await
        .map_err(|err| err.to_string())?
        .map_err(|err| err.to_string())?;
    info!(volume = %ask.volume, pv = %ask.pv, peer, how = %export.description, "transfer: sending a volume");
    Ok((export, peer))
}
