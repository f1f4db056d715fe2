//! The node's space, as a scrape finds it: volumes by mode and state, the data directory's and
//! each pool's filesystem, what each pool can still promise, snapshots with their copies, and
//! the other copies running.
//! Computed from the in-memory index and one statvfs per filesystem, no per-volume call (but an
//! lstat per block or image volume of a pool that is full, to count those it starves).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tracing::warn;

use super::add;
use crate::volume::Volumes;
use crate::volume::copies::in_flight::{CopyKind, copies_in_flight};
use crate::volume::space::full::FULL_BELOW_BYTES;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VolumeLabels {
    mode: String,
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    mode: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CopyLabels {
    pool: String,
    state: String,
}

pub(super) struct Space {
    volumes: Family<VolumeLabels, Gauge>,
    provisioned_bytes: Family<ModeLabels, Gauge>,
    data_dir_capacity: Gauge,
    data_dir_free: Gauge,
    pool_available: Family<PoolLabels, Gauge>,
    pool_capacity: Family<PoolLabels, Gauge>,
    pool_free: Family<PoolLabels, Gauge>,
    pool_unwritten: Family<PoolLabels, Gauge>,
    pool_full: Family<PoolLabels, Gauge>,
    pool_starved: Family<PoolLabels, Gauge>,
    snapshots: Family<PoolLabels, Gauge>,
    snapshot_copies: Family<CopyLabels, Gauge>,
    copies_in_flight: Family<KindLabels, Gauge>,
    pool_snapshot_bytes: Family<PoolLabels, Gauge>,
}

/// A byte count or a count as a gauge's value.
fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Space {
    pub(super) fn register(registry: &mut Registry) -> Space {
        Space {
            volumes: add(
                registry,
                "volumes",
                "Volumes on this node, by mode (filesystem, block, image-ext4, image-xfs) and \
                 state (published, unpublished)",
            ),
            provisioned_bytes: add(
                registry,
                "provisioned_bytes",
                "Sum of the capacities of the volumes on this node, by mode",
            ),
            data_dir_capacity: add(
                registry,
                "data_dir_capacity_bytes",
                "Size of the filesystem holding the data directory",
            ),
            data_dir_free: add(
                registry,
                "data_dir_free_bytes",
                "Bytes available to new volumes on the data directory's filesystem",
            ),
            pool_available: add(
                registry,
                "pool_available_bytes",
                "Bytes a pool can still promise to new volumes (what GetCapacity reports)",
            ),
            pool_capacity: add(
                registry,
                "pool_capacity_bytes",
                "Size of a pool's filesystem (pools on one filesystem each show all of it)",
            ),
            pool_free: add(
                registry,
                "pool_free_bytes",
                "Bytes free on a pool's filesystem (what an unprivileged writer can still use)",
            ),
            pool_unwritten: add(
                registry,
                "pool_unwritten_promised_bytes",
                "Bytes a pool's volumes may still write within their sizes, as last measured",
            ),
            pool_full: add(
                registry,
                "pool_filesystem_full",
                "1 when a pool's filesystem has less than 4 MiB free: new volumes are refused, \
                 and on the data dir's the state journal cannot rotate",
            ),
            pool_starved: add(
                registry,
                "pool_starved_volumes",
                "Thin block and image volumes of a full pool whose files still lack blocks: \
                 their pods' writes there fail (each has an Event on its claim)",
            ),
            snapshots: add(
                registry,
                "snapshots",
                "Snapshots on this node, by pool (ready or still being copied)",
            ),
            snapshot_copies: add(
                registry,
                "snapshot_copies",
                "Snapshots not ready, by pool and state: copying (their data being copied, or \
                 waiting for the next attempt) or stopped (their attempts ran out; delete them)",
            ),
            copies_in_flight: add(
                registry,
                "copies_in_flight",
                "Copies running besides snapshot copies, by kind: restore (a new volume filled \
                 from a snapshot), clone (from another volume), export, import",
            ),
            pool_snapshot_bytes: add(
                registry,
                "pool_snapshot_bytes",
                "Bytes a pool's snapshots hold on their own (not shared with volumes), as last \
                 measured",
            ),
        }
    }

    /// Every figure read again from `volumes`.
    pub(super) fn refresh(&self, volumes: &Volumes) {
        self.volumes.clear();
        self.provisioned_bytes.clear();
        for entry in volumes.census() {
            let state = if entry.published {
                "published"
            } else {
                "unpublished"
            };
            let mode = entry.kind.as_str().to_string();
            self.volumes
                .get_or_create(&VolumeLabels {
                    mode: mode.clone(),
                    state: state.into(),
                })
                .set(entry.count as i64);
            self.provisioned_bytes
                .get_or_create(&ModeLabels { mode })
                .inc_by(entry.capacity_bytes);
        }
        match volumes.space() {
            Ok(space) => {
                self.data_dir_capacity.set(gauge_value(space.total_bytes));
                self.data_dir_free.set(gauge_value(space.available_bytes));
            }
            Err(err) => warn!(error = %err, "metrics: cannot read data directory space"),
        }
        self.refresh_snapshots(volumes);
        self.refresh_pools(volumes);
    }

    fn refresh_snapshots(&self, volumes: &Volumes) {
        let copies = copies_in_flight();
        for kind in CopyKind::ALL {
            self.copies_in_flight
                .get_or_create(&KindLabels {
                    kind: kind.as_str().into(),
                })
                .set(copies.running(kind) as i64);
        }
        for census in volumes.snapshot_census() {
            for (state, count) in [
                ("copying", census.copying),
                ("stopped", census.copies_stopped),
            ] {
                self.snapshot_copies
                    .get_or_create(&CopyLabels {
                        pool: census.pool.clone(),
                        state: state.into(),
                    })
                    .set(count as i64);
            }
            let labels = PoolLabels { pool: census.pool };
            self.snapshots
                .get_or_create(&labels)
                .set(census.count as i64);
            self.pool_snapshot_bytes
                .get_or_create(&labels)
                .set(gauge_value(census.exclusive_bytes));
        }
    }

    fn refresh_pools(&self, volumes: &Volumes) {
        for pool in volumes.pools() {
            let labels = PoolLabels {
                pool: pool.name.clone(),
            };
            self.pool_unwritten
                .get_or_create(&labels)
                .set(gauge_value(pool.unwritten()));
            match pool.space() {
                Ok(space) => {
                    self.pool_capacity
                        .get_or_create(&labels)
                        .set(gauge_value(space.total_bytes));
                    self.pool_free
                        .get_or_create(&labels)
                        .set(gauge_value(space.available_bytes));
                    let full = space.available_bytes < FULL_BELOW_BYTES;
                    self.pool_full.get_or_create(&labels).set(full as i64);
                    let starved = if full {
                        volumes.starved_in(pool).len()
                    } else {
                        0
                    };
                    self.pool_starved.get_or_create(&labels).set(starved as i64);
                }
                Err(err) => {
                    warn!(pool = %pool.name, error = %err, "metrics: cannot read pool space")
                }
            }
            match pool.available() {
                Ok(bytes) => {
                    self.pool_available
                        .get_or_create(&labels)
                        .set(gauge_value(bytes));
                }
                Err(err) => {
                    warn!(pool = %pool.name, error = %err, "metrics: cannot read pool space")
                }
            }
        }
    }
}
