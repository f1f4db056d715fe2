//! The HTTP/1.1 server behind `--metrics-address`, built to survive hostile clients: anyone who
//! can reach the port may connect, so a client gets a bounded share of it and nothing more.
//!
//! - Threads of its own: one OS thread runs a current-thread tokio runtime for the sockets, and
//!   rendering runs on that runtime's single blocking thread. A flood of scrapes queues behind
//!   itself and never takes a thread from the pool CSI calls and Probe run on.
//! - A cap on open connections: one over it is closed as soon as it is accepted, and counted.
//! - A header timeout: a request head must be complete within it, counted from the connection
//!   opening or from the previous response, so it also closes kept-alive connections left idle.
//! - An idle timeout: a connection on which no byte moves either way for that long (a client
//!   that stops reading its responses) is closed.
//! - A bound on a request head's size and header count.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, oneshot};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::Metrics;
use crate::config::MetricsLimits as Limits;
use crate::faces::driver::Driver;

/// A request head larger than this is refused (431): hyper's smallest read buffer, some 20
/// times what Prometheus sends.
const MAX_HEAD_BYTES: usize = 8 << 10;
/// Prometheus sends about five headers.
const MAX_HEADERS: usize = 32;
/// Refusals over the cap are logged at most this often (the counter has every one).
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Listens on `address`, then serves GET /metrics from a thread of its own until the process
/// ends. Returns once listening, or with the error that kept it from listening. The thread
/// holds the driver weakly: a stop drops the volumes (their records' write-back) whatever a
/// scrape is doing, and a scrape after that answers 503.
pub async fn serve(
    address: SocketAddr,
    limits: Limits,
    metrics: Arc<Metrics>,
    driver: Arc<Driver>,
) -> io::Result<()> {
    let (listening, listened) = oneshot::channel();
    let driver = Arc::downgrade(&driver);
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            // Built and dropped on this thread: a runtime may not be dropped inside another.
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .max_blocking_threads(1)
                .thread_name("metrics-render")
                .build()
            {
                Ok(runtime) => runtime,
                Err(err) => {
                    let _ = listening.send(Err(err));
                    return;
                }
            };
            runtime.block_on(async move {
                let listener = match TcpListener::bind(address).await {
                    Ok(listener) => listener,
                    Err(err) => {
                        let _ = listening.send(Err(err));
                        return;
                    }
                };
                if let Ok(local) = listener.local_addr() {
                    info!(address = %local, ?limits, "serving Prometheus metrics on /metrics");
                }
                let _ = listening.send(Ok(()));
                accept_loop(listener, limits, metrics, driver).await;
            });
        })?;
    listened.await.unwrap_or_else(|_| {
        Err(io::Error::other(
            "the metrics thread ended before listening",
        ))
    })
}

async fn accept_loop(
    listener: TcpListener,
    limits: Limits,
    metrics: Arc<Metrics>,
    driver: Weak<Driver>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut refused_since_log = 0u64;
    let mut last_refusal_log: Option<Instant> = None;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                warn!(error = %err, "metrics: accept failed");
                // E.g. out of descriptors: do not spin while it lasts.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Taken here, in accept order, so the cap holds exactly.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            metrics.connection_refused();
            refused_since_log += 1;
            if last_refusal_log.is_none_or(|at| at.elapsed() >= REFUSAL_LOG_INTERVAL) {
                warn!(
                    %peer,
                    refused = refused_since_log,
                    max_connections = limits.max_connections,
                    "metrics: connections over the cap closed at once"
                );
                refused_since_log = 0;
                last_refusal_log = Some(Instant::now());
            }
            continue;
        };
        let metrics = metrics.clone();
        let driver = driver.clone();
        tokio::spawn(async move {
            serve_connection(stream, peer, limits, metrics, driver).await;
            drop(slot);
        });
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    limits: Limits,
    metrics: Arc<Metrics>,
    driver: Weak<Driver>,
) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched {
        stream,
        activity: activity.clone(),
    });
    let service = {
        let metrics = metrics.clone();
        service_fn(move |request| {
            let metrics = metrics.clone();
            let driver = driver.clone();
            async move { Ok::<_, Infallible>(respond(request, metrics, driver).await) }
        })
    };
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS)
        .serve_connection(io, service);
    tokio::pin!(connection);
    loop {
        let idle_until = activity.last() + limits.idle_timeout;
        tokio::select! {
            ended = connection.as_mut() => {
                match ended {
                    Ok(()) => {}
                    Err(err) if err.is_timeout() => {
                        metrics.connection_timed_out();
                        debug!(%peer, "metrics: no whole request head in time, closed");
                    }
                    Err(err) => debug!(%peer, error = %err, "metrics connection ended"),
                }
                return;
            }
            () = tokio::time::sleep_until(idle_until) => {
                if activity.last() + limits.idle_timeout <= Instant::now() {
                    metrics.connection_timed_out();
                    debug!(%peer, "metrics: connection idle too long, closed");
                    return;
                }
            }
        }
    }
}

async fn respond(
    request: Request<Incoming>,
    metrics: Arc<Metrics>,
    driver: Weak<Driver>,
) -> Response<Full<Bytes>> {
    if request.method() != Method::GET || request.uri().path() != "/metrics" {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(
                b"only GET /metrics is served\n",
            )))
            .expect("static response");
    }
    let Some(driver) = driver.upgrade() else {
        return Response::builder()
            .status(StatusCode::SERVICE_UNAVAILABLE)
            .body(Full::new(Bytes::from_static(b"the driver is stopping\n")))
            .expect("static response");
    };
    // statvfs and the index walk are blocking work: on this runtime's own blocking thread.
    let text = tokio::task::spawn_blocking(move || metrics.render(&driver))
        .await
        .unwrap_or_else(|err| format!("# metrics rendering failed: {err}\n"));
    Response::builder()
        .header(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )
        .body(Full::new(Bytes::from(text)))
        .expect("valid response")
}

/// When a connection last moved a byte, as milliseconds since it opened.
#[derive(Debug)]
struct Activity {
    opened: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            opened: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.opened + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// A TCP stream that records in [`Activity`] each read or write that moved bytes.
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
