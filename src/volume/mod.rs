//! The volume domain: where volumes live on disk, what we remember about them, and the
//! operations kubelet and the provisioner ask for. Nothing here knows about gRPC.
//!
//! Three rooms below, each using only the ones listed before it (and `crate::host`):
//! - [`state`]: what we remember, durably: ids, records, the journal that commits their
//!   changes (`<data-dir>/state/`), the store that indexes them;
//! - [`space`]: where data lives and how much: pools, the books of what was promised,
//!   size limits, capacity rules, the walk throttle, how a pool copies cheaply, and the books
//!   of project-id audits and of volumes measured above their size;
//! - [`copies`]: snapshots, restores, clones, export and import: the data copied and the
//!   operations that do it.
//!
//! Here, on them: [`Volumes`] (a node's volumes, this module), with what every operation
//! needs: the per-volume operation [`guard`], the checks of a requested [`capability`], which
//! loop devices serve a volume (`devices`).
//!
//! Above `Volumes`, each adding its `impl Volumes` block: the operations kubelet, the
//! provisioner and the admin API call: [`create`] and delete, [`publish`], [`image`] (staging
//! an image volume), both on the mount-target mechanics of `target`; `expand`, [`stats`],
//! [`overflow`], `available` (capacity), the [`inventory`], [`orphan`]s, `recover` at start,
//! and the periodic project-id [`audit`]. `copies` adds its operations to `Volumes` too, so it
//! is the one room that uses `Volumes` and `guard` from here. This module names the levels
//! above it only for the fields of `Volumes` they keep (snapshot records, running copies,
//! leftovers of a crash); requests and results are named in their own modules
//! (`volume::publish::PublishRequest`, `volume::create::CreateRequest`, …).

pub mod copies;
pub mod space;
pub mod state;

pub mod audit;
mod available;
pub mod capability;
pub mod create;
mod devices;
pub mod encrypted_block;
pub mod encryption;
mod expand;
pub mod fence;
pub mod guard;
pub mod image;
pub mod inventory;
pub mod iolimits;
pub mod orphan;
pub mod overflow;
pub mod publish;
mod recover;
pub mod starved;
pub mod stats;
mod target;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::PoolConfig;
use crate::error::{Error, IoContext, Result};
use crate::host::fsstat::{self, Space};

pub use space::pool::{Pool, STAGING_PREFIX};

// The arrows back up: the only names this module takes from a room above `Volumes` (`copies`,
// which adds impl blocks to it) or from an operation. Each is the type of a field (see there).
use copies::group::GroupSnapshotRecord;
use copies::snapshot::SnapshotRecord;
use copies::snapshot_jobs::Jobs;
use recover::Leftover;

use guard::OperationGuards;
use space::pool::LockedRoot;
use state::id::{NodeTag, VolumeId};
use state::record::{FsType, VolumeKind, VolumeRecord};
use state::records::Records;
use state::store::Store;

/// Whether a volume is healthy, as CSI's VolumeCondition reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub abnormal: bool,
    pub message: String,
}

impl Condition {
    fn from_problem(problem: Option<String>) -> Condition {
        match problem {
            Some(message) => Condition {
                abnormal: true,
                message,
            },
            None => Condition {
                abnormal: false,
                message: "volume data is present".into(),
            },
        }
    }
}

/// Why the data at `path` is not usable as `record`'s volume, if it is not.
fn data_problem(record: &VolumeRecord, path: &Path) -> Option<String> {
    match fsstat::lstat_if_exists(path) {
        Ok(None) => Some(format!(
            "data of volume {} is missing at {}",
            record.id,
            path.display()
        )),
        Ok(Some(stat)) => {
            let right_type = match record.kind {
                VolumeKind::Filesystem => stat.is_dir(),
                VolumeKind::Block | VolumeKind::Image(_) => stat.is_regular_file(),
            };
            (!right_type).then(|| {
                format!(
                    "data of volume {} at {} is not a {}",
                    record.id,
                    path.display(),
                    match record.kind {
                        VolumeKind::Filesystem => "directory",
                        VolumeKind::Block | VolumeKind::Image(_) => "regular file",
                    }
                )
            })
        }
        Err(err) => Some(format!(
            "cannot inspect data of volume {}: {err}",
            record.id
        )),
    }
}

/// Why a volume with an enforced size is not held to it, if it is not (O(1): quota figures).
fn limit_problem(record: &VolumeRecord, path: &Path) -> Option<String> {
    match space::limits::usage(record.size_limit, path) {
        Ok(None) => None,
        Ok(Some(usage)) => usage_problem(record, usage.used_bytes, usage.limit_bytes.is_some()),
        Err(err) => Some(format!(
            "cannot read the size limit of volume {}: {err}",
            record.id
        )),
    }
}

/// What is wrong with a volume using `used` bytes (`limited`: its limit is in force).
fn usage_problem(record: &VolumeRecord, used: u64, limited: bool) -> Option<String> {
    let capacity = record.capacity_bytes as u64;
    if record.size_limit.is_enforced() && !limited {
        Some(format!(
            "the size limit of volume {} is gone; it can fill its pool",
            record.id
        ))
    } else if used > capacity {
        Some(format!(
            "volume {} uses {used} bytes, more than its size of {capacity} bytes{}",
            record.id,
            if record.size_limit.is_enforced() {
                ""
            } else {
                " (sizes are not enforced on its pool)"
            }
        ))
    } else {
        None
    }
}

/// Both problems, or the one there is.
fn joined(first: Option<String>, second: Option<String>) -> Option<String> {
    match (first, second) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.or(b),
    }
}

/// How many volumes of one kind and publication state exist, and their summed capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CensusEntry {
    pub kind: VolumeKind,
    pub published: bool,
    pub count: usize,
    pub capacity_bytes: i64,
}

/// All volumes of this node.
#[derive(Debug)]
pub struct Volumes {
    /// The default pool first; each pool is locked for our lifetime.
    pools: Vec<Pool>,
    state: PathBuf,
    kubelet_dir: PathBuf,
    store: Store,
    /// Arrow back up: the snapshot records are opened at start with the volume records, on
    /// the same journal barrier, and checked before anything on the host changes (`open`).
    snapshots: Records<SnapshotRecord>,
    /// Group snapshots: their members are snapshot records that name them (`copies::group`).
    groups: Records<GroupSnapshotRecord>,
    /// Snapshot copies running in the background. Arrow back up: a copy outlives the
    /// CreateSnapshot that starts it (the next one waits for it, DeleteSnapshot cancels it),
    /// so the node's one set of them lives here.
    jobs: Jobs,
    guards: OperationGuards,
    /// Usage of plain directories, walked at most once per burst of callers.
    usage_cache: space::throttle::UsageCache,
    /// Volumes the project-id audit found tampered with, until a clean audit (see `audit`).
    audits: space::audit::AuditBook,
    /// Volumes stats found above their size, for the overflow check.
    overflow_noticed: space::overflows::Noticed,
    /// The mounts this process made read-only, per fenced volume (see `fence`).
    fenced_mounts: fence::FencedMounts,
    /// Signs the ids this node issues.
    node: NodeTag,
    /// Data crashes left, found at start and removed once the socket serves. Arrow back up:
    /// `open` finds them (through `recover`) before the socket serves, and only later, from the
    /// server, are they removed, so the queue must outlive `open` in the one value both see.
    leftovers: std::sync::Mutex<Vec<Leftover>>,
    /// The host's cgroup filesystem, where IO limits are set (`iolimits`).
    cgroup_root: PathBuf,
}

/// The pools this node has: every `--pool`, and the `--optional-pool`s whose directory exists.
fn present_pools(pools: &[PoolConfig]) -> Vec<&PoolConfig> {
    pools
        .iter()
        .filter(|config| {
            let present = config.present();
            if !present {
                tracing::info!(pool = %config.name, path = %config.path.display(), "optional pool absent: its directory does not exist on this node, so classes naming it get no capacity here");
            }
            present
        })
        .collect()
}

/// Locks every pool (for our lifetime); FAILED_PRECONDITION if two of them overlap.
fn lock_pools(pools: &[&PoolConfig]) -> Result<Vec<LockedRoot>> {
    let locked = pools
        .iter()
        .copied()
        .map(LockedRoot::lock)
        .collect::<Result<Vec<_>>>()?;
    for (i, a) in locked.iter().enumerate() {
        if let Some(b) = locked[..i]
            .iter()
            .find(|b| a.root.starts_with(&b.root) || b.root.starts_with(&a.root))
        {
            return Err(Error::FailedPrecondition(format!(
                "pools at {} and {} overlap",
                a.root.display(),
                b.root.display()
            )));
        }
    }
    Ok(locked)
}

/// The state journals' options: before a journal generation is dropped, the data of the
/// volumes and snapshots it created or removed must be durable too (see `journal` and
/// `create`), so every pool's filesystem is synced first.
fn journal_options(locked: &[LockedRoot]) -> state::journal::Options {
    let roots: Vec<PathBuf> = locked.iter().map(|p| p.root.clone()).collect();
    state::journal::Options {
        barrier: Some(Arc::new(move || {
            roots
                .iter()
                .try_for_each(|root| crate::host::copy::sync_filesystem(root))
        })),
        ..state::journal::Options::default()
    }
}

/// Opens each locked pool with the records of its volumes; a record naming a pool this node
/// lacks is reported, and its volume stays unusable.
fn open_pools(pools: &[&PoolConfig], locked: Vec<LockedRoot>, store: &Store) -> Result<Vec<Pool>> {
    let all = store.all();
    let mut opened = Vec::with_capacity(pools.len());
    let project_ids = space::limits::Enforcement::project_ids(all.iter().map(|r| &**r));
    for (config, root) in pools.iter().zip(locked) {
        let records: Vec<&VolumeRecord> = all
            .iter()
            .map(|r| &**r)
            .filter(|r| r.pool == config.name)
            .collect();
        opened.push(Pool::open(config, root, &records, &project_ids)?);
    }
    for record in all
        .iter()
        .filter(|r| !pools.iter().any(|p| p.name == r.pool))
    {
        tracing::error!(volume = %record.id, pool = %record.pool, "volume is in a pool this node does not have (not configured, or an optional pool whose directory is missing); it stays unusable until the pool is back");
    }
    Ok(opened)
}

impl Volumes {
    /// Opens (creating if needed) every pool, loads every record from `<data-dir>/state` and
    /// reconciles the host with them: see `recover`. `pools[0]` is the data dir. Snapshot
    /// copies a crash interrupted are restarted by `resume_snapshot_copies`, once the socket serves.
    pub fn open(
        pools: &[PoolConfig],
        kubelet_dir: &Path,
        node_id: &str,
        run_dir: Option<&Path>,
    ) -> Result<Volumes> {
        fs::create_dir_all(kubelet_dir)
            .context(|| format!("creating {}", kubelet_dir.display()))?;
        let kubelet_dir = kubelet_dir
            .canonicalize()
            .context(|| format!("resolving {}", kubelet_dir.display()))?;
        let pools = present_pools(pools);
        // Every pool is locked before records are read (loading removes temp files).
        let locked = lock_pools(&pools)?;
        let state = locked[0].root.join("state");
        let journal_options = journal_options(&locked);
        let snapshot_state = state.join("snapshots");
        let journal_dir = state.join(state::store::JOURNAL_DIR);
        // State this release cannot read stops the start with nothing changed: opening changes
        // files (and recovery acts on the host), so the snapshot records are checked before the
        // volume records open, which check their own first (`Records::open`).
        let group_state = state.join("groups");
        Records::<SnapshotRecord>::check_format(&snapshot_state, &journal_dir, "snapshots")
            .context(|| format!("checking the records in {}", snapshot_state.display()))?;
        Records::<GroupSnapshotRecord>::check_format(&group_state, &journal_dir, "groups")
            .context(|| format!("checking the records in {}", group_state.display()))?;
        let (store, report) = Store::open(&state, run_dir, journal_options.clone())
            .context(|| format!("loading records from {}", state.display()))?;
        let (snapshots, snapshot_report) = Records::open(
            &snapshot_state,
            &journal_dir,
            "snapshots",
            journal_options.clone(),
        )
        .context(|| format!("loading records from {}", snapshot_state.display()))?;
        let (groups, group_report) =
            Records::open(&group_state, &journal_dir, "groups", journal_options)
                .context(|| format!("loading records from {}", group_state.display()))?;
        let opened = open_pools(&pools, locked, &store)?;
        let volumes = Volumes {
            pools: opened,
            state,
            kubelet_dir,
            store,
            snapshots,
            groups,
            jobs: Jobs::default(),
            guards: OperationGuards::default(),
            usage_cache: space::throttle::UsageCache::default(),
            audits: space::audit::AuditBook::default(),
            overflow_noticed: space::overflows::Noticed::default(),
            fenced_mounts: fence::FencedMounts::default(),
            node: NodeTag::of(node_id),
            leftovers: std::sync::Mutex::new(Vec::new()),
            cgroup_root: PathBuf::from(iolimits::DEFAULT_CGROUP_ROOT),
        };
        volumes.report_full_pools();
        volumes.recover(report)?;
        for torn in &snapshot_report.torn {
            tracing::warn!(what = %torn, "ignored the torn tail of the snapshot journal");
        }
        for torn in &group_report.torn {
            tracing::warn!(what = %torn, "ignored the torn tail of the group snapshot journal");
        }
        for (id, why) in &group_report.unreadable {
            tracing::error!(group = %id, reason = %why, "group snapshot record is unreadable; its members are left untouched until an admin repairs or removes the record");
        }
        // Before the snapshots' own recovery, which would take a member's data for an orphan.
        volumes.recover_groups()?;
        volumes.recover_snapshots(
            &snapshot_report.unreadable,
            &snapshot_report.removed_recently,
        )?;
        Ok(volumes)
    }

    /// The data dir's pool.
    pub fn default_pool(&self) -> &Pool {
        &self.pools[0]
    }

    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    /// The pool called `name`, or RESOURCE_EXHAUSTED: a class naming a pool this node lacks
    /// cannot be served here, and the provisioner should try another node.
    pub fn pool(&self, name: &str) -> Result<&Pool> {
        self.pools.iter().find(|p| p.name == name).ok_or_else(|| {
            Error::ResourceExhausted(format!(
                "this node has no pool {name:?} (pools: {})",
                self.pools
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
    }

    /// The pool holding an existing volume (FAILED_PRECONDITION if this node lacks it).
    pub fn pool_of(&self, record: &VolumeRecord) -> Result<&Pool> {
        self.pools
            .iter()
            .find(|p| p.name == record.pool)
            .ok_or_else(|| {
                Error::FailedPrecondition(format!(
                    "volume {} is in pool {:?}, which this node does not have (not configured, or an optional pool whose directory is missing)",
                    record.id, record.pool
                ))
            })
    }

    /// Where a volume's data lives on the host.
    pub fn data_path(&self, record: &VolumeRecord) -> Result<PathBuf> {
        Ok(self.pool_of(record)?.data_path(&record.id, record.kind))
    }

    pub fn kubelet_dir(&self) -> &Path {
        &self.kubelet_dir
    }

    pub fn count(&self) -> usize {
        self.store.len()
    }

    /// Volumes by kind and by whether they have publications, from the records alone (no host
    /// access, so cheap enough for every metrics scrape). Every combination is listed, zeros too.
    pub fn census(&self) -> Vec<CensusEntry> {
        let image_kinds = FsType::ALL.map(VolumeKind::Image);
        let mut entries: Vec<CensusEntry> = [VolumeKind::Filesystem, VolumeKind::Block]
            .into_iter()
            .chain(image_kinds)
            .flat_map(|kind| {
                [false, true].map(|published| CensusEntry {
                    kind,
                    published,
                    count: 0,
                    capacity_bytes: 0,
                })
            })
            .collect();
        for record in self.store.all() {
            let published = !record.publications.is_empty();
            if let Some(entry) = entries
                .iter_mut()
                .find(|e| e.kind == record.kind && e.published == published)
            {
                entry.count += 1;
                entry.capacity_bytes += record.capacity_bytes;
            }
        }
        entries
    }

    /// The record of a volume that must exist (NOT_FOUND otherwise).
    pub fn get(&self, id: &VolumeId) -> Result<Arc<VolumeRecord>> {
        self.store
            .get(id)
            .ok_or_else(|| Error::NotFound(format!("volume {id} does not exist")))
    }

    /// One page of volumes after `after`, and the token for the next page if any remain.
    pub fn list(
        &self,
        after: Option<&VolumeId>,
        max_entries: usize,
    ) -> (Vec<Arc<VolumeRecord>>, Option<VolumeId>) {
        let (page, more) = self.store.page_after(after, max_entries);
        let next = if more {
            page.last().map(|r| r.id.clone())
        } else {
            None
        };
        (page, next)
    }

    /// What the state journals (volumes, snapshots) have done since the start, for metrics.
    pub fn journal_stats(&self) -> [state::journal::Stats; 3] {
        [
            self.store.journal_stats(),
            self.snapshots.journal_stats(),
            self.groups.journal_stats(),
        ]
    }

    /// Free space of the data directory's filesystem.
    pub fn space(&self) -> Result<Space> {
        self.default_pool().space()
    }

    /// Ready when the data and state directories exist, are writable and not on a read-only
    /// mount, and the state journals can take commits.
    pub fn check_ready(&self) -> Result<()> {
        let pool = self.default_pool();
        for dir in [&pool.volumes, &self.state] {
            nix::unistd::access(dir.as_path(), nix::unistd::AccessFlags::W_OK)
                .map_err(std::io::Error::from)
                .context(|| format!("data directory {} is not writable", dir.display()))?;
        }
        let space = self.space()?;
        if space.read_only {
            return Err(Error::FailedPrecondition(format!(
                "data directory {} is on a read-only filesystem",
                pool.root.display()
            )));
        }
        // A journal that cannot take commits fails every create and delete until a restart
        // replays it: not ready, so the livenessprobe sidecar has kubelet restart the driver
        // instead of leaving it failing behind a healthy Probe.
        let journals = [
            ("volume", self.store.journal_health()),
            ("snapshot", self.snapshots.journal_health()),
            ("group snapshot", self.groups.journal_health()),
        ];
        for (records, health) in journals {
            health.map_err(|why| {
                Error::FailedPrecondition(format!(
                    "the {records} state journal cannot take commits ({why}); a restart replays it"
                ))
            })?;
        }
        Ok(())
    }

    /// Healthy unless the volume's data is missing or of the wrong type, its size limit is
    /// gone or exceeded, its last walk could not measure it, its last project-id audit found
    /// files outside its project, or it is fenced read-only.
    pub fn condition(&self, record: &VolumeRecord) -> Condition {
        if let Some(orphaned) = &record.orphaned {
            return Condition::from_problem(Some(format!(
                "orphaned: PV {} is gone; the data was moved to {}",
                orphaned.pv_name,
                orphaned.lost_path.display()
            )));
        }
        let problem = self.data_path(record).map_or_else(
            |err| Some(err.to_string()),
            |path| data_problem(record, &path).or_else(|| limit_problem(record, &path)),
        );
        // O(1): no walk here, but the last one's failure of the tree's making is still true.
        let unmeasured = self
            .usage_cache
            .unmeasurable_within(&record.id, std::time::Duration::MAX)
            .map(|why| {
                format!(
                    "the usage of volume {} cannot be measured: {why}",
                    record.id
                )
            });
        let problem = joined(fence::fence_problem(record), joined(problem, unmeasured));
        Condition::from_problem(joined(self.audit_problem(&record.id), problem))
    }

    /// Claims the per-volume operation slot (ABORTED for a concurrent second caller).
    fn claim(&self, id: &VolumeId) -> Result<guard::OperationGuard> {
        self.guards
            .acquire(format!("volume:{id}"), &format!("volume {id}"))
    }
}
