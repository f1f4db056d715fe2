//! The gRPC server: unix socket, services for the configured mode, reflection, per-RPC logs,
//! graceful shutdown. The admin API has a socket of its own (`admin_listener`).

mod admin_listener;

use std::fs;
use std::future::Future;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::codegen::http;
use tonic::transport::Server;
use tower::{Layer, Service};
use tracing::{debug, info, warn};

use crate::cluster::kit::task::Inputs;
use crate::cluster::loops;
use crate::config::{Config, Mode};
use crate::csi;
use crate::faces::controller::ControllerService;
use crate::faces::driver::Driver;
use crate::faces::group_controller::GroupControllerService;
use crate::faces::identity::IdentityService;
use crate::faces::node::NodeService;
use crate::metrics::{self, Metrics};

/// Owner and group (kubelet, sidecars) only: the socket grants full control of node storage.
const SOCKET_MODE: u32 = 0o660;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot start: {0}")]
    Driver(#[from] crate::error::Error),
    #[error("socket {path}: {source}")]
    Socket { path: String, source: io::Error },
    #[error("another process is already serving on {0}")]
    SocketInUse(String),
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("metrics address {address}: {source}")]
    Metrics {
        address: std::net::SocketAddr,
        source: io::Error,
    },
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("background loops: no Kubernetes client configuration: {0}")]
    Kubernetes(#[from] kube::Error),
}

/// Serves until `shutdown` completes, then finishes in-flight calls and removes the sockets.
pub async fn serve(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
    // Bind before opening the volumes: a live socket means another instance owns the data dir,
    // and our startup recovery must not run beside it.
    let listener = bind(&config.socket_path, SOCKET_MODE)?;
    let csi_socket = Bound(config.socket_path.clone());
    let admin = (config.admin_socket.as_deref())
        .map(|path| bind(path, admin_listener::SOCKET_MODE))
        .transpose()?;
    let admin_socket = config.admin_socket.clone().map(Bound);
    let result = serve_on(listener, admin, config, shutdown).await;
    drop((csi_socket, admin_socket));
    info!("stopped");
    result
}

/// A socket file this process bound: ours since bind succeeded, so removed when dropped,
/// whatever happened after.
struct Bound(std::path::PathBuf);

impl Drop for Bound {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// Reflection for the services `mode` serves (the schema holds all four CSI services).
fn reflection_for(
    mode: Mode,
) -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    ServeError,
> {
    let mut reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::FILE_DESCRIPTOR_SET)
        .with_service_name("grpc.reflection.v1.ServerReflection")
        .with_service_name("csi.v1.Identity")
        .with_service_name("csi.v1.Node");
    if mode != Mode::Node {
        reflection = reflection.with_service_name("csi.v1.Controller");
    }
    Ok(reflection.build_v1()?)
}

async fn serve_on(
    listener: UnixListener,
    admin: Option<UnixListener>,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let mode = config.mode;
    let socket_path = config.socket_path.clone();
    let driver = Arc::new(
        tokio::task::spawn_blocking(move || Driver::new(config))
            .await
            .expect("startup task")?,
    );
    info!(
        socket = %socket_path.display(),
        mode = ?mode,
        node = %driver.config.node_id,
        driver = %driver.config.driver_name,
        "serving CSI"
    );

    let reflection = reflection_for(mode)?;
    let metrics = Arc::new(Metrics::new());
    if let Some(address) = driver.config.metrics_address {
        let limits = driver.config.metrics_limits;
        metrics::serve(address, limits, metrics.clone(), driver.clone())
            .await
            .map_err(|source| ServeError::Metrics { address, source })?;
    }
    // The loops hold the volumes they need; this reference goes at once, as the stop waits for
    // every holder to let go (`wait_for_background_work`).
    let volumes = driver.volumes().ok();
    let background = loops::start(&Inputs {
        config: &driver.config,
        volumes: volumes.as_ref(),
        metrics: &metrics,
    })
    .await?;
    drop(volumes);
    info!(loops = ?background.names(), "background loops started");
    // Where the volumes are, for `stickyvol volumes` and `stickyvol volume …`.
    let (stop_admin, admin) = admin_listener::start(admin, driver.clone(), metrics.clone())?;
    let shutdown = stop_admin.after(shutdown);
    let mut router = Server::builder()
        .layer(RpcObserverLayer { metrics })
        .add_service(reflection)
        .add_service(csi::identity_server::IdentityServer::new(
            IdentityService::new(driver.clone()),
        ));
    if mode != Mode::Node {
        router = router
            .add_service(csi::controller_server::ControllerServer::new(
                ControllerService::new(driver.clone()),
            ))
            .add_service(csi::group_controller_server::GroupControllerServer::new(
                GroupControllerService::new(driver.clone()),
            ));
    }
    // Controller mode serves Node too, for NodeGetCapabilities: csi-resizer reads it on this socket.
    router = router.add_service(csi::node_server::NodeServer::new(NodeService::new(
        driver.clone(),
    )));

    let serving = router.serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown);
    // The socket is bound and its calls are taken from here on; interrupted copies start
    // beside them (each on a thread of its own), not before.
    driver.resume_interrupted_work();
    let served = serving.await;
    background.stop().await;
    served?;
    admin.finished().await?;
    // The clean stop's write-back of the records runs where the volumes are dropped last: not
    // in a background thread (a snapshot copy just done) that the process exit cuts short.
    let idle = driver.clone();
    tokio::task::spawn_blocking(move || idle.wait_for_background_work(BACKGROUND_WORK_GRACE))
        .await
        .expect("waiting for background work");
    Ok(())
}

/// How long a stop waits for background work to let go of the volumes (the DaemonSet gives
/// the pod 30 s from SIGTERM to SIGKILL).
const BACKGROUND_WORK_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Binds the socket with `mode`, replacing a stale one but never a live one or a non-socket
/// file.
fn bind(path: &Path, mode: u32) -> Result<UnixListener, ServeError> {
    let err = |source| ServeError::Socket {
        path: path.display().to_string(),
        source,
    };
    // Nobody could connect to a longer one: sockaddr_un holds 107 bytes of path.
    if path.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "is {} bytes long; a unix socket's path can be at most {MAX_SOCKET_PATH}",
                path.as_os_str().len()
            ),
        )));
    }
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(err)?;
    }
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(ServeError::SocketInUse(path.display().to_string()));
            }
            fs::remove_file(path).map_err(err)?;
            info!(socket = %path.display(), "removed stale socket");
        }
        Ok(_) => {
            return Err(err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "exists and is not a socket; refusing to replace it",
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let listener = bind_with_mode(path, mode).map_err(err)?;
    listener.set_nonblocking(true).map_err(err)?;
    UnixListener::from_std(listener).map_err(err)
}

/// Binds `path` so that the socket file has `mode` before anyone can reach it, with no chmod of
/// `path` (a swap of the path between bind and chmod would redirect the chmod): the socket is
/// bound in a fresh directory beside `path` that only root may enter, given its mode there,
/// then renamed into place (never over an existing file). No umask games: a process-wide
/// umask would race with other threads, and a thread-own one needs unshare(2), which the
/// container runtime's default seccomp profile refuses (the controller pod runs under it).
fn bind_with_mode(path: &Path, mode: u32) -> io::Result<std::os::unix::net::UnixListener> {
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a socket path",
        ));
    };
    remove_stale_bind_dirs(parent);
    let private = parent.join(format!(
        "{BIND_DIR_PREFIX}{}",
        uuid::Uuid::now_v7().simple()
    ));
    fs::DirBuilder::new().mode(0o700).create(&private)?;
    let bound = (|| {
        // Bound through the directory's descriptor: the private directory's name would take 49
        // of the 107 bytes a socket's path may have, and refuse every endpoint over 58 bytes
        // (the manifests' /csi/csi.sock is short, a driver run by hand under a deep directory
        // is not).
        let dir = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(&private)?;
        let staged = Path::new(&format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
        let listener = std::os::unix::net::UnixListener::bind(&staged)?;
        fs::set_permissions(&staged, fs::Permissions::from_mode(mode))?;
        nix::fcntl::renameat2(
            dir.as_fd(),
            name,
            nix::fcntl::AT_FDCWD,
            path,
            nix::fcntl::RenameFlags::RENAME_NOREPLACE,
        )?;
        Ok(listener)
    })();
    let _ = crate::host::safe_delete::remove_all(&private);
    bound
}

/// Where `bind_with_mode` binds before the rename.
const BIND_DIR_PREFIX: &str = ".stickyvol-bind-";
/// The longest path a unix socket can be bound at or reached by (sockaddr_un's sun_path, less
/// its terminating NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Directories of an earlier bind a crash interrupted (they hold at most a dead socket).
fn remove_stale_bind_dirs(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(BIND_DIR_PREFIX)
        {
            let _ = crate::host::safe_delete::remove_all(&entry.path());
        }
    }
}

/// Observes every RPC once: logs method, gRPC code, duration and the error message if any, and
/// feeds the metrics. Request bodies are never logged (they may carry secrets).
#[derive(Debug, Clone)]
pub struct RpcObserverLayer {
    metrics: Arc<Metrics>,
}

impl<S> Layer<S> for RpcObserverLayer {
    type Service = RpcObserver<S>;
    fn layer(&self, inner: S) -> RpcObserver<S> {
        RpcObserver {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RpcObserver<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for RpcObserver<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let method = request
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let started = Instant::now();
        let metrics = self.metrics.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let elapsed = started.elapsed();
            let micros = elapsed.as_micros() as u64;
            // Errors travel in the response headers ("trailers-only"); OK answers carry none there.
            let code = match &result {
                Ok(response) => match tonic::Status::from_header_map(response.headers()) {
                    Some(status) if status.code() != tonic::Code::Ok => {
                        warn!(rpc = %method, code = ?status.code(), micros, error = status.message(), "rpc failed");
                        status.code()
                    }
                    _ => {
                        debug!(rpc = %method, micros, "rpc ok");
                        tonic::Code::Ok
                    }
                },
                Err(err) => {
                    warn!(rpc = %method, micros, error = %err, "rpc transport error");
                    tonic::Code::Unknown
                }
            };
            metrics.observe_rpc(&method, code, elapsed.as_secs_f64());
            result
        })
    }
}
