//! A gRPC channel over a unix socket: how the benchmark and the tests talk to a CSI driver.

use std::path::Path;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

/// Flow-control window per stream, on both ends (the server and this channel): a few of the
/// admin streams' 1 MiB messages in flight.
pub const STREAM_WINDOW_BYTES: u32 = 8 << 20;

/// Opens one channel to `socket` (requests are multiplexed over one connection), with a
/// per-call deadline when one is given.
pub async fn connect(
    socket: &Path,
    deadline: Option<Duration>,
) -> Result<Channel, tonic::transport::Error> {
    let socket = socket.to_path_buf();
    // The authority is never resolved: the connector below ignores it.
    let mut endpoint = Endpoint::from_static("http://csi.sock")
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(STREAM_WINDOW_BYTES * 2);
    if let Some(deadline) = deadline {
        endpoint = endpoint.timeout(deadline).connect_timeout(deadline);
    }
    endpoint
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
}
