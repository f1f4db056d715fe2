//! Group snapshots (the CSI GroupController): snapshots of several volumes of this node cut at
//! one instant, so that a workload keeping its data and its log on separate volumes restores
//! whole. Each member is an ordinary snapshot (restored, listed and placed like any other)
//! that names its group and is deleted only with it.
//!
//! **The instant.** Every member has its operation slot held for the whole cut, so none is
//! staged, published or deleted meanwhile. Members with writers are image volumes whose
//! filesystems are all frozen (FIFREEZE: writes wait, everything written is on the device)
//! before the first of them is copied and thawed after the last (`group_cut`), so no write
//! reaches any of them in between: the copies hold what a power cut at that instant would
//! have left on every member at once (each journal is replayed at its next mount). Members no
//! pod uses have no writers, and are copied before the freeze. A block or directory volume in
//! use has writers stickyvol cannot hold (a bind mount or a loop device has no freeze): a group
//! of it and any other volume is refused (FAILED_PRECONDITION, saying why); alone in its group
//! it is cut as CreateSnapshot cuts it. A pool that copies data in full (no reflinks) is refused
//! too: the cut would last as long as the copy.
//!
//! **Crash safety.** The group's record is written first, as an intent listing its members
//! (one journal commit, before any freeze); the members' data is cut, flushed and recorded;
//! then the group's record is marked whole, one more commit: the group's commit point. At
//! start, the members of a group that is not whole are removed, data and records, and so is
//! its record: a crash leaves the whole group or none of it. A filesystem a crash left frozen
//! is thawed at start (`thaw_staged`). Deletion removes the members first and the group's
//! record last, so a retry finishes what a failure left.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::snapshot::{SnapshotRecord, remove_snapshot_data};
use crate::error::{Error, IoContext, Result};
use crate::volume::Volumes;
use crate::volume::state::format::GROUP_FORMAT;
use crate::volume::state::id::{GroupSnapshotId, SnapshotId, VolumeId};
use crate::volume::state::record::VolumeKind;
use crate::volume::state::records::Record;

/// The most volumes one group may hold: every member's filesystem is frozen at once.
pub const MAX_MEMBERS: usize = 64;

/// One volume of a group and the snapshot of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMember {
    pub volume: VolumeId,
    pub snapshot: SnapshotId,
    /// Where the snapshot's data is (`Pool::snapshot_path`), known before it is cut.
    pub kind: VolumeKind,
    pub pool: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSnapshotRecord {
    pub id: GroupSnapshotId,
    /// The CO's idempotency key (the VolumeGroupSnapshotContent's name under Kubernetes).
    pub name: String,
    /// In the order the CO named the volumes.
    pub members: Vec<GroupMember>,
    /// VolumeGroupSnapshotClass parameters as given.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    pub created_unix_ms: u64,
    /// Every member is cut and recorded: the group exists. Until then the record is an intent,
    /// whose members a start removes (see the module comment).
    pub whole: bool,
    /// How long the members' writers were held, first freeze to last thaw (0: none had any).
    #[serde(default)]
    pub frozen_micros: u64,
}

impl Record for GroupSnapshotRecord {
    type Id = GroupSnapshotId;
    fn id(&self) -> &GroupSnapshotId {
        &self.id
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn parse_id(text: &str) -> Option<GroupSnapshotId> {
        GroupSnapshotId::parse(text)
    }
    fn needs(&self) -> u32 {
        GROUP_FORMAT
    }
}

/// A validated CreateVolumeGroupSnapshot request.
#[derive(Debug, Clone)]
pub struct GroupRequest {
    pub name: String,
    pub sources: Vec<VolumeId>,
    pub parameters: BTreeMap<String, String>,
}

/// A group snapshot as the CO sees it: its record and its members' snapshots.
#[derive(Debug, Clone)]
pub struct GroupSnapshot {
    pub record: Arc<GroupSnapshotRecord>,
    pub snapshots: Vec<Arc<SnapshotRecord>>,
}

impl GroupSnapshot {
    /// Every member is there and ready to be restored.
    pub fn ready(&self) -> bool {
        self.snapshots.len() == self.record.members.len() && self.snapshots.iter().all(|s| s.ready)
    }
}

impl Volumes {
    /// Cuts a group snapshot named `req.name` of `req.sources`, or returns the one already cut
    /// under that name. Returns once the group is whole: every member ready.
    pub fn create_group_snapshot(&self, req: GroupRequest) -> Result<GroupSnapshot> {
        check_sources(&req.sources)?;
        let _name = self.guards.acquire(
            format!("group-snapshot-name:{}", req.name),
            &format!("group snapshot name {:?}", req.name),
        )?;
        if let Some(existing) = self.groups.find_by_name(&req.name) {
            if existing.whole {
                same_request(&existing, &req)?;
                return Ok(self.group_view(existing));
            }
            // A cut that failed and could not be undone then: undo it now, and cut again.
            self.undo_group(&existing)?;
        }
        let record = self.cut_group(&req)?;
        info!(group = %record.id, name = %record.name, members = record.members.len(), frozen_micros = record.frozen_micros, "group snapshot cut");
        Ok(self.group_view(record))
    }

    /// The whole group snapshot `id`: NOT_FOUND if there is none (or it is still being cut);
    /// INVALID_ARGUMENT if `listed` (when given) is not its members' snapshots.
    pub fn group_snapshot(
        &self,
        id: &GroupSnapshotId,
        listed: &[SnapshotId],
    ) -> Result<GroupSnapshot> {
        let record = self
            .groups
            .get(id)
            .filter(|r| r.whole)
            .ok_or_else(|| Error::NotFound(format!("group snapshot {id} does not exist")))?;
        check_listed(&record, listed)?;
        Ok(self.group_view(record))
    }

    /// Deletes group snapshot `id` with every member; unknown ids succeed. Members go first
    /// and the record last, so a retry finishes what a failure left.
    pub fn delete_group_snapshot(&self, id: &GroupSnapshotId, listed: &[SnapshotId]) -> Result<()> {
        let _guard = self.guards.acquire(
            format!("group-snapshot:{id}"),
            &format!("group snapshot {id}"),
        )?;
        let Some(record) = self.groups.get(id) else {
            return Ok(());
        };
        check_listed(&record, listed)?;
        for member in &record.members {
            self.remove_snapshot(&member.snapshot)?;
        }
        self.groups
            .remove(id)
            .context(|| format!("removing the record of group snapshot {id}"))?;
        info!(group = %id, name = %record.name, members = record.members.len(), "deleted group snapshot");
        Ok(())
    }

    /// Whether group `id` exists whole (its members are visible).
    pub(in crate::volume) fn group_is_whole(&self, id: &GroupSnapshotId) -> bool {
        self.groups.get(id).is_some_and(|r| r.whole)
    }

    fn group_view(&self, record: Arc<GroupSnapshotRecord>) -> GroupSnapshot {
        let snapshots = record
            .members
            .iter()
            .filter_map(|m| self.snapshots.get(&m.snapshot))
            .collect();
        GroupSnapshot { record, snapshots }
    }

    /// Removes what a group that is not whole left (its members' data and records), then
    /// its record. What is already gone is fine.
    pub(in crate::volume) fn undo_group(&self, record: &GroupSnapshotRecord) -> Result<()> {
        for member in &record.members {
            if let Ok(pool) = self.pool(&member.pool) {
                for path in [
                    pool.snapshot_path(&member.snapshot, member.kind),
                    pool.snapshot_staging_path(&member.snapshot, member.kind),
                ] {
                    remove_snapshot_data(&path)
                        .map_err(|err| Error::walk_at(&path, "removing", err))?;
                }
                pool.release(&member.snapshot);
            }
            self.snapshots
                .remove(&member.snapshot)
                .context(|| format!("removing the record of snapshot {}", member.snapshot))?;
        }
        self.groups
            .remove(&record.id)
            .context(|| format!("removing the record of group snapshot {}", record.id))
    }

    /// At start, before the snapshots' own recovery: a group a crash interrupted goes, with
    /// its members; so does a member whose group is gone.
    pub(in crate::volume) fn recover_groups(&self) -> Result<()> {
        for record in self.groups.all().into_iter().filter(|r| !r.whole) {
            self.undo_group(&record)?;
            warn!(group = %record.id, name = %record.name, members = record.members.len(), "removed a group snapshot a restart interrupted before it was whole (its CreateVolumeGroupSnapshot never succeeded)");
        }
        let strays = self.snapshots.all().into_iter().filter(|s| {
            s.group
                .as_ref()
                .is_some_and(|g| !self.groups.has_record_file(g))
        });
        for stray in strays {
            self.remove_snapshot(&stray.id)?;
            warn!(snapshot = %stray.id, group = ?stray.group, "removed a member of a group snapshot that is gone");
        }
        Ok(())
    }
}

/// At least one volume, at most `MAX_MEMBERS`, none twice (INVALID_ARGUMENT).
fn check_sources(sources: &[VolumeId]) -> Result<()> {
    if sources.is_empty() {
        return Err(Error::InvalidArgument(
            "source_volume_ids is empty: a group snapshot needs at least one volume".into(),
        ));
    }
    if sources.len() > MAX_MEMBERS {
        return Err(Error::InvalidArgument(format!(
            "a group snapshot takes at most {MAX_MEMBERS} volumes, not {}",
            sources.len()
        )));
    }
    let mut seen = BTreeSet::new();
    if let Some(twice) = sources.iter().find(|id| !seen.insert(*id)) {
        return Err(Error::InvalidArgument(format!(
            "volume {twice} is named twice in source_volume_ids"
        )));
    }
    Ok(())
}

/// The same name must mean the same volumes and parameters (ALREADY_EXISTS otherwise).
fn same_request(existing: &GroupSnapshotRecord, req: &GroupRequest) -> Result<()> {
    let had: BTreeSet<&VolumeId> = existing.members.iter().map(|m| &m.volume).collect();
    let asked: BTreeSet<&VolumeId> = req.sources.iter().collect();
    if had != asked || existing.parameters != req.parameters {
        return Err(Error::AlreadyExists(format!(
            "group snapshot {:?} already exists as {} of other volumes or parameters",
            req.name, existing.id
        )));
    }
    Ok(())
}

/// `listed`, when given, must be exactly the group's snapshots (INVALID_ARGUMENT otherwise).
fn check_listed(record: &GroupSnapshotRecord, listed: &[SnapshotId]) -> Result<()> {
    if listed.is_empty() {
        return Ok(());
    }
    let members: BTreeSet<&SnapshotId> = record.members.iter().map(|m| &m.snapshot).collect();
    let given: BTreeSet<&SnapshotId> = listed.iter().collect();
    if members != given {
        return Err(Error::InvalidArgument(format!(
            "snapshot_ids do not match the snapshots of group snapshot {} ({})",
            record.id,
            members
                .iter()
                .map(|id| id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::state::id::NodeTag;
    use crate::volume::state::record::now_ms;

    fn tag() -> NodeTag {
        NodeTag::of("node-a")
    }

    fn group(volumes: &[VolumeId]) -> GroupSnapshotRecord {
        GroupSnapshotRecord {
            id: GroupSnapshotId::generate(&tag()),
            name: "g".into(),
            members: volumes
                .iter()
                .map(|volume| GroupMember {
                    volume: volume.clone(),
                    snapshot: SnapshotId::generate(&tag()),
                    kind: VolumeKind::Block,
                    pool: "default".into(),
                })
                .collect(),
            parameters: BTreeMap::new(),
            created_unix_ms: now_ms(),
            whole: true,
            frozen_micros: 0,
        }
    }

    #[test]
    fn sources_are_one_to_the_maximum_each_once() {
        let a = VolumeId::generate(&tag());
        let b = VolumeId::generate(&tag());
        assert!(check_sources(&[a.clone(), b.clone()]).is_ok());
        for bad in [vec![], vec![a.clone(), b, a.clone()]] {
            assert!(matches!(
                check_sources(&bad),
                Err(Error::InvalidArgument(_))
            ));
        }
        let many: Vec<_> = (0..=MAX_MEMBERS)
            .map(|_| VolumeId::generate(&tag()))
            .collect();
        assert!(matches!(
            check_sources(&many),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn a_name_again_must_name_the_same_volumes_in_any_order() {
        let (a, b, c) = (
            VolumeId::generate(&tag()),
            VolumeId::generate(&tag()),
            VolumeId::generate(&tag()),
        );
        let existing = group(&[a.clone(), b.clone()]);
        let asked = |sources: Vec<VolumeId>| GroupRequest {
            name: "g".into(),
            sources,
            parameters: BTreeMap::new(),
        };
        assert!(same_request(&existing, &asked(vec![b.clone(), a.clone()])).is_ok());
        let other = same_request(&existing, &asked(vec![a.clone(), c]));
        assert!(matches!(other, Err(Error::AlreadyExists(_))));
        let mut with_parameters = asked(vec![a, b]);
        with_parameters.parameters.insert("k".into(), "v".into());
        assert!(matches!(
            same_request(&existing, &with_parameters),
            Err(Error::AlreadyExists(_))
        ));
    }

    #[test]
    fn listed_snapshots_are_checked_only_when_given() {
        let existing = group(&[VolumeId::generate(&tag()), VolumeId::generate(&tag())]);
        let mut listed: Vec<_> = existing
            .members
            .iter()
            .rev()
            .map(|m| m.snapshot.clone())
            .collect();
        assert!(check_listed(&existing, &[]).is_ok());
        assert!(check_listed(&existing, &listed).is_ok());
        listed.pop();
        assert!(matches!(
            check_listed(&existing, &listed),
            Err(Error::InvalidArgument(_))
        ));
        listed.push(SnapshotId::generate(&tag()));
        assert!(matches!(
            check_listed(&existing, &listed),
            Err(Error::InvalidArgument(_))
        ));
    }
}
