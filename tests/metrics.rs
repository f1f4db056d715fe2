//! Prometheus metrics (`--metrics-address`): RPC counts and latency histograms from the gRPC
//! layer, volume and data-dir figures at scrape time, scraped over plain HTTP/1.1 and checked
//! exactly against the calls the test made.

mod common;

use common::scrape::{Exposition, parse_http_response};
use common::*;

const REQUESTS: &str = "stickyvol_rpc_requests_total";
const VOLUMES: &str = "stickyvol_volumes";
const PROVISIONED: &str = "stickyvol_provisioned_bytes";

fn snw_mount() -> csi::VolumeCapability {
    mount_cap(Mode::SingleNodeWriter)
}

/// Count of `method` calls answered with `code` (tonic's Debug spelling, e.g. "InvalidArgument");
/// 0 when the series does not exist.
fn requests(metrics: &Exposition, method: &str, code: &str) -> f64 {
    metrics
        .get(REQUESTS, &[("method", method), ("code", code)])
        .unwrap_or(0.0)
}

fn volumes(metrics: &Exposition, mode: &str, state: &str) -> f64 {
    metrics.value(VOLUMES, &[("mode", mode), ("state", state)])
}

fn provisioned(metrics: &Exposition, mode: &str) -> f64 {
    metrics.value(PROVISIONED, &[("mode", mode)])
}

/// Checks `method`'s latency histogram is well-formed and holds `count` observations.
#[track_caller]
fn assert_histogram(metrics: &Exposition, method: &str, count: u64) {
    let name = "stickyvol_rpc_duration_seconds";
    assert_eq!(
        metrics.value(&format!("{name}_count"), &[("method", method)]),
        count as f64,
        "{method} observations"
    );
    let sum = metrics.value(&format!("{name}_sum"), &[("method", method)]);
    assert!(sum >= 0.0 && sum.is_finite(), "{method} sum {sum}");
    let mut buckets: Vec<(f64, f64)> = metrics
        .named(&format!("{name}_bucket"))
        .filter(|s| s.labels.get("method").map(String::as_str) == Some(method))
        .map(|s| {
            assert_eq!(s.labels.len(), 2, "bucket labels: {:?}", s.labels);
            let le = s.labels.get("le").expect("bucket without le");
            (le.parse::<f64>().expect("numeric le"), s.value)
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(buckets.len() > 1, "{method} buckets: {buckets:?}");
    assert!(
        buckets.windows(2).all(|w| w[0].1 <= w[1].1),
        "{method} buckets must be cumulative: {buckets:?}"
    );
    assert_eq!(
        buckets.last().copied(),
        Some((f64::INFINITY, count as f64)),
        "the +Inf bucket holds every observation of {method}"
    );
}

#[tokio::test]
async fn rpc_and_volume_figures_match_the_calls_made() {
    let driver = TestDriver::start_with_metrics(Options::default()).await;
    // Distinct sizes, one not a multiple of 4 KiB, so sums mean something.
    let published = driver
        .create(create_request(&new_name(), snw_mount(), SIZE))
        .await;
    let unpublished = driver
        .create(create_request(&new_name(), snw_mount(), 3 * SIZE + 1))
        .await;
    let block = driver
        .create(create_request(
            &new_name(),
            block_cap(Mode::SingleNodeWriter),
            2 * SIZE,
        ))
        .await;
    assert_eq!(unpublished.capacity_bytes, 3 * SIZE + 4096);
    driver.publish_at_new_target(&published, snw_mount()).await;
    expect_code(driver.delete("").await, Code::InvalidArgument);

    let metrics = driver.scrape();
    assert!(metrics.has_eof, "OpenMetrics text ends with # EOF");
    for (family, kind) in [
        ("stickyvol_rpc_requests", "counter"),
        ("stickyvol_rpc_duration_seconds", "histogram"),
        (VOLUMES, "gauge"),
        (PROVISIONED, "gauge"),
        ("stickyvol_data_dir_capacity_bytes", "gauge"),
        ("stickyvol_data_dir_free_bytes", "gauge"),
    ] {
        assert_eq!(
            metrics.types.get(family).map(String::as_str),
            Some(kind),
            "# TYPE of {family}"
        );
    }

    assert_eq!(
        metrics.value(REQUESTS, &[("method", "CreateVolume"), ("code", "Ok")]),
        3.0
    );
    assert_eq!(
        metrics.value(REQUESTS, &[("method", "NodePublishVolume"), ("code", "Ok")]),
        1.0
    );
    assert_eq!(
        metrics.value(
            REQUESTS,
            &[("method", "DeleteVolume"), ("code", "InvalidArgument")]
        ),
        1.0
    );
    assert_eq!(requests(&metrics, "DeleteVolume", "Ok"), 0.0);
    for sample in metrics.named(REQUESTS) {
        let method = sample.labels["method"].as_str();
        let code = sample.labels["code"].as_str();
        assert_eq!(sample.labels.len(), 2, "{sample:?}");
        // Besides ours, only the harness's readiness probes.
        assert!(
            matches!(
                (method, code),
                ("CreateVolume", "Ok")
                    | ("NodePublishVolume", "Ok")
                    | ("DeleteVolume", "InvalidArgument")
                    | ("Probe", "Ok")
            ),
            "unexpected series {sample:?}"
        );
    }
    assert_histogram(&metrics, "CreateVolume", 3);
    assert_histogram(&metrics, "NodePublishVolume", 1);
    assert_histogram(&metrics, "DeleteVolume", 1);

    assert_eq!(volumes(&metrics, "filesystem", "published"), 1.0);
    assert_eq!(volumes(&metrics, "filesystem", "unpublished"), 1.0);
    assert_eq!(volumes(&metrics, "block", "published"), 0.0);
    assert_eq!(volumes(&metrics, "block", "unpublished"), 1.0);
    assert_eq!(volumes(&metrics, "image-ext4", "unpublished"), 0.0);
    assert_eq!(volumes(&metrics, "image-xfs", "published"), 0.0);
    assert_eq!(
        metrics.named(VOLUMES).count(),
        8,
        "one series per kind (filesystem, block, image-ext4, image-xfs) and state"
    );
    assert_eq!(
        provisioned(&metrics, "filesystem"),
        (published.capacity_bytes + unpublished.capacity_bytes) as f64
    );
    assert_eq!(provisioned(&metrics, "block"), block.capacity_bytes as f64);
    assert_eq!(provisioned(&metrics, "image-ext4"), 0.0);
    assert_eq!(metrics.named(PROVISIONED).count(), 4, "one series per kind");

    let capacity = metrics.value("stickyvol_data_dir_capacity_bytes", &[]);
    let free = metrics.value("stickyvol_data_dir_free_bytes", &[]);
    assert!(free > 0.0, "free {free}");
    assert!(free <= capacity, "free {free} > capacity {capacity}");
    // The default pool is the data directory: the same filesystem, give or take what was
    // written between the two statvfs calls of the scrape.
    let pool = [("pool", "default")];
    assert_eq!(
        metrics.value("stickyvol_pool_capacity_bytes", &pool),
        capacity
    );
    let pool_free = metrics.value("stickyvol_pool_free_bytes", &pool);
    assert!(
        (pool_free - free).abs() < (64 << 20) as f64,
        "pool free {pool_free}, data dir free {free}"
    );
    assert_eq!(metrics.value("stickyvol_pool_filesystem_full", &pool), 0.0);

    assert_eq!(
        metrics.value("stickyvol_ready", &[]),
        1.0,
        "as Probe answers"
    );

    // The release and the commit (build.rs: git's, or "unknown" without it), and the start.
    let info: Vec<_> = metrics.named("stickyvol_build_info").collect();
    assert_eq!(info.len(), 1, "{info:?}");
    assert_eq!(info[0].value, 1.0);
    assert_eq!(info[0].labels["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(info[0].labels["revision"], stickyvol::REVISION);
    let started = metrics.value("stickyvol_start_time_seconds", &[]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        started > now - 3600.0 && started <= now,
        "started {started}, now {now}"
    );
}

#[tokio::test]
async fn figures_follow_unpublish_delete_and_expansion() {
    let driver = TestDriver::start_with_metrics(Options::default()).await;
    let (block, target) = driver.published_block_volume().await;
    let metrics = driver.scrape();
    assert_eq!(volumes(&metrics, "block", "published"), 1.0);
    assert_eq!(volumes(&metrics, "block", "unpublished"), 0.0);
    assert_eq!(provisioned(&metrics, "block"), SIZE as f64);

    let grown = driver
        .expand(expand_request(&block.volume_id, &target, 2 * SIZE, 0))
        .await
        .expect("NodeExpandVolume");
    assert_eq!(grown, 2 * SIZE);
    let metrics = driver.scrape();
    assert_eq!(provisioned(&metrics, "block"), grown as f64);
    assert_eq!(requests(&metrics, "NodeExpandVolume", "Ok"), 1.0);

    driver.unpublish_ok(&block, &target).await;
    let metrics = driver.scrape();
    assert_eq!(volumes(&metrics, "block", "published"), 0.0);
    assert_eq!(volumes(&metrics, "block", "unpublished"), 1.0);

    driver.delete(&block.volume_id).await.unwrap();
    driver.delete(&block.volume_id).await.unwrap();
    expect_code(driver.unpublish("", &target).await, Code::InvalidArgument);
    let metrics = driver.scrape();
    assert_eq!(volumes(&metrics, "block", "unpublished"), 0.0);
    assert_eq!(provisioned(&metrics, "block"), 0.0);
    assert_eq!(provisioned(&metrics, "filesystem"), 0.0);
    // Counters keep counting across scrapes; a scrape is not an RPC.
    assert_eq!(requests(&metrics, "CreateVolume", "Ok"), 1.0);
    assert_eq!(requests(&metrics, "NodePublishVolume", "Ok"), 1.0);
    assert_eq!(requests(&metrics, "NodeUnpublishVolume", "Ok"), 1.0);
    assert_eq!(
        requests(&metrics, "NodeUnpublishVolume", "InvalidArgument"),
        1.0
    );
    assert_eq!(requests(&metrics, "DeleteVolume", "Ok"), 2.0);
    assert_histogram(&metrics, "DeleteVolume", 2);
    assert_histogram(&metrics, "NodeUnpublishVolume", 2);
}

#[tokio::test]
async fn only_get_metrics_is_served() {
    let driver = TestDriver::start_with_metrics(Options::default()).await;
    let response = driver.metrics_get("/metrics");
    assert_eq!(response.status, 200);
    let content_type = response.header("content-type").unwrap_or_default();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "content-type {content_type:?}"
    );
    for path in ["/", "/metric", "/metrics/", "/metrics/x", "/healthz"] {
        let response = driver.metrics_get(path);
        assert_eq!(response.status, 404, "GET {path}: {response:?}");
        assert!(
            !response.body.contains("stickyvol_"),
            "GET {path} must not expose metrics: {response:?}"
        );
    }
    // Still serving after the refusals.
    driver.scrape();
}

#[tokio::test]
async fn a_taken_metrics_address_stops_the_start() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap();
    let mut driver = TestDriver::prepare(Options {
        metrics_address: Some(address),
        ..Default::default()
    });
    let status = driver
        .try_start_again()
        .await
        .expect_err("the driver started although its metrics address is taken");
    assert!(!status.success(), "{status}");
    let log = driver.log_text();
    assert!(
        log.contains(&format!("metrics address {address}")),
        "the log names the address:\n{log}"
    );
    assert!(
        !exists_no_follow(&driver.socket) && !exists_no_follow(&driver.admin_socket),
        "the sockets are removed on the way out"
    );
}

#[test]
fn the_scrape_helpers_parse_what_they_are_given() {
    let text = concat!(
        "# HELP a Something.\n",
        "# TYPE a counter\n",
        "a_total{method=\"Create\",code=\"Ok\"} 3\n",
        "a_total{code=\"x\\\"y\\\\z\\n\",method=\"M\"} 1.5\n",
        "b 7\n",
        "c_bucket{le=\"+Inf\"} 2\n",
        "# EOF\n",
    );
    let e = Exposition::parse(text);
    assert!(e.has_eof);
    assert_eq!(e.types["a"], "counter");
    assert_eq!(
        e.value("a_total", &[("code", "Ok"), ("method", "Create")]),
        3.0
    );
    assert_eq!(
        e.value("a_total", &[("method", "M"), ("code", "x\"y\\z\n")]),
        1.5
    );
    assert_eq!(
        e.get("a_total", &[("method", "Create")]),
        None,
        "label sets match exactly"
    );
    assert_eq!(e.value("b", &[]), 7.0);
    assert_eq!(e.value("c_bucket", &[("le", "+Inf")]), 2.0);
    assert_eq!(e.named("a_total").count(), 2);
    let twice = std::panic::catch_unwind(|| Exposition::parse("b 1\nb 2\n"));
    assert!(twice.is_err(), "a repeated sample is malformed");

    let response = parse_http_response(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    )
    .unwrap();
    assert_eq!((response.status, response.body.as_str()), (200, "abcde"));
    let response =
        parse_http_response(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno").unwrap();
    assert_eq!((response.status, response.body.as_str()), (404, "no"));
    assert!(parse_http_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nno").is_err());
}

/// The state journals' figures: one commit per record change, a flush per commit at most, and
/// the journal's health.
#[tokio::test]
async fn journal_figures_count_commits_flushes_and_health() {
    let driver = TestDriver::start_with_metrics(Options::default()).await;
    let journal = |metrics: &Exposition, name: &str, journal: &str| {
        metrics.value(
            &format!("stickyvol_journal_{name}"),
            &[("journal", journal)],
        )
    };
    let metrics = driver.scrape();
    for name in ["volumes", "snapshots"] {
        assert_eq!(journal(&metrics, "commits_total", name), 0.0, "{name}");
        assert_eq!(journal(&metrics, "healthy", name), 1.0, "{name}");
        assert_eq!(journal(&metrics, "generations", name), 1.0, "{name}");
    }

    let kept = driver.create_fs_volume().await;
    let deleted = driver.create_fs_volume().await;
    driver.delete(&deleted.volume_id).await.unwrap();
    // Deleting again changes no record.
    driver.delete(&deleted.volume_id).await.unwrap();
    let metrics = driver.scrape();
    assert_eq!(journal(&metrics, "commits_total", "volumes"), 3.0);
    let flushes = journal(&metrics, "flushes_total", "volumes");
    assert!((1.0..=3.0).contains(&flushes), "{flushes} flushes");
    assert!(journal(&metrics, "flush_seconds_total", "volumes") > 0.0);
    assert_eq!(journal(&metrics, "commits_total", "snapshots"), 0.0);
    assert_eq!(journal(&metrics, "healthy", "volumes"), 1.0);
    let failed = metrics.value(
        "stickyvol_journal_compactions_total",
        &[("journal", "volumes"), ("result", "failed")],
    );
    assert_eq!(failed, 0.0);
    driver.delete(&kept.volume_id).await.unwrap();
}

// The metrics server against hostile clients. Each test shortens the limits with the hidden
// `--metrics-*` flags so it takes a second or two, and drives raw sockets as such a client would.

/// A driver serving metrics with these limits (`None`: the driver's default).
async fn driver_with_limits(
    header_timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
    max_connections: Option<u32>,
) -> TestDriver {
    let mut extra_args = Vec::new();
    if let Some(ms) = header_timeout_ms {
        extra_args.push(format!("--metrics-header-timeout-ms={ms}"));
    }
    if let Some(ms) = idle_timeout_ms {
        extra_args.push(format!("--metrics-idle-timeout-ms={ms}"));
    }
    if let Some(n) = max_connections {
        extra_args.push(format!("--metrics-max-connections={n}"));
    }
    TestDriver::start_with_metrics(Options {
        extra_args,
        ..Default::default()
    })
    .await
}

/// What a slow client sends: a request head without its final empty line.
const HALF_REQUEST: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: stickyvol\r\nAccept: */*\r\n";

fn connect_and_send(address: std::net::SocketAddr, bytes: &[u8]) -> std::net::TcpStream {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(address)
        .unwrap_or_else(|e| panic!("connecting to {address}: {e}"));
    stream.write_all(bytes).expect("sending");
    stream
}

/// Reads until the server closes `stream` (end of stream or reset), for at most `within`:
/// what the server sent before closing, or `Err` if the connection is still open.
fn closed_within(
    stream: &mut std::net::TcpStream,
    within: std::time::Duration,
) -> Result<Vec<u8>, String> {
    use std::io::{ErrorKind, Read};
    let deadline = std::time::Instant::now() + within;
    let mut received = Vec::new();
    let mut buf = [0u8; 64 << 10];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(format!("still open after {within:?}"));
        }
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return Ok(received),
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(received),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(format!("still open after {within:?}"));
            }
            Err(e) => return Err(format!("reading: {e}")),
        }
    }
}

/// One GET /metrics that may fail (refused, closed unanswered).
fn try_scrape(address: std::net::SocketAddr) -> Result<Exposition, String> {
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    let mut stream = std::net::TcpStream::connect(address).map_err(|e| e.to_string())?;
    std::io::Write::write_all(&mut stream, request.as_bytes()).map_err(|e| e.to_string())?;
    let raw = closed_within(&mut stream, std::time::Duration::from_secs(5))?;
    let response = parse_http_response(&raw)?;
    if response.status != 200 {
        return Err(format!("status {}", response.status));
    }
    Ok(Exposition::parse(&response.body))
}

const REFUSED: &str = "stickyvol_metrics_connections_refused_total";
const TIMED_OUT: &str = "stickyvol_metrics_connections_timed_out_total";

#[tokio::test]
async fn half_requests_are_dropped_after_the_header_timeout_while_scrapes_go_on() {
    let header_timeout = std::time::Duration::from_millis(1500);
    let driver = driver_with_limits(Some(1500), None, Some(64)).await;
    let address = driver.metrics_address();
    let slow: Vec<_> = (0..40)
        .map(|_| {
            (
                std::time::Instant::now(),
                connect_and_send(address, HALF_REQUEST),
            )
        })
        .collect();
    // Served beside them: none has timed out yet.
    let metrics = driver.scrape();
    assert_eq!(metrics.value(TIMED_OUT, &[]), 0.0);
    for (opened, mut stream) in slow {
        closed_within(&mut stream, std::time::Duration::from_secs(3))
            .unwrap_or_else(|why| panic!("a half request: {why}"));
        assert!(
            opened.elapsed() >= header_timeout,
            "closed after {:?}, before the header timeout",
            opened.elapsed()
        );
    }
    let metrics = driver.scrape();
    assert_eq!(metrics.value(TIMED_OUT, &[]), 40.0);
    assert_eq!(metrics.value(REFUSED, &[]), 0.0);
}

#[tokio::test]
async fn connections_over_the_cap_are_closed_at_once() {
    // Held connections do not time out during the test.
    let driver = driver_with_limits(Some(30_000), Some(30_000), Some(4)).await;
    let address = driver.metrics_address();
    let mut held: Vec<_> = (0..3).map(|_| connect_and_send(address, b"")).collect();
    // The fourth slot serves a scrape.
    try_scrape(address).expect("a scrape within the cap");
    held.push(connect_and_send(address, HALF_REQUEST));
    let mut over = connect_and_send(address, HALF_REQUEST);
    let answer = closed_within(&mut over, std::time::Duration::from_secs(2))
        .unwrap_or_else(|why| panic!("a connection over the cap: {why}"));
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    try_scrape(address).expect_err("a scrape over the cap is refused");
    for stream in &mut held {
        assert_eq!(
            closed_within(stream, std::time::Duration::from_millis(200)),
            Err("still open after 200ms".to_string()),
            "connections within the cap stay open"
        );
    }
    drop(held);
    // Their slots come free as the server sees them close.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let metrics = loop {
        match try_scrape(address) {
            Ok(metrics) => break metrics,
            Err(why) if std::time::Instant::now() < deadline => {
                eprintln!("not yet: {why}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(why) => panic!("no scrape after the held connections closed: {why}"),
        }
    };
    assert!(
        metrics.value(REFUSED, &[]) >= 2.0,
        "{}",
        metrics.value(REFUSED, &[])
    );
    assert_eq!(metrics.value(TIMED_OUT, &[]), 0.0);
}

#[tokio::test]
async fn an_oversized_request_head_is_refused() {
    let driver = driver_with_limits(None, None, None).await;
    let head = format!(
        "GET /metrics HTTP/1.1\r\nHost: stickyvol\r\nX-Padding: {}\r\n\r\n",
        "a".repeat(16 << 10)
    );
    let mut stream = connect_and_send(driver.metrics_address(), head.as_bytes());
    let answer = closed_within(&mut stream, std::time::Duration::from_secs(3))
        .unwrap_or_else(|why| panic!("an oversized head: {why}"));
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 431 "),
        "answer to a 16 KiB head: {answer}"
    );
    driver.scrape();
}

/// A client that sends requests and never reads the answers: once the socket buffers are full
/// nothing moves, and the idle timeout closes the connection, which the client sees (in its TCP
/// state: a FIN or a reset received) without reading a byte.
#[tokio::test]
async fn a_client_that_stops_reading_is_dropped_after_the_idle_timeout() {
    const REQUESTS: usize = 3000;
    let driver = driver_with_limits(Some(30_000), Some(500), None).await;
    let address = driver.metrics_address();
    let request = "GET /metrics HTTP/1.1\r\nHost: stickyvol\r\n\r\n".repeat(REQUESTS);
    let stream = std::net::TcpStream::connect(address).unwrap();
    let mut writer = stream.try_clone().unwrap();
    // Blocks once the server stops reading; ends with an error when it closes.
    let sender = std::thread::spawn(move || {
        let _ = std::io::Write::write_all(&mut writer, request.as_bytes());
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(8);
    while !closed_by_peer(&stream) {
        assert!(
            std::time::Instant::now() < deadline,
            "a client that does not read is still connected"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    sender.join().unwrap();
    let metrics = driver.scrape();
    assert_eq!(metrics.value(TIMED_OUT, &[]), 1.0);
}

/// Whether the other end closed or reset `stream`, read from its TCP state (reading would let
/// the server write on).
fn closed_by_peer(stream: &std::net::TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: tcp_info is plain data; the kernel writes at most `len` bytes of it.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
    // TCP_CLOSE_WAIT: a FIN came; TCP_CLOSE: a reset came.
    matches!(info.tcpi_state, 7 | 8)
}

/// Probe (the liveness probe's call) answers promptly while the metrics port is flooded with
/// clients that send half a request and with clients that request without reading.
#[tokio::test]
async fn probe_answers_promptly_while_the_metrics_port_is_flooded() {
    let driver = driver_with_limits(None, None, None).await;
    let address = driver.metrics_address();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let full = "GET /metrics HTTP/1.1\r\nHost: stickyvol\r\n\r\n".repeat(50);
            let mut open = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && open.len() < 2000 {
                let bytes = if open.len() % 2 == 0 {
                    HALF_REQUEST
                } else {
                    full.as_bytes()
                };
                if let Ok(mut stream) = std::net::TcpStream::connect(address) {
                    let _ = stream.set_write_timeout(Some(std::time::Duration::from_millis(10)));
                    let _ = std::io::Write::write_all(&mut stream, bytes);
                    open.push(stream);
                }
            }
            open.len()
        })
    };
    let mut slowest = std::time::Duration::ZERO;
    for _ in 0..20 {
        let started = std::time::Instant::now();
        let ready = driver
            .identity()
            .probe(csi::ProbeRequest {})
            .await
            .expect("Probe")
            .into_inner()
            .ready;
        assert_eq!(ready, Some(true));
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let opened = flood.join().unwrap();
    eprintln!("{opened} flooding connections; slowest Probe {slowest:?}");
    assert!(opened > 100, "the flood opened only {opened} connections");
    assert!(
        slowest < std::time::Duration::from_secs(1),
        "Probe took {slowest:?} under the flood"
    );
}

/// The metrics server holds the driver weakly: a clean stop still drops the volumes and
/// writes their records back, which a stop with a metrics port used to skip (the thread kept
/// the driver alive past the exit).
#[tokio::test]
async fn a_clean_stop_with_a_metrics_port_writes_the_records_back() {
    let mut driver = TestDriver::start_with_metrics(Options::default()).await;
    driver.scrape();
    // In the journal only (compaction is minutes away): only the stop's write-back puts it in
    // a record file.
    let volume = driver.create_fs_volume().await;
    driver.stop().await;
    let record = driver
        .data
        .join("state")
        .join(format!("{}.json", volume.volume_id));
    assert!(
        record.exists(),
        "no record file written back for {record:?}"
    );
    // The record files alone (the old layout, no journal) hold the volume.
    std::fs::remove_dir_all(driver.data.join("state/journal")).unwrap();
    driver.start_again().await;
    assert_eq!(
        driver.listed_ids().await,
        std::slice::from_ref(&volume.volume_id)
    );
    driver.delete(&volume.volume_id).await.unwrap();
}
