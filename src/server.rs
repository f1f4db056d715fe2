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
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::codegen::http;
use tonic::transport::Server;
use tower::{Layer, Service};
use tracing::{debug, error, info, warn};

use crate::audit_events;
use crate::class_check;
use crate::config::{Config, Mode};
use crate::controller::ControllerService;
use crate::csi;
use crate::driver::Driver;
use crate::identity::IdentityService;
use crate::metrics::{self, Metrics};
use crate::node::NodeService;
use crate::nodeloss::{reconcile, report, returned};
use crate::overflow;
use crate::placement;
use crate::volume::audit;

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
    #[error("node loss (reconciler or orphan check): no Kubernetes client configuration: {0}")]
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

/// The node-loss reconciler, where the configuration asks for one; it runs until `stopped`.
async fn start_reconciler(
    driver: &Driver,
    metrics: &Arc<Metrics>,
    stopped: tokio::sync::oneshot::Receiver<()>,
) -> Result<Option<tokio::task::JoinHandle<()>>, ServeError> {
    let Some(node_loss) = driver.config.node_loss.clone() else {
        return Ok(None);
    };
    // In-cluster: the service account's token and CA; else $KUBECONFIG.
    let client = kube::Client::try_default().await?;
    let settings = reconcile::Settings {
        driver: driver.config.driver_name.clone(),
        topology_key: driver.config.topology_key(),
        dry_run: node_loss.dry_run,
        interval: node_loss.interval,
        lease_namespace: node_loss.lease_namespace,
        lease_name: reconcile::LEASE_NAME.into(),
        identity: node_loss.identity,
    };
    info!(dry_run = settings.dry_run, interval = ?settings.interval, "node-loss reconciler starting");
    let shutdown = async move {
        let _ = stopped.await;
    };
    Ok(Some(tokio::spawn(reconcile::run(
        client,
        settings,
        metrics.clone(),
        shutdown,
    ))))
}

/// Restore placement, where the configuration asks for it; it runs until aborted (stateless: a
/// look cut short is done again by the next start's watch).
async fn start_restore_placement(
    driver: &Driver,
    metrics: &Arc<Metrics>,
) -> Result<Option<tokio::task::JoinHandle<()>>, ServeError> {
    if !driver.config.restore_placement {
        return Ok(None);
    }
    let client = kube::Client::try_default().await?;
    let settings = placement::run::Settings {
        driver: driver.config.driver_name.clone(),
        topology_key: driver.config.topology_key(),
        identity: driver.config.node_id.clone(),
    };
    info!("restore placement starting");
    Ok(Some(tokio::spawn(placement::run::run(
        client,
        settings,
        metrics.clone(),
        std::future::pending(),
    ))))
}

/// The class check, where the configuration asks for it; it runs until aborted.
async fn start_class_check(
    driver: &Driver,
) -> Result<Option<tokio::task::JoinHandle<()>>, ServeError> {
    if !driver.config.check_classes {
        return Ok(None);
    }
    let client = kube::Client::try_default().await?;
    info!("class check starting");
    Ok(Some(tokio::spawn(class_check::run(
        client,
        driver.config.driver_name.clone(),
        driver.config.node_id.clone(),
        std::future::pending(),
    ))))
}

/// The check of a node that comes back, where the configuration asks for one and this mode has
/// volumes; it runs until `stopped`. The node's volumes matter more than its report: without
/// credentials the driver serves anyway, and says so.
async fn start_orphan_check(
    driver: &Driver,
    metrics: &Arc<Metrics>,
    stopped: tokio::sync::oneshot::Receiver<()>,
) -> Option<tokio::task::JoinHandle<()>> {
    let check = driver.config.orphan_check.clone()?;
    let volumes = driver.volumes().ok()?;
    let client = match kube::Client::try_default().await {
        Ok(client) => client,
        Err(err) => {
            error!(error = %err, "orphan check off: no Kubernetes client configuration (in-cluster or $KUBECONFIG)");
            return None;
        }
    };
    let settings = returned::Settings {
        driver: driver.config.driver_name.clone(),
        node: driver.config.node_id.clone(),
        interval: check.interval,
        // Two looks at least two intervals apart (see `returned`).
        confirm: check.interval * 2,
        report: check.report_namespace.map(|namespace| report::Target {
            driver: driver.config.driver_name.clone(),
            node: driver.config.node_id.clone(),
            namespace,
        }),
    };
    info!(interval = ?settings.interval, report = ?settings.report.as_ref().map(|r| &r.namespace), "orphan check starting");
    let shutdown = async move {
        let _ = stopped.await;
    };
    Some(tokio::spawn(returned::run(
        client,
        volumes,
        settings,
        metrics.clone(),
        shutdown,
    )))
}

/// The periodic project-id audit, where the configuration asks for it and this mode has
/// volumes, on a thread of its own (its walks block); it stops when the flag returned is set.
fn start_project_audit(driver: &Driver) -> Option<Arc<AtomicBool>> {
    let interval = driver.config.project_audit_interval?;
    let volumes = driver.volumes().ok()?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    // Events on the claims: written by a task of their own, fed without waiting (the queue is
    // bounded; the log and the metrics report what does not fit).
    let (found, pending) = tokio::sync::mpsc::channel(64);
    let reporter = audit_events::Reporter {
        driver: driver.config.driver_name.clone(),
        node: driver.config.node_id.clone(),
    };
    tokio::spawn(audit_events::run(pending, reporter));
    let report = move |tampered: Vec<audit::Tampered>| {
        for volume in tampered {
            if found.try_send(volume).is_err() {
                warn!("project-id audit: Event queue full, an Event on a claim was dropped");
            }
        }
    };
    let started = std::thread::Builder::new()
        .name("project-audit".into())
        .spawn(move || audit::run_every(volumes, interval, stopped, report));
    match started {
        Ok(_) => Some(stop),
        Err(err) => {
            error!(error = %err, "project-id audit off: cannot start its thread");
            None
        }
    }
}

/// The overflow check, where the configuration asks for one and this mode has volumes; it runs
/// until `stopped`. Without credentials the driver serves anyway, and says so.
async fn start_overflow_check(
    driver: &Driver,
    metrics: &Arc<Metrics>,
    stopped: tokio::sync::oneshot::Receiver<()>,
) -> Option<tokio::task::JoinHandle<()>> {
    let interval = driver.config.overflow_check?;
    let volumes = driver.volumes().ok()?;
    let client = match overflow::client().await {
        Ok(client) => client,
        Err(err) => {
            error!(error = %err, "overflow check off: no Kubernetes client configuration (in-cluster or $KUBECONFIG)");
            return None;
        }
    };
    let settings = overflow::Settings {
        driver: driver.config.driver_name.clone(),
        node: driver.config.node_id.clone(),
        interval,
    };
    info!(interval = ?settings.interval, "overflow check starting");
    let shutdown = async move {
        let _ = stopped.await;
    };
    Some(tokio::spawn(overflow::run(
        client,
        volumes,
        settings,
        metrics.clone(),
        shutdown,
    )))
}

/// The loops that run beside the CSI server, and how each is stopped with it.
struct Background {
    stop_reconciler: tokio::sync::oneshot::Sender<()>,
    reconciler: Option<tokio::task::JoinHandle<()>>,
    watches: Vec<tokio::task::JoinHandle<()>>,
    stop_orphans: tokio::sync::oneshot::Sender<()>,
    orphan_check: Option<tokio::task::JoinHandle<()>>,
    stop_audit: Option<Arc<AtomicBool>>,
    stop_overflow: tokio::sync::oneshot::Sender<()>,
    overflow_check: Option<tokio::task::JoinHandle<()>>,
}

impl Background {
    async fn start(driver: &Driver, metrics: &Arc<Metrics>) -> Result<Background, ServeError> {
        // The node-loss reconciler stops with the server; it then hands its Lease over.
        let (stop_reconciler, stopped) = tokio::sync::oneshot::channel::<()>();
        let reconciler = start_reconciler(driver, metrics, stopped).await?;
        // Restores and clones go to their source's node; classes of ours with a mistake get an
        // Event naming it. Both are watches that hold nothing: aborted at the stop.
        let watches: Vec<_> = [
            start_restore_placement(driver, metrics).await?,
            start_class_check(driver).await?,
        ]
        .into_iter()
        .flatten()
        .collect();
        // A node that comes back: volumes whose PV is gone move to lost+found.
        let (stop_orphans, orphans_stopped) = tokio::sync::oneshot::channel::<()>();
        let orphan_check = start_orphan_check(driver, metrics, orphans_stopped).await;
        // Pods moving files out of their volume's project are caught and undone.
        let stop_audit = start_project_audit(driver);
        // Directory volumes above a size their pool cannot enforce: evicted or reported.
        let (stop_overflow, overflow_stopped) = tokio::sync::oneshot::channel::<()>();
        let overflow_check = start_overflow_check(driver, metrics, overflow_stopped).await;
        Ok(Background {
            stop_reconciler,
            reconciler,
            watches,
            stop_orphans,
            orphan_check,
            stop_audit,
            stop_overflow,
            overflow_check,
        })
    }

    async fn stop(self) {
        let _ = self.stop_reconciler.send(());
        let _ = self.stop_orphans.send(());
        self.watches.iter().for_each(|w| w.abort());
        if let Some(stop) = &self.stop_audit {
            // Its walk ends at the next entry; it lets go of the volumes before the wait below ends.
            stop.store(true, Ordering::Relaxed);
        }
        let _ = self.stop_overflow.send(());
        if let Some(overflow_check) = &self.overflow_check {
            overflow_check.abort();
        }
        if let Some(orphan_check) = &self.orphan_check {
            // A move under way finishes on its blocking thread; the loop itself just stops.
            orphan_check.abort();
        }
        if let Some(reconciler) = self.reconciler {
            // Bounded: a hung API call must not hold the stop past the pod's grace period.
            if tokio::time::timeout(std::time::Duration::from_secs(5), reconciler)
                .await
                .is_err()
            {
                warn!("node-loss reconciler did not stop in 5 s");
            }
        }
    }
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
    let background = Background::start(&driver, &metrics).await?;
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
        router = router.add_service(csi::controller_server::ControllerServer::new(
            ControllerService::new(driver.clone()),
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
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
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
        let staged = private.join(name);
        let listener = std::os::unix::net::UnixListener::bind(&staged)?;
        fs::set_permissions(&staged, fs::Permissions::from_mode(mode))?;
        nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            &staged,
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
