//! Prometheus metrics (`--metrics-address`): per-RPC counts and latencies, observed in the gRPC
//! layer, and volume/data-dir figures computed at scrape time from the in-memory index and one
//! statvfs, so a scrape costs no per-volume system call. The HTTP server is in `http`.

mod http;
mod space;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

use prost::Message;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Metric, Registry};

use crate::faces::driver::Driver;
use crate::volume::space::audit::AuditTotals;
use crate::volume::state::journal;
use crate::volume::state::record::FenceCause;

pub use http::serve;
use space::Space;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    method: String,
    code: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    revision: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLossLabels {
    action: String,
    result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OnOverflowLabels {
    on_overflow: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    cause: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JournalLabels {
    journal: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CompactionLabels {
    journal: String,
    result: String,
}

/// The state journals' running totals as the last scrape read them (`Metrics::render`),
/// encoded as counters: the journals count, the registry only shows.
#[derive(Debug, Default)]
struct JournalCollector {
    latest: Mutex<Vec<journal::Stats>>,
}

/// One metric family with a sample per journal.
fn per_journal<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    journals: &[journal::Stats],
    name: &str,
    help: &str,
    metric: impl Fn(&journal::Stats) -> M,
) -> Result<(), std::fmt::Error> {
    let Some(first) = journals.first() else {
        return Ok(());
    };
    let mut family = encoder.encode_descriptor(name, help, None, metric(first).metric_type())?;
    for stats in journals {
        let labels = JournalLabels {
            journal: stats.name.clone(),
        };
        metric(stats).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for JournalCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        if latest.is_empty() {
            return Ok(());
        }
        let latest = latest.as_slice();
        per_journal(
            &mut encoder,
            latest,
            "journal_commits",
            "Record changes committed to a state journal (journal = volumes, snapshots, groups)",
            |s| ConstCounter::new(s.commits),
        )?;
        per_journal(
            &mut encoder,
            latest,
            "journal_flushes",
            "Disk flushes (fdatasync) of a state journal; commits made together share one",
            |s| ConstCounter::new(s.flushes),
        )?;
        per_journal(
            &mut encoder,
            latest,
            "journal_flush_seconds",
            "Time spent in those flushes: divided by the flushes, the disk's flush latency",
            |s| ConstCounter::new(s.flush_seconds),
        )?;
        per_journal(
            &mut encoder,
            latest,
            "journal_compaction_seconds",
            "Time spent compacting, mostly flushing the filesystems of the state and the pools",
            |s| ConstCounter::new(s.compaction_seconds),
        )?;
        per_journal(
            &mut encoder,
            latest,
            "journal_generations",
            "Journal files on disk: 1 plus those waiting for compaction (more than 2 for long: \
             compaction is failing or behind, see the log)",
            |s| ConstGauge::new(s.generations as i64),
        )?;
        per_journal(
            &mut encoder,
            latest,
            "journal_healthy",
            "1 while the journal takes commits; 0 after a failed write or flush (Probe then \
             answers not ready)",
            |s| ConstGauge::new(i64::from(s.healthy)),
        )?;
        let mut compactions = encoder.encode_descriptor(
            "journal_compactions",
            "Compactions of a state journal into the record files, by result (ok, failed)",
            None,
            MetricType::Counter,
        )?;
        for stats in latest.iter() {
            for (result, count) in [
                ("ok", stats.compactions),
                ("failed", stats.failed_compactions),
            ] {
                let labels = CompactionLabels {
                    journal: stats.name.clone(),
                    result: result.into(),
                };
                ConstCounter::new(count).encode(compactions.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AuditLabels {
    result: String,
}

/// The project-id audit's running totals as the last scrape read them (`Metrics::render`).
#[derive(Debug, Default)]
struct AuditCollector {
    latest: Mutex<Option<AuditTotals>>,
}

impl Collector for AuditCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(totals) = *self.latest.lock().unwrap_or_else(|e| e.into_inner()) else {
            return Ok(());
        };
        {
            let mut audits = encoder.encode_descriptor(
                "project_audits",
                "Audits of a volume's project ids (project quotas), by result: clean, tampered \
             (inodes found in another project and put back) or unfinished",
                None,
                MetricType::Counter,
            )?;
            for (result, count) in [
                ("clean", totals.clean),
                ("tampered", totals.tampered),
                ("unfinished", totals.unfinished),
            ] {
                let labels = AuditLabels {
                    result: result.into(),
                };
                ConstCounter::new(count).encode(audits.encode_family(&labels)?)?;
            }
        }
        ConstCounter::new(totals.repaired_inodes).encode(encoder.encode_descriptor(
            "project_audit_repaired_inodes",
            "Inodes the project-id audit found outside their volume's project and put back",
            None,
            MetricType::Counter,
        )?)?;
        ConstGauge::new(i64::try_from(totals.tampered_volumes).unwrap_or(i64::MAX)).encode(
            encoder.encode_descriptor(
                "project_audit_tampered_volumes",
                "Volumes whose last project-id audit found inodes outside their project (shown \
                 abnormal in NodeGetVolumeStats until an audit finds them clean)",
                None,
                MetricType::Gauge,
            )?,
        )?;
        ConstGauge::new(i64::try_from(totals.unfinished_volumes).unwrap_or(i64::MAX)).encode(
            encoder.encode_descriptor(
                "project_audit_unfinished_volumes",
                "Volumes whose last project-id audit did not finish (see the log)",
                None,
                MetricType::Gauge,
            )?,
        )
    }
}

type HistogramFamily = Family<MethodLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 50 µs … ~1.6 s: bind mounts take tens of µs, a large delete can take seconds.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

pub struct Metrics {
    registry: Registry,
    rpc_requests: Family<RpcLabels, Counter>,
    rpc_duration: HistogramFamily,
    space: Space,
    journals: Arc<JournalCollector>,
    audits: Arc<AuditCollector>,
    connections_refused: Counter,
    connections_timed_out: Counter,
    ready: Gauge,
    loops: LoopMetrics,
    /// Scrapes refresh the gauges, then encode: one at a time keeps the two steps consistent.
    scrape: Mutex<()>,
}

/// The figures of the background loops: node loss, orphans, overflow and restore placement.
struct LoopMetrics {
    node_loss_actions: Family<NodeLossLabels, Counter>,
    node_loss_leader: Gauge,
    orphaned_volumes: Gauge,
    fenced_volumes: Family<CauseLabels, Gauge>,
    overflowing_volumes: Family<OnOverflowLabels, Gauge>,
    overflow_evictions: Family<ResultLabels, Counter>,
    restore_placements: Family<ResultLabels, Counter>,
}

impl LoopMetrics {
    fn register(registry: &mut Registry) -> LoopMetrics {
        LoopMetrics {
            node_loss_actions: add(
                registry,
                "node_loss_actions",
                "Node-loss actions (the reconciler's release_claim, delete_pods, delete_pv, \
             drop_pv_finalizer; a node's orphan_to_lost_found) by result: done, failed \
             (retried next round) or dry_run (decided and announced, not carried out)",
            ),
            node_loss_leader: add(
                registry,
                "node_loss_leader",
                "1 while this replica holds the node-loss reconciler's Lease and acts",
            ),
            orphaned_volumes: add(
                registry,
                "orphaned_volumes",
                "Volumes of this node whose PV was found gone, their data moved to lost+found",
            ),
            fenced_volumes: add(
                registry,
                "fenced_volumes",
                "Directory volumes of this node fenced read-only, by cause: overflow (above \
             their size past the overflow check's grace, their pods not evicted) or audit (a \
             project-id audit that cannot finish)",
            ),
            overflowing_volumes: add(
                registry,
                "overflowing_volumes",
                "Published directory volumes without an enforced size measured above their \
             size, by their class's onOverflow (evict, report), as the overflow check knows \
             them: one that stats find above its size at once, one back within it from the \
             next full round",
            ),
            overflow_evictions: add(
                registry,
                "overflow_evictions",
                "Evictions the node plugins' overflow checks asked the controller for, by result: \
             evicted, refused (a PodDisruptionBudget; asked again next round), gone (the pod \
             was gone or replaced), not_allowed (not a pod of the asking node's volume, or a \
             request not acted on), failed (asked again next round)",
            ),
            restore_placements: add(
                registry,
                "restore_placements",
                "Restore and clone claims the controller looked at, by result: placed (sent to \
             their source's node), refused (the node is gone, cordoned or NotReady, or a pod \
             of the claim excludes it; looked at again), failed (the API call failed; \
             retried)",
            ),
        }
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("stickyvol");
        let ready = register_process(&mut registry);
        let rpc_requests = add(
            &mut registry,
            "rpc_requests",
            "CSI calls handled, by method and gRPC status code",
        );
        let rpc_duration: HistogramFamily = Family::new_with_constructor(latency_histogram);
        registry.register(
            "rpc_duration_seconds",
            "Time to handle a CSI call, by method",
            rpc_duration.clone(),
        );
        let space = Space::register(&mut registry);
        let journals = Arc::new(JournalCollector::default());
        registry.register_collector(Box::new(journals.clone()));
        let audits = Arc::new(AuditCollector::default());
        registry.register_collector(Box::new(audits.clone()));
        Metrics {
            ready,
            rpc_requests,
            rpc_duration,
            space,
            journals,
            audits,
            connections_refused: add(
                &mut registry,
                "metrics_connections_refused",
                "Connections to this metrics server closed unserved because it had its maximum open",
            ),
            connections_timed_out: add(
                &mut registry,
                "metrics_connections_timed_out",
                "Metrics connections closed for sending no whole request head in time, or moving \
                 no byte for too long",
            ),
            // After the metrics server's counters, as scrapes have always listed them.
            loops: LoopMetrics::register(&mut registry),
            registry,
            scrape: Mutex::new(()),
        }
    }

    /// Counts one node-loss action carried out (or failed).
    pub fn observe_node_loss(&self, action: &'static str, done: bool) {
        self.count_node_loss(action, if done { "done" } else { "failed" });
    }

    /// Counts one node-loss action decided in a dry run.
    pub fn observe_node_loss_dry_run(&self, action: &'static str) {
        self.count_node_loss(action, "dry_run");
    }

    /// How many node-loss actions were counted with these labels.
    #[cfg(test)]
    pub fn node_loss_count(&self, action: &str, result: &str) -> u64 {
        self.loops
            .node_loss_actions
            .get_or_create(&NodeLossLabels {
                action: action.to_string(),
                result: result.to_string(),
            })
            .get()
    }

    fn count_node_loss(&self, action: &'static str, result: &'static str) {
        self.loops
            .node_loss_actions
            .get_or_create(&NodeLossLabels {
                action: action.to_string(),
                result: result.to_string(),
            })
            .inc();
    }

    /// The overflow check's last full round: volumes overflowing, by their onOverflow.
    pub fn set_overflowing_volumes(&self, evict: usize, report: usize) {
        for (label, count) in [("evict", evict), ("report", report)] {
            self.loops
                .overflowing_volumes
                .get_or_create(&OnOverflowLabels {
                    on_overflow: label.into(),
                })
                .set(count as i64);
        }
    }

    /// Counts one eviction a node's overflow check asked for (`result`: a fixed set of words).
    pub fn observe_overflow_eviction(&self, result: &'static str) {
        self.loops
            .overflow_evictions
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Counts one restore-placement outcome: placed, refused or failed.
    pub fn observe_restore_placement(&self, result: &'static str) {
        self.loops
            .restore_placements
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    pub fn set_node_loss_leader(&self, leading: bool) {
        self.loops.node_loss_leader.set(i64::from(leading));
    }

    /// Records one finished RPC.
    pub fn observe_rpc(&self, method: &str, code: tonic::Code, seconds: f64) {
        // Label values come from a fixed set: a client sending made-up paths must not be able
        // to create series without bound.
        let method = if known_methods().contains(method) {
            method
        } else {
            "unknown"
        };
        self.rpc_requests
            .get_or_create(&RpcLabels {
                method: method.to_string(),
                code: format!("{code:?}"),
            })
            .inc();
        self.rpc_duration
            .get_or_create(&MethodLabels {
                method: method.to_string(),
            })
            .observe(seconds);
    }

    fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    fn connection_timed_out(&self) {
        self.connections_timed_out.inc();
    }

    /// The Prometheus text exposition, with volume figures refreshed from `driver`.
    pub fn render(&self, driver: &Driver) -> String {
        let _one_scrape = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        // Controller mode has no data directory: ready while it serves, as Probe says.
        let ready = driver
            .volumes()
            .map_or(true, |volumes| volumes.check_ready().is_ok());
        self.ready.set(i64::from(ready));
        if let Ok(volumes) = driver.volumes() {
            self.loops
                .orphaned_volumes
                .set(i64::try_from(volumes.orphaned_count()).unwrap_or(i64::MAX));
            let fenced = volumes.fenced(None);
            for cause in [FenceCause::Overflow, FenceCause::Audit] {
                let count = fenced.iter().filter(|(_, f)| f.cause == cause).count();
                let label = CauseLabels {
                    cause: format!("{cause:?}").to_lowercase(),
                };
                self.loops
                    .fenced_volumes
                    .get_or_create(&label)
                    .set(i64::try_from(count).unwrap_or(i64::MAX));
            }
            *self
                .journals
                .latest
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = volumes.journal_stats().to_vec();
            *self.audits.latest.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(volumes.audit_totals());
            self.space.refresh(&volumes);
        }
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }
}

/// What says which process runs and whether it is ready: the build's info, the start time, and
/// the readiness gauge, which is returned (a scrape sets it).
fn register_process(registry: &mut Registry) -> Gauge {
    // An OpenMetrics info family: the sample is stickyvol_build_info{...} 1.
    registry.register(
        "build",
        "The release (version) and the commit (revision) running",
        Info::new(BuildLabels {
            version: crate::VERSION.into(),
            revision: crate::REVISION.into(),
        }),
    );
    let ready = add(
        registry,
        "ready",
        "1 when the driver is ready, as CSI Probe would answer now (its data and state \
         directories writable, its journals taking commits); 0 otherwise (see the log's \
         \"not ready\")",
    );
    let start_time: Gauge = add(
        registry,
        "start_time_seconds",
        "When this process started, in seconds since the Unix epoch (a restart changes it)",
    );
    start_time.set(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| {
                i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
            }),
    );
    ready
}

/// A new metric of type `M`, registered under `name` with `help` (the registry keeps a clone).
fn add<M: Metric + Clone + Default>(registry: &mut Registry, name: &str, help: &str) -> M {
    let metric = M::default();
    registry.register(name, help, metric.clone());
    metric
}

/// Every RPC name of the CSI schema, plus gRPC reflection's.
fn known_methods() -> &'static HashSet<String> {
    static METHODS: OnceLock<HashSet<String>> = OnceLock::new();
    METHODS.get_or_init(|| {
        let schema = prost_types::FileDescriptorSet::decode(crate::FILE_DESCRIPTOR_SET)
            .expect("the embedded CSI descriptor set decodes");
        schema
            .file
            .iter()
            .flat_map(|file| &file.service)
            .flat_map(|service| &service.method)
            .filter_map(|method| method.name.clone())
            .chain(["ServerReflectionInfo".to_string()])
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_schema_methods_become_labels() {
        assert!(known_methods().contains("CreateVolume"));
        assert!(known_methods().contains("NodePublishVolume"));
        let metrics = Metrics::new();
        metrics.observe_rpc("CreateVolume", tonic::Code::Ok, 0.001);
        metrics.observe_rpc("MadeUp1", tonic::Code::Unimplemented, 0.001);
        metrics.observe_rpc("MadeUp2", tonic::Code::Unimplemented, 0.001);
        let mut text = String::new();
        encode(&mut text, &metrics.registry).unwrap();
        assert!(text.contains(r#"method="CreateVolume""#));
        assert!(
            text.contains(
                r#"stickyvol_rpc_requests_total{method="unknown",code="Unimplemented"} 2"#
            ),
            "{text}"
        );
        assert!(!text.contains("MadeUp"));
    }
}
