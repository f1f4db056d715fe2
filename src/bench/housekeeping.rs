//! The `housekeeping` workload: what a node's driver is asked while no volume changes, sped up.
//! In a node plugin's pod, csi-provisioner (node deployment, capacity tracking) polls
//! GetCapacity for each StorageClass, livenessprobe calls Probe, kubelet asks
//! NodeGetCapabilities and NodeGetInfo, and Prometheus scrapes the metrics. One client makes
//! those calls in turn, a round every `--interval`, for `--runtime`. Those calls run code no
//! volume cycle runs, and a node keeps it resident: the report gives the driver's memory before
//! and after beside each call's latencies.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde::Serialize;
use stickyvol::csi;
use tonic::Status;

use crate::cli::{AccessType, HousekeepingArgs};
use crate::client::{DriverInfo, timed};
use crate::report::{self, Recorder, Rpc, RpcSummary, kib};
use crate::workload::{Fatal, Session, Target, ready_to_work};

/// Far more than any metrics page of ours (about 400 lines): a scrape stops reading here.
const MAX_SCRAPE_BYTES: u64 = 16 << 20;

#[derive(Debug, Serialize)]
pub struct HousekeepingReport {
    pub workload: &'static str,
    pub driver: DriverInfo,
    pub runtime_s: f64,
    pub rounds: u64,
    pub metrics_address: Option<String>,
    pub calls: BTreeMap<&'static str, RpcSummary>,
    pub discovery: BTreeMap<&'static str, RpcSummary>,
    pub memory: Memory,
    pub errors_total: u64,
    pub leftovers: Vec<String>,
    #[serde(skip)]
    recorder: Recorder,
}

/// The driver's memory (KiB), when its pid is known.
#[derive(Debug, Default, Serialize)]
pub struct Memory {
    pub pid: Option<u32>,
    /// VmRSS before the first round.
    pub before_rss_kib: Option<u64>,
    /// VmRSS after the last round.
    pub end_rss_kib: Option<u64>,
    /// VmHWM at the end.
    pub peak_rss_kib: Option<u64>,
}

pub async fn housekeeping(args: &HousekeepingArgs) -> Result<HousekeepingReport, Fatal> {
    let common = args.common();
    let session = Session::open(&common).await?;
    let (session, mut target, discovery, mut base_dirs) = ready_to_work(session, &common).await?;
    let mut memory = Memory {
        pid: session.pid,
        before_rss_kib: session.rss_kib(),
        ..Memory::default()
    };
    let mut recorder = Recorder::default();
    let mut rounds = 0;
    let started = Instant::now();
    while started.elapsed() < args.runtime {
        round(args, &mut target, &mut recorder).await;
        rounds += 1;
        tokio::time::sleep(args.interval).await;
    }
    memory.end_rss_kib = session.rss_kib();
    memory.peak_rss_kib = session.peak_kib();
    let mut leftovers = base_dirs.remove();
    if let Err(err) = session.close().await {
        leftovers.push(err);
    }
    Ok(HousekeepingReport {
        workload: "housekeeping",
        driver: target.info,
        runtime_s: started.elapsed().as_secs_f64(),
        rounds,
        metrics_address: args.metrics_address.clone(),
        calls: recorder.summary(),
        discovery: discovery.summary(),
        memory,
        errors_total: discovery.errors() + recorder.errors(),
        leftovers,
        recorder,
    })
}

/// Each call once: a capacity poll per access type, the capability and info calls, Probe,
/// and a scrape.
async fn round(args: &HousekeepingArgs, target: &mut Target, recorder: &mut Recorder) {
    for access in [AccessType::Mount, AccessType::Block] {
        target.set_access(access);
        let request = target.csi.request(capacity_request(target));
        let mut controller = target.csi.controller.clone();
        let _ = timed(recorder, Rpc::GetCapacity, controller.get_capacity(request)).await;
    }
    let csi = &target.csi;
    let mut node = csi.node.clone();
    let request = csi.request(csi::NodeGetCapabilitiesRequest {});
    let _ = timed(
        recorder,
        Rpc::NodeGetCapabilities,
        node.node_get_capabilities(request),
    )
    .await;
    let request = csi.request(csi::NodeGetInfoRequest {});
    let _ = timed(recorder, Rpc::NodeGetInfo, node.node_get_info(request)).await;
    let request = csi.request(csi::ProbeRequest {});
    let _ = timed(recorder, Rpc::Probe, csi.identity.clone().probe(request)).await;
    if let Some(address) = &args.metrics_address {
        let started = Instant::now();
        let scraped = scrape(address.clone(), args.deadline).await;
        let error = scraped.err().map(Status::unavailable);
        recorder.record(Rpc::MetricsScrape, started.elapsed(), error.as_ref());
    }
}

/// GetCapacity as csi-provisioner's capacity controller asks it: the class's parameters, one
/// volume capability, the node's topology segment.
fn capacity_request(target: &Target) -> csi::GetCapacityRequest {
    csi::GetCapacityRequest {
        volume_capabilities: vec![target.capability()],
        parameters: target.parameters().clone(),
        accessible_topology: target.info.topology.as_ref().map(|segments| csi::Topology {
            segments: segments.clone(),
        }),
    }
}

/// GET /metrics over a connection of its own (as Prometheus does at each scrape when the
/// target closes idle ones); Ok when the answer is a 200 with a body.
async fn scrape(address: String, deadline: Duration) -> Result<(), String> {
    let fetched = tokio::task::spawn_blocking(move || fetch_metrics(&address, deadline)).await;
    let (status_line, body_bytes) = fetched.map_err(|err| format!("scrape task: {err}"))??;
    if status_line.split(' ').nth(1) != Some("200") {
        return Err(format!("GET /metrics: {status_line}"));
    }
    if body_bytes == 0 {
        return Err("GET /metrics: an empty page".into());
    }
    Ok(())
}

/// The status line and the number of bytes after the headers.
fn fetch_metrics(address: &str, deadline: Duration) -> Result<(String, usize), String> {
    let context = |err: std::io::Error| format!("GET http://{address}/metrics: {err}");
    let mut stream = TcpStream::connect(address).map_err(context)?;
    stream.set_read_timeout(Some(deadline)).map_err(context)?;
    stream.set_write_timeout(Some(deadline)).map_err(context)?;
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).map_err(context)?;
    let mut answer = Vec::new();
    stream
        .take(MAX_SCRAPE_BYTES)
        .read_to_end(&mut answer)
        .map_err(context)?;
    let status_line = String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    let body_bytes = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(0, |end| answer.len() - end - 4);
    Ok((status_line, body_bytes))
}

pub fn text(r: &HousekeepingReport) -> String {
    let mut out = format!(
        "housekeeping: {} rounds in {:.1} s{}\n",
        r.rounds,
        r.runtime_s,
        r.metrics_address.as_ref().map_or_else(
            || ", no metrics scraped".into(),
            |a| format!(", metrics of {a}")
        ),
    );
    out += &report::table(&r.recorder);
    let m = &r.memory;
    out += &format!(
        "driver RSS (pid {}): before {}, end {}, peak {}\n",
        m.pid.map_or_else(|| "unknown".into(), |p| p.to_string()),
        kib(m.before_rss_kib),
        kib(m.end_rss_kib),
        kib(m.peak_rss_kib),
    );
    out += &report::errors_section(&report::error_lines(&r.recorder));
    out
}
