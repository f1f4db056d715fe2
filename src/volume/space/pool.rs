//! Storage pools: directories (usually on separate disks) that hold volume data. Each pool has
//! its own way of limiting volume sizes and its own accounting of what it has promised.
//!
//! Layout under a pool's root (the data dir is the root of the pool named "default"):
//! - `volumes/<id>/`     a filesystem volume's data (a btrfs subvolume on btrfs pools)
//! - `volumes/<id>.img`  a block volume's backing file
//! - `volumes/.creating-<id>[.img]`  data of a create not yet committed
//! - `snapshots/<snapshot-id>[.img]` a snapshot's data (see `snapshot`)
//! - `snapshots/.creating-<snapshot-id>[.img]` a snapshot being copied
//! - `snapshots/.exporting-<uuid>[.img]` a temporary snapshot an admin export reads from
//! - `lost+found/`       data found without a record, kept for an admin
//! - `.lock`             held while a driver uses the pool
//! - `adopt/<disk>/`     (the default pool only) a dead node's pool, mounted by an admin, whose
//!   volumes are read into this node's (`copies::adopt`); never written

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use tracing::{info, warn};

use super::accounting::{Holder, Ledger};
use super::limits::Enforcement;
use super::mechanism::Mechanism;
use super::set_mode;
use super::throttle::{Slots, WALKS_PER_POOL};
use crate::config::{KubeletReserve, PoolConfig};
use crate::error::{Error, IoContext, Result};
use crate::host::btrfs;
use crate::host::fsstat::{self, Space};
use crate::host::projquota::ProjectIds;
use crate::volume::state::id::{SnapshotId, VolumeId};
use crate::volume::state::record::{Allocation, VolumeKind, VolumeRecord};

/// Prefix of data not yet committed by a record.
pub const STAGING_PREFIX: &str = ".creating-";

/// How fresh btrfs qgroup figures are when read (see `Pool::commit_qgroups`).
/// A commit writes back the whole filesystem's dirty pages: once per 2 s at most, however
/// many volumes kubelet polls, so figures lag at most that much behind the writes.
pub const QGROUP_COMMIT_EVERY: Duration = Duration::from_secs(2);

/// Prefix of the temporary snapshots exports of published volumes read from.
pub const EXPORT_PREFIX: &str = ".exporting-";

#[derive(Debug)]
pub struct Pool {
    pub name: String,
    /// Canonical: the kernel reports loop backing files and mounts that way.
    pub root: PathBuf,
    pub volumes: PathBuf,
    pub snapshots: PathBuf,
    pub enforcement: Enforcement,
    /// How snapshots, restores and clones copy data here.
    pub cow: Mechanism,
    overcommit: f64,
    /// The percent of its filesystem's size the pool keeps back for kubelet's hard eviction
    /// threshold: `--kubelet-eviction-reserve` when the pool is on kubelet's filesystem, else 0.
    kept_for_kubelet: u8,
    ledger: Mutex<Ledger>,
    /// When `refresh_usage` last measured every volume of the pool.
    measured_at: Mutex<Option<Instant>>,
    /// Bounds the tree walks running on the pool at once (see `throttle`).
    pub walks: Slots,
    /// When the pool's btrfs filesystem was last committed to make qgroup figures current.
    committed_at: Mutex<Option<Instant>>,
    /// Held for our lifetime: two drivers reconciling one pool would undo each other's work
    /// (e.g. remove a create in progress as an orphan).
    _lock: Flock<fs::File>,
}

/// A pool's root directory, made and locked: the first step of opening a pool, taken for
/// every pool before any record is read.
#[derive(Debug)]
pub struct LockedRoot {
    pub root: PathBuf,
    lock: Flock<fs::File>,
}

impl LockedRoot {
    pub fn lock(config: &PoolConfig) -> Result<LockedRoot> {
        let path = &config.path;
        fs::create_dir_all(path).context(|| format!("creating {}", path.display()))?;
        // Only root may look inside; pods reach their own volume through its bind mount.
        set_mode(path, 0o700)?;
        let root = path
            .canonicalize()
            .context(|| format!("resolving {}", path.display()))?;
        let lock = lock_pool(&root)?;
        Ok(LockedRoot { root, lock })
    }
}

impl Pool {
    /// Chooses how the pool limits sizes and loads its promises. `records` are the volumes
    /// the store knows in this pool.
    pub fn open(
        config: &PoolConfig,
        locked: LockedRoot,
        records: &[&VolumeRecord],
        project_ids: &ProjectIds,
    ) -> Result<Pool> {
        let LockedRoot { root, lock } = locked;
        let volumes = root.join("volumes");
        fs::create_dir_all(&volumes).context(|| format!("creating {}", volumes.display()))?;
        let snapshots = root.join("snapshots");
        fs::create_dir_all(&snapshots).context(|| format!("creating {}", snapshots.display()))?;
        let enforcement =
            Enforcement::choose(&config.name, &root, config.enforcement, project_ids)?;
        let cow = copy_mechanism(&snapshots, &enforcement);
        let mut ledger = Ledger::default();
        // An orphaned volume (its PV gone, its data in lost+found) is promised nothing more.
        for record in records.iter().filter(|r| r.orphaned.is_none()) {
            // Usage is learnt at the first measurement; until then every promise counts whole
            // (the safe side). Thick files are fully used from the start.
            let used = record
                .fully_allocated()
                .then_some(record.capacity_bytes as u64);
            ledger.insert(
                &(&record.id).into(),
                record.capacity_bytes as u64,
                used.unwrap_or(0),
            );
        }
        let kept_for_kubelet = kept_for_kubelet(&root, &config.kubelet_reserve);
        info!(pool = %config.name, root = %root.display(), enforcement = enforcement.describe(), snapshots = cow.describe(), overcommit = config.overcommit, kept_for_kubelet_percent = kept_for_kubelet, volumes = records.len(), "pool ready");
        Ok(Pool {
            name: config.name.clone(),
            root,
            volumes,
            snapshots,
            enforcement,
            cow,
            overcommit: config.overcommit,
            kept_for_kubelet,
            ledger: Mutex::new(ledger),
            measured_at: Mutex::new(None),
            walks: Slots::new(WALKS_PER_POOL),
            committed_at: Mutex::new(None),
            _lock: lock,
        })
    }

    /// Where a volume's data lives on the host.
    pub fn data_path(&self, id: &VolumeId, kind: VolumeKind) -> PathBuf {
        self.volumes.join(data_name(id, kind))
    }

    /// Where a volume's data is made before its record commits it.
    pub fn staging_path(&self, id: &VolumeId, kind: VolumeKind) -> PathBuf {
        self.volumes
            .join(format!("{STAGING_PREFIX}{}", data_name(id, kind)))
    }

    /// Where a snapshot's data lives.
    pub fn snapshot_path(&self, id: &SnapshotId, kind: VolumeKind) -> PathBuf {
        self.snapshots.join(data_name(id, kind))
    }

    /// Where a snapshot's data is copied before it is moved into place.
    pub fn snapshot_staging_path(&self, id: &SnapshotId, kind: VolumeKind) -> PathBuf {
        self.snapshots
            .join(format!("{STAGING_PREFIX}{}", data_name(id, kind)))
    }

    /// A fresh place for the temporary snapshot an export reads from.
    pub fn export_snapshot_path(&self, kind: VolumeKind) -> PathBuf {
        let name = uuid::Uuid::now_v7().simple().to_string();
        self.snapshots
            .join(format!("{EXPORT_PREFIX}{}", data_name(&name, kind)))
    }

    /// How block and image volumes hold their space when their class does not say: thick
    /// (fallocated at creation and growth) on a pool that cannot limit directory volumes, so
    /// that a directory volume filling the pool never takes the blocks promised to them; thin
    /// where directories are limited, or where the pool overcommits (promising more than it
    /// has is a choice to share, and thick files could not be made).
    pub fn default_allocation(&self) -> Allocation {
        match (&self.enforcement, self.overcommit > 1.0) {
            (Enforcement::None, false) => Allocation::Thick,
            _ => Allocation::Thin,
        }
    }

    /// Commits the pool's btrfs filesystem, at most once per `QGROUP_COMMIT_EVERY`, so that
    /// qgroup figures read next are current: btrfs updates them only when a transaction
    /// commits (every 30 s by default), so a volume that just wrote 1 GiB would read as empty
    /// until then. Concurrent callers wait for one commit instead of each making their own.
    pub fn commit_qgroups(&self) {
        if !matches!(self.enforcement, Enforcement::Btrfs) {
            return;
        }
        let mut committed_at = self.committed_at.lock().unwrap_or_else(|e| e.into_inner());
        if committed_at.is_some_and(|at| at.elapsed() < QGROUP_COMMIT_EVERY) {
            return;
        }
        if let Err(err) = btrfs::sync(&self.volumes) {
            warn!(pool = %self.name, error = %err, "cannot commit the pool's btrfs transaction; qgroup usage may lag up to 30 s");
        }
        *committed_at = Some(Instant::now());
    }

    /// Where data found without a record is moved instead of being deleted.
    pub fn lost_and_found(&self) -> PathBuf {
        self.root.join("lost+found")
    }

    /// Free space of the pool's filesystem.
    pub fn space(&self) -> Result<Space> {
        fsstat::space(&self.root).context(|| format!("statvfs {}", self.root.display()))
    }

    /// What a new volume can be promised now: free space, less what is kept back for kubelet,
    /// minus unused promises.
    pub fn available(&self) -> Result<u64> {
        let ledger = self.ledger();
        let free = self.promisable(self.space()?);
        Ok(ledger.available(free, self.overcommit))
    }

    /// Free space the pool may promise: what kubelet's eviction threshold needs free stays out.
    fn promisable(&self, space: Space) -> u64 {
        let kept = space.total_bytes / 100 * u64::from(self.kept_for_kubelet);
        space.available_bytes.saturating_sub(kept)
    }

    /// Promises `bytes` to volume `id` (replacing an earlier promise to it), or says how much
    /// is available instead. Free space is read under the ledger's lock: every usage figure in
    /// the ledger is then older than the free-space figure, never newer (a thick file
    /// allocated in between would otherwise count as neither free nor owed).
    pub fn reserve(
        &self,
        id: impl Into<Holder>,
        bytes: u64,
    ) -> Result<std::result::Result<(), u64>> {
        let mut ledger = self.ledger();
        let free = self.promisable(self.space()?);
        Ok(ledger.reserve(&id.into(), bytes, free, self.overcommit))
    }

    /// Puts back a promise without checking space (undoing a growth that failed).
    pub fn restore(&self, id: impl Into<Holder>, bytes: u64) {
        self.ledger().set_reserved(&id.into(), bytes);
    }

    /// Whether usage was last measured longer than `max_age` ago (or never).
    pub fn usage_is_older_than(&self, max_age: Duration) -> bool {
        let measured = *self.measured_at.lock().unwrap_or_else(|e| e.into_inner());
        measured.is_none_or(|at| at.elapsed() > max_age)
    }

    /// Notes that every volume's usage was just measured.
    pub fn usage_measured(&self) {
        *self.measured_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// What the pool's volumes may still write within their sizes, as last measured.
    pub fn unwritten(&self) -> u64 {
        self.ledger().outstanding()
    }

    /// What `id` used when last measured (None for an unknown holder).
    pub fn used_of(&self, id: impl Into<Holder>) -> Option<u64> {
        self.ledger().used_of(&id.into())
    }

    pub fn set_used(&self, id: impl Into<Holder>, used: u64) {
        self.ledger().set_used(&id.into(), used);
    }

    /// Promises a snapshot found at start, without checking space.
    pub fn insert(&self, id: impl Into<Holder>, reserved: u64, used: u64) {
        self.ledger().insert(&id.into(), reserved, used);
    }

    pub fn release(&self, id: impl Into<Holder>) {
        self.ledger().release(&id.into());
    }

    /// What snapshots of the pool hold on their own, as last measured.
    pub fn snapshot_bytes(&self) -> u64 {
        self.ledger().snapshot_usage()
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        // A panic while holding it cannot leave the sum half-updated (plain arithmetic).
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The file name of a volume's data in `volumes/` (or a snapshot's in `snapshots/`).
pub fn data_name(id: &impl std::fmt::Display, kind: VolumeKind) -> String {
    match kind {
        VolumeKind::Filesystem => id.to_string(),
        // Image volumes' files are named as block volumes' are: `devices` and recovery find a
        // loop device's volume by that name.
        VolumeKind::Block | VolumeKind::Image(_) => format!("{id}.img"),
    }
}

/// The id a file name in `snapshots/` belongs to, if it is one of ours.
pub fn id_of_snapshot_entry(file_name: &str) -> Option<SnapshotId> {
    SnapshotId::parse(file_name.strip_suffix(".img").unwrap_or(file_name))
}

/// The percent `reserve` keeps back of the pool at `root`: all of it when the pool shares
/// kubelet's filesystem (the same device as `--kubelet-dir`; kubelet watches that filesystem's
/// free space), none elsewhere, and none when the device cannot be told.
fn kept_for_kubelet(root: &Path, reserve: &KubeletReserve) -> u8 {
    if reserve.percent == 0 {
        return 0;
    }
    match (fs::metadata(root), fs::metadata(&reserve.kubelet_dir)) {
        (Ok(pool), Ok(kubelet)) if pool.dev() == kubelet.dev() => reserve.percent,
        (Ok(_), Ok(_)) => 0,
        (pool, kubelet) => {
            warn!(root = %root.display(), kubelet_dir = %reserve.kubelet_dir.display(), pool_error = ?pool.err(), kubelet_error = ?kubelet.err(), "cannot tell whether the pool is on kubelet's filesystem; keeping nothing back for kubelet's eviction threshold");
            0
        }
    }
}

/// What the pool's filesystem offers for copies, probed in `dir` (on the pool's filesystem).
fn copy_mechanism(dir: &Path, enforcement: &Enforcement) -> Mechanism {
    let kind = fsstat::filesystem_kind(dir);
    let reflink = fsstat::supports_reflink(dir);
    match (kind, reflink) {
        (Ok(kind), Ok(reflink)) => {
            Mechanism::choose(kind, matches!(enforcement, Enforcement::Btrfs), reflink)
        }
        (Err(err), _) | (_, Err(err)) => {
            warn!(dir = %dir.display(), error = %err, "cannot probe copy-on-write support; snapshots and clones will be full copies");
            Mechanism::Copy
        }
    }
}

/// The id a file name in `volumes/` belongs to, if it is one of ours.
pub fn id_of_data_entry(file_name: &str) -> Option<VolumeId> {
    VolumeId::parse(file_name.strip_suffix(".img").unwrap_or(file_name))
}

/// Takes `<root>/.lock`, or fails naming the reason.
fn lock_pool(root: &Path) -> Result<Flock<fs::File>> {
    let path = root.join(".lock");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .context(|| format!("opening {}", path.display()))?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
        if errno == nix::errno::Errno::EWOULDBLOCK {
            Error::FailedPrecondition(format!(
                "another stickyvol instance is using the pool directory {} (it holds its .lock)",
                root.display()
            ))
        } else {
            Error::host(format!("locking {}", path.display()), errno.into())
        }
    })
}
