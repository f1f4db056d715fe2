//! The admin API's own socket: `stickyvol.admin.v1.Admin` (and reflection naming it), apart
//! from the CSI socket, whose directory every sidecar mounts (issue 31). Root only twice over:
//! the socket's mode, and the caller's credentials (`admin::access`).

use std::future::Future;
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tracing::info;

use super::{RpcObserverLayer, ServeError};
use crate::admin::access::root_only;
use crate::admin::service::AdminService;
use crate::admin_api::admin_server::AdminServer;
use crate::faces::driver::Driver;
use crate::metrics::Metrics;
use crate::unix_channel::STREAM_WINDOW_BYTES;

/// The owner (root) only: no other process has business here.
pub(super) const SOCKET_MODE: u32 = 0o600;

/// Starts serving the admin API on `listener`, if there is one (modes with volumes). The
/// server stops when the returned `Stop` fires or is dropped.
pub(super) fn start(
    listener: Option<UnixListener>,
    driver: Arc<Driver>,
    metrics: Arc<Metrics>,
) -> Result<(Stop, Serving), ServeError> {
    let Some(listener) = listener else {
        return Ok((Stop(None), Serving(None)));
    };
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::FILE_DESCRIPTOR_SET)
        .with_service_name("grpc.reflection.v1.ServerReflection")
        .with_service_name("stickyvol.admin.v1.Admin")
        .build_v1()?;
    if let Some(path) = &driver.config.admin_socket {
        info!(socket = %path.display(), "serving the admin API (root only)");
    }
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = Server::builder()
        // HTTP/2's default 64 KiB windows stall a stream on a WINDOW_UPDATE round trip every
        // 64 KiB: export and import streams move MiB-sized messages.
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(STREAM_WINDOW_BYTES * 2)
        .layer(RpcObserverLayer { metrics })
        .add_service(reflection)
        .add_service(AdminServer::with_interceptor(
            AdminService::new(driver),
            root_only,
        ))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
            // A dropped sender stops the server too.
            let _ = stopped.await;
        });
    Ok((Stop(Some(stop)), Serving(Some(tokio::spawn(serving)))))
}

/// Starts the admin server's graceful stop.
pub(super) struct Stop(Option<oneshot::Sender<()>>);

impl Stop {
    /// Completes with `shutdown`, having stopped the admin server: both stop on one signal.
    pub(super) async fn after(self, shutdown: impl Future<Output = ()>) {
        shutdown.await;
        if let Some(stop) = self.0 {
            let _ = stop.send(());
        }
    }
}

/// The running admin server, if any.
pub(super) struct Serving(Option<JoinHandle<Result<(), tonic::transport::Error>>>);

impl Serving {
    /// Waits until the server has stopped and its calls have finished.
    pub(super) async fn finished(self) -> Result<(), ServeError> {
        match self.0 {
            Some(task) => Ok(task.await.expect("the admin server task")?),
            None => Ok(()),
        }
    }
}
