//! CreateSnapshot, DeleteSnapshot and ListSnapshots: point-in-time copies of a volume's data,
//! kept in the source's pool (`<pool>/snapshots/<id>`) and independent of it.
//!
//! Crash safety: the record is written first, not ready (so the id the CO is handed never
//! changes); the data is then copied under a staging name, flushed, moved into place, and the
//! record marked ready (see `snapshot_jobs`). At start, staging data is removed and copies of
//! records that are not ready are started over; data without a record is moved to
//! `lost+found`. Deletion removes the data first and the record last, so a retry finishes it.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tracing::info;

use crate::error::{Error, IoContext, Result};
use crate::host::tree::WalkError;
use crate::volume::Volumes;
use crate::volume::space::accounting::Holder;
use crate::volume::space::limits;
use crate::volume::space::mechanism::Mechanism;
use crate::volume::space::pool::Pool;
use crate::volume::state::format;
use crate::volume::state::id::{GroupSnapshotId, Issuer, SnapshotId, VolumeId};
use crate::volume::state::record::now_ms;
use crate::volume::state::record::{Luks, SizeLimit, VolumeKind, VolumeRecord};
use crate::volume::state::records::Record;

/// One pool's snapshots, for metrics (`Volumes::snapshot_census`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotCensus {
    pub pool: String,
    pub count: usize,
    /// Bytes they hold alone, as last measured.
    pub exclusive_bytes: u64,
    /// Not ready, their data still being copied (or waiting for its next attempt).
    pub copying: usize,
    /// Not ready, and copied no more: their attempts ran out (`copy_stopped`).
    pub copies_stopped: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub id: SnapshotId,
    /// The CO's idempotency key (the VolumeSnapshotContent's name under Kubernetes).
    pub name: String,
    pub source_volume: VolumeId,
    pub kind: VolumeKind,
    pub pool: String,
    /// The source's capacity when taken: the data a restore holds.
    pub size_bytes: i64,
    /// What the source's CO asked, when a floor made the source larger (its `asked_bytes`):
    /// a restore may ask as little, and gets `size_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked_bytes: Option<i64>,
    /// How the data was (or is being) copied.
    pub mechanism: Mechanism,
    /// Bytes of data the snapshot holds, shared or not: what it may come to hold alone.
    pub data_bytes: u64,
    /// Bytes it held alone when made (what copying wrote); btrfs snapshots are measured.
    pub exclusive_bytes: u64,
    /// The data is complete and durable.
    pub ready: bool,
    /// Copies of the data started so far, counted durably before each starts: a copy that
    /// takes the driver down (out of memory) counts too, so it cannot crash-loop the node.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub copy_attempts: u32,
    /// Why the last copy failed (none if it died with the driver, or has not failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_error: Option<String>,
    /// VolumeSnapshotClass parameters as given.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    pub created_unix_ms: u64,
    /// The source's encryption: the copy is its ciphertext, header and all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Luks>,
    /// The group snapshot this one was cut with: it exists only while its group's record does,
    /// and is deleted with the group, never alone (`group`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupSnapshotId>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl SnapshotRecord {
    /// The smallest capacity a restore may ask: what its source's CO asked. A restore asking
    /// less than the data gets the data's size, as its source did.
    pub fn restorable_from_bytes(&self) -> i64 {
        self.asked_bytes.unwrap_or(self.size_bytes)
    }
}

impl Record for SnapshotRecord {
    type Id = SnapshotId;
    fn id(&self) -> &SnapshotId {
        &self.id
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn parse_id(text: &str) -> Option<SnapshotId> {
        SnapshotId::parse(text)
    }
    fn needs(&self) -> u32 {
        let needs = format::needs_for(self.kind, self.encryption.is_some());
        match self.group {
            Some(_) => needs.max(format::GROUP_FORMAT),
            None => needs,
        }
    }
}

/// A validated CreateSnapshot request.
#[derive(Debug, Clone)]
pub struct SnapshotRequest {
    pub name: String,
    pub source: VolumeId,
    pub parameters: BTreeMap<String, String>,
}

/// Which snapshots ListSnapshots asks for.
#[derive(Debug, Clone, Default)]
pub struct SnapshotFilter {
    pub snapshot: Option<SnapshotId>,
    pub source: Option<VolumeId>,
}

impl Volumes {
    /// Takes a snapshot named `req.name` of volume `req.source`, or returns the one already
    /// taken under that name. Waits a little for the copy; a longer one goes on in the
    /// background and the snapshot is returned not ready (the CO asks again).
    pub fn create_snapshot(self: &Arc<Self>, req: SnapshotRequest) -> Result<Arc<SnapshotRecord>> {
        let _guard = self.guards.acquire(
            format!("snapshot-name:{}", req.name),
            &format!("snapshot name {:?}", req.name),
        )?;
        if let Some(existing) = self.snapshots.find_by_name(&req.name) {
            if existing.source_volume != req.source || existing.group.is_some() {
                return Err(Error::AlreadyExists(format!(
                    "snapshot {:?} already exists as {} of volume {}",
                    req.name, existing.id, existing.source_volume
                )));
            }
            return self.finish_snapshot(&existing);
        }
        let source = self.store.get(&req.source).ok_or_else(|| {
            Error::NotFound(format!("source volume {} does not exist", req.source))
        })?;
        let pool = self.pool_of(&source)?;
        self.refuse_frozen_full_copy(&source, "snapshot")?;
        let id = SnapshotId::generate(&self.node);
        let data_bytes = self.data_bytes(pool, &source)?;
        self.reserve(
            pool,
            Holder::from(&id),
            data_bytes,
            &format!("a snapshot of volume {}", source.id),
        )?;
        let record = SnapshotRecord {
            id: id.clone(),
            name: req.name,
            source_volume: source.id.clone(),
            kind: source.kind,
            pool: pool.name.clone(),
            size_bytes: source.capacity_bytes,
            asked_bytes: source.asked_bytes,
            mechanism: match source.kind {
                // The planned mechanism; the copy records what it really did.
                VolumeKind::Filesystem if source.size_limit == SizeLimit::BtrfsQgroup => pool.cow,
                _ if pool.cow == Mechanism::Copy => Mechanism::Copy,
                _ => Mechanism::Reflink,
            },
            data_bytes,
            exclusive_bytes: 0,
            ready: false,
            copy_attempts: 0,
            copy_error: None,
            parameters: req.parameters,
            created_unix_ms: now_ms(),
            encryption: source.encryption,
            group: None,
        };
        let record = Arc::new(record);
        // The commit point of the id: from here on, the snapshot exists (not ready yet).
        if let Err(err) = self.snapshots.put(record.clone()) {
            pool.release(&id);
            return Err(Error::host(
                format!("writing the record of snapshot {id}"),
                err,
            ));
        }
        info!(snapshot = %id, name = %record.name, volume = %source.id, pool = %pool.name, data_bytes, "taking snapshot");
        self.finish_snapshot(&record)
    }

    /// Deletes a snapshot and its data. Unknown ids succeed (deletion is idempotent). A member
    /// of a group snapshot goes only with its group (INVALID_ARGUMENT, as the CSI spec asks).
    pub fn delete_snapshot(&self, id: &SnapshotId) -> Result<()> {
        if let Some(group) = self.snapshots.get(id).and_then(|r| r.group.clone()) {
            return Err(Error::InvalidArgument(format!(
                "snapshot {id} is a member of group snapshot {group} and is deleted only with it (DeleteVolumeGroupSnapshot)"
            )));
        }
        self.remove_snapshot(id)
    }

    /// Removes a snapshot's data, then its record (a retry finishes what a failure left).
    pub(in crate::volume) fn remove_snapshot(&self, id: &SnapshotId) -> Result<()> {
        self.cancel_snapshot_copy(id)?;
        let _guard = self.claim_snapshot(id)?;
        let Some(record) = self.snapshots.get(id) else {
            return Ok(());
        };
        let pool = self.pool(&record.pool).map_err(|_| {
            Error::FailedPrecondition(format!(
                "snapshot {id} is in pool {:?}, which this node does not have (not configured, or an optional pool whose directory is missing)",
                record.pool
            ))
        })?;
        for path in [
            pool.snapshot_path(id, record.kind),
            pool.snapshot_staging_path(id, record.kind),
        ] {
            remove_snapshot_data(&path).map_err(|err| Error::walk_at(&path, "deleting", err))?;
        }
        self.snapshots
            .remove(id)
            .context(|| format!("removing the record of snapshot {id}"))?;
        pool.release(id);
        info!(snapshot = %id, name = %record.name, pool = %pool.name, "deleted snapshot");
        Ok(())
    }

    /// A snapshot that must exist to be restored: NOT_FOUND if this node issued its id (or
    /// the id is not ours), RESOURCE_EXHAUSTED if another node did (see `Volumes::source`).
    pub fn snapshot_source(&self, id: &SnapshotId) -> Result<Arc<SnapshotRecord>> {
        self.visible_snapshot(id)
            .ok_or_else(|| self.missing_source(&format!("snapshot {id}"), id.issuer()))
    }

    /// A snapshot the CO may see: not a member of a group still being cut (or removed).
    fn visible_snapshot(&self, id: &SnapshotId) -> Option<Arc<SnapshotRecord>> {
        self.snapshots.get(id).filter(|r| self.is_visible(r))
    }

    fn is_visible(&self, record: &SnapshotRecord) -> bool {
        record
            .group
            .as_ref()
            .is_none_or(|group| self.group_is_whole(group))
    }

    /// One page of snapshots matching `filter` after `after`, and the token for the next page.
    pub fn list_snapshots(
        &self,
        filter: &SnapshotFilter,
        after: Option<&SnapshotId>,
        max_entries: usize,
    ) -> (Vec<Arc<SnapshotRecord>>, Option<SnapshotId>) {
        if let Some(id) = &filter.snapshot {
            let found = self
                .visible_snapshot(id)
                .filter(|r| filter.source.as_ref().is_none_or(|s| *s == r.source_volume));
            return (found.into_iter().collect(), None);
        }
        let (page, more) = self.snapshots.page_after(after, max_entries, |r| {
            filter.source.as_ref().is_none_or(|s| *s == r.source_volume) && self.is_visible(r)
        });
        let next = if more {
            page.last().map(|r| r.id.clone())
        } else {
            None
        };
        (page, next)
    }

    /// Snapshots per pool, for metrics.
    pub fn snapshot_census(&self) -> Vec<SnapshotCensus> {
        let all = self.snapshots.all();
        self.pools()
            .iter()
            .map(|pool| {
                let mut census = SnapshotCensus {
                    pool: pool.name.clone(),
                    exclusive_bytes: pool.snapshot_bytes(),
                    ..SnapshotCensus::default()
                };
                for record in all.iter().filter(|r| r.pool == pool.name) {
                    census.count += 1;
                    if record.copy_stopped().is_some() {
                        census.copies_stopped += 1;
                    } else if !record.ready {
                        census.copying += 1;
                    }
                }
                census
            })
            .collect()
    }

    /// How a source that is not here should be answered: a node that issued the id knows it
    /// is gone (NOT_FOUND). An id from another node means the claim is on the wrong node:
    /// FAILED_PRECONDITION, which csi-provisioner retries with backoff without giving the
    /// claim back, while the controller's restore placement moves the claim to the source's
    /// node (rescheduling would only send it round the nodes). An id that names no node (an
    /// earlier version's) may be anywhere: RESOURCE_EXHAUSTED, and the scheduler tries another
    /// node (docs/design.md, "No path from an id").
    pub(in crate::volume) fn missing_source(&self, what: &str, issuer: Issuer) -> Error {
        match issuer {
            Issuer::Node(tag) if tag == self.node => {
                Error::NotFound(format!("{what} does not exist"))
            }
            Issuer::Node(tag) => Error::FailedPrecondition(format!(
                "{what} is on another node (node tag {}), not this one; a restore or clone is made only on the node holding its source, where the controller's restore placement sends the claim",
                tag.as_str()
            )),
            Issuer::Unknown => Error::ResourceExhausted(format!(
                "{what} is not on this node; a restore or clone is made on the node holding its source"
            )),
        }
    }

    /// Bytes a copy of `record`'s data needs: O(1) where a limit counts them, a walk otherwise.
    pub(in crate::volume) fn data_bytes(&self, pool: &Pool, record: &VolumeRecord) -> Result<u64> {
        let path = pool.data_path(&record.id, record.kind);
        if record.kind.is_file() {
            return Ok(crate::host::fsstat::lstat(&path)
                .context(|| format!("inspecting {}", path.display()))?
                .allocated);
        }
        match limits::usage(record.size_limit, &path) {
            Ok(Some(usage)) => return Ok(usage.used_bytes),
            Ok(None) => {}
            Err(err) => {
                tracing::debug!(volume = %record.id, error = %err, "cannot read usage from the size limit; walking")
            }
        }
        crate::host::usage::measure(&path)
            .map(|usage| usage.bytes)
            .map_err(|err| Error::volume_walk(&record.id, "measuring", err))
    }

    /// Claims the snapshot's operation slot (ABORTED for a concurrent second caller).
    pub(in crate::volume) fn claim_snapshot(
        &self,
        id: &SnapshotId,
    ) -> Result<crate::volume::guard::OperationGuard> {
        self.guards
            .acquire(format!("snapshot:{id}"), &format!("snapshot {id}"))
    }

    /// Claims the snapshot for reading (a restore), beside other restores of it.
    pub(in crate::volume) fn claim_snapshot_reading(
        &self,
        id: &SnapshotId,
    ) -> Result<crate::volume::guard::OperationGuard> {
        self.guards.acquire_shared(
            format!("snapshot:{id}"),
            &format!("snapshot {id} (being copied or deleted)"),
        )
    }
}

/// Removes a snapshot's data: a (read-only) btrfs subvolume in one call, anything else by a
/// walk that never follows a symlink nor crosses a mount. Missing data is fine. The copy of an
/// encrypted volume loses its header first, as the volume does (`encryption::erase`).
pub(in crate::volume) fn remove_snapshot_data(path: &std::path::Path) -> Result<(), WalkError> {
    crate::volume::encryption::erase(path).map_err(|source| WalkError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    // The btrfs path tries the subvolume first and falls back to the walk for anything else.
    limits::remove_directory(SizeLimit::BtrfsQgroup, path)
}
