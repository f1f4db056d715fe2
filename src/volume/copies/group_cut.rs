//! Cutting a group snapshot: which members can be cut at one instant (`plan`), their writers
//! held while they are copied (`frozen_copies`), and the records that make the group whole.
//! Everything the cut needs (every slot, space, each filesystem's root) is taken before the
//! first freeze, so the writers wait for copies alone: a reflink or a btrfs clone of each
//! image, milliseconds. See `group` for what the instant promises.

use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::error;

use super::cow::{self, Copied};
use super::group::{GroupMember, GroupRequest, GroupSnapshotRecord};
use super::snapshot::SnapshotRecord;
use crate::error::{Error, IoContext, Result};
use crate::host::copy;
use crate::host::fsimage::Frozen;
use crate::volume::Volumes;
use crate::volume::guard::OperationGuard;
use crate::volume::space::accounting::Holder;
use crate::volume::space::mechanism::Mechanism;
use crate::volume::space::pool::Pool;
use crate::volume::space::throttle::{caller_gone, node_walk};
use crate::volume::state::id::{GroupSnapshotId, Issuer, SnapshotId, VolumeId};
use crate::volume::state::record::{VolumeRecord, now_ms};

/// One member as it is cut.
struct MemberCut<'a> {
    source: Arc<VolumeRecord>,
    pool: &'a Pool,
    snapshot: SnapshotId,
    /// The source's data, and where its copy goes.
    data: std::path::PathBuf,
    dest: std::path::PathBuf,
    /// Its filesystem's root, to freeze: it has writers.
    root: Option<File>,
}

impl Volumes {
    /// Cuts the group `req` asks for and makes it whole, or leaves nothing of it.
    pub(in crate::volume) fn cut_group(
        &self,
        req: &GroupRequest,
    ) -> Result<Arc<GroupSnapshotRecord>> {
        // Every member's slot: none is staged, published or deleted while it is cut.
        let _slots = req
            .sources
            .iter()
            .map(|id| self.claim(id))
            .collect::<Result<Vec<OperationGuard>>>()?;
        let mut cuts = self.plan(req)?;
        let intent = Arc::new(GroupSnapshotRecord {
            id: GroupSnapshotId::generate(&self.node),
            name: req.name.clone(),
            members: cuts
                .iter()
                .map(|cut| GroupMember {
                    volume: cut.source.id.clone(),
                    snapshot: cut.snapshot.clone(),
                    kind: cut.source.kind,
                    pool: cut.pool.name.clone(),
                })
                .collect(),
            parameters: req.parameters.clone(),
            created_unix_ms: now_ms(),
            whole: false,
            frozen_micros: 0,
        });
        let made = self.reserve_members(&cuts).and_then(|()| {
            self.groups
                .put(intent.clone())
                .context(|| format!("writing the record of group snapshot {}", intent.id))?;
            self.copy_and_record(&intent, &mut cuts)
        });
        match made {
            Ok(whole) => Ok(whole),
            Err(err) => {
                if let Err(undo) = self.undo_group(&intent) {
                    warn_undo(&intent.id, &undo);
                }
                Err(err)
            }
        }
    }

    /// The members as they will be cut, or why the group cannot be cut at one instant.
    fn plan(&self, req: &GroupRequest) -> Result<Vec<MemberCut<'_>>> {
        let alone = req.sources.len() == 1;
        let mut cuts = Vec::with_capacity(req.sources.len());
        for id in &req.sources {
            let source = self.store.get(id).ok_or_else(|| self.missing_member(id))?;
            let pool = self.pool_of(&source)?;
            if pool.cow == Mechanism::Copy {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} is in pool {}, which cannot copy a file by reference (no reflinks): a group snapshot is cut in an instant only where the copies are (XFS with reflink=1, btrfs)",
                    pool.name
                )));
            }
            let root = self.root_to_freeze(&source)?;
            if root.is_none() && !source.publications.is_empty() && !alone {
                return Err(Error::FailedPrecondition(format!(
                    "volume {id} is a {} volume in use by a pod: stickyvol can hold the writers of image volumes only (it freezes their filesystems), so a group with it and other volumes cannot be cut at one instant; use image volumes (a class with fsType ext4 or xfs) for volumes snapshotted together, or stop the pod first",
                    source.kind.as_str()
                )));
            }
            let snapshot = SnapshotId::generate(&self.node);
            cuts.push(MemberCut {
                data: pool.data_path(&source.id, source.kind),
                dest: pool.snapshot_path(&snapshot, source.kind),
                source,
                pool,
                snapshot,
                root,
            });
        }
        Ok(cuts)
    }

    /// A member this node does not hold: NOT_FOUND if this node issued its id, else a group
    /// spanning nodes, which no one instant can cut (FAILED_PRECONDITION).
    fn missing_member(&self, id: &VolumeId) -> Error {
        match id.issuer() {
            Issuer::Node(tag) if tag == self.node => {
                Error::NotFound(format!("source volume {id} does not exist"))
            }
            _ => Error::FailedPrecondition(format!(
                "volume {id} is not on this node: a group snapshot is cut on one node, at one instant, so every volume of the group must be on the same node (select claims of one pod, or of pods on one node)"
            )),
        }
    }

    /// Promises each member's data in its pool (RESOURCE_EXHAUSTED if one has no room).
    fn reserve_members(&self, cuts: &[MemberCut<'_>]) -> Result<()> {
        for cut in cuts {
            let bytes = self.data_bytes(cut.pool, &cut.source)?;
            let what = format!("a group snapshot of volume {}", cut.source.id);
            self.reserve(cut.pool, Holder::from(&cut.snapshot), bytes, &what)?;
        }
        Ok(())
    }

    /// Copies every member (those without writers first, then the others frozen together),
    /// flushes the copies, records each member and then the group, whole.
    fn copy_and_record(
        &self,
        intent: &GroupSnapshotRecord,
        cuts: &mut [MemberCut<'_>],
    ) -> Result<Arc<GroupSnapshotRecord>> {
        let Some(_slot) = node_walk() else {
            return Err(Error::host(
                "waiting to cut a group snapshot",
                caller_gone(),
            ));
        };
        let mut copied: Vec<Option<Copied>> = vec![None; cuts.len()];
        for (cut, slot) in cuts.iter().zip(copied.iter_mut()) {
            if cut.root.is_none() {
                *slot = Some(cow::snapshot_unflushed(
                    cut.pool,
                    cut.source.kind,
                    &cut.data,
                    &cut.dest,
                    &mut copy::Always,
                )?);
            }
        }
        let window = frozen_copies(cuts, &mut copied)?;
        for cut in cuts.iter() {
            cow::sync_copy(&cut.dest)?;
        }
        for (cut, copied) in cuts.iter().zip(copied) {
            let copied = copied.expect("every member was copied");
            self.record_member(intent, cut, copied)?;
        }
        let whole = Arc::new(GroupSnapshotRecord {
            whole: true,
            frozen_micros: u64::try_from(window.as_micros()).unwrap_or(u64::MAX),
            ..intent.clone()
        });
        // The commit point: from here on the group exists, every member ready.
        self.groups
            .put(whole.clone())
            .context(|| format!("writing the record of group snapshot {}", intent.id))?;
        Ok(whole)
    }

    /// Records a member, ready: visible once its group is whole.
    fn record_member(
        &self,
        intent: &GroupSnapshotRecord,
        cut: &MemberCut<'_>,
        copied: Copied,
    ) -> Result<()> {
        let source = &cut.source;
        let record = SnapshotRecord {
            id: cut.snapshot.clone(),
            // Its own id: a name no CreateSnapshot can ask for (`create_snapshot` refuses members).
            name: cut.snapshot.to_string(),
            source_volume: source.id.clone(),
            kind: source.kind,
            pool: cut.pool.name.clone(),
            size_bytes: source.capacity_bytes,
            asked_bytes: source.asked_bytes,
            mechanism: copied.mechanism,
            data_bytes: copied.data_bytes,
            exclusive_bytes: copied.copied_bytes,
            ready: true,
            copy_attempts: 0,
            copy_error: None,
            parameters: intent.parameters.clone(),
            created_unix_ms: intent.created_unix_ms,
            encryption: source.encryption,
            group: Some(intent.id.clone()),
        };
        self.snapshots
            .put(Arc::new(record))
            .context(|| format!("writing the record of snapshot {}", cut.snapshot))?;
        cut.pool.restore(&cut.snapshot, copied.data_bytes);
        cut.pool.set_used(&cut.snapshot, copied.copied_bytes);
        Ok(())
    }
}

/// Freezes every member with writers, copies each (a reflink: no flush, nothing to wait for),
/// thaws them all, and returns how long the first waited: the window the writers were held.
/// What was written before is flushed first, outside the window, and the filesystems are frozen
/// side by side, each on a thread of its own: a freeze still flushes what came since and
/// quiesces its log (tens of milliseconds on XFS), and one after another they would add up. A
/// freeze that fails thaws those already frozen (`Frozen` thaws when dropped).
fn frozen_copies(cuts: &mut [MemberCut<'_>], copied: &mut [Option<Copied>]) -> Result<Duration> {
    let mut roots = Vec::new();
    for cut in cuts.iter_mut() {
        if let Some(root) = cut.root.take() {
            roots.push((cut.source.id.clone(), root));
        }
    }
    if roots.is_empty() {
        return Ok(Duration::ZERO);
    }
    for (_, root) in &roots {
        // Best effort: the freeze flushes whatever this did not.
        let _ = nix::unistd::syncfs(root);
    }
    let started = Instant::now();
    let frozen = freeze_all(roots)?;
    let freezing = started.elapsed();
    let mut copies = Ok(());
    for (cut, slot) in cuts.iter().zip(copied.iter_mut()) {
        if slot.is_none() && copies.is_ok() {
            copies = cow::clone_file(cut.pool, &cut.data, &cut.dest).map(|c| *slot = Some(c));
        }
    }
    let copying = started.elapsed() - freezing;
    let mut thawed = Ok(());
    for (id, held) in frozen {
        if let Err(err) = held.thaw() {
            // Left frozen, every writer of the volume would hang: say so loudly.
            error!(volume = %id, error = %err, "could not thaw the filesystem after a group snapshot's cut; its writers are blocked until `fsfreeze -u` is run on the node or the driver restarts");
            thawed = Err(Error::host(
                format!("thawing the filesystem of volume {id}"),
                err,
            ));
        }
    }
    let window = started.elapsed();
    tracing::debug!(
        freezing_micros = freezing.as_micros() as u64,
        copying_micros = copying.as_micros() as u64,
        thawing_micros = (window - freezing - copying).as_micros() as u64,
        "group snapshot window"
    );
    copies?;
    thawed?;
    Ok(window)
}

/// Freezes every filesystem, each on a thread of its own, all or none: when one fails, those
/// frozen are thawed (dropped) and the first failure is the error.
fn freeze_all(roots: Vec<(VolumeId, File)>) -> Result<Vec<(VolumeId, Frozen)>> {
    let outcomes: Vec<(VolumeId, std::io::Result<Frozen>)> = std::thread::scope(|scope| {
        let freezing: Vec<_> = roots
            .into_iter()
            .map(|(id, root)| (id, scope.spawn(move || Frozen::freeze(root))))
            .collect();
        freezing
            .into_iter()
            .map(|(id, thread)| {
                let outcome = thread
                    .join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("the freezing thread panicked")));
                (id, outcome)
            })
            .collect()
    });
    let mut frozen = Vec::with_capacity(outcomes.len());
    let mut failed = None;
    for (id, outcome) in outcomes {
        match outcome {
            Ok(held) => frozen.push((id, held)),
            Err(err) if failed.is_none() => {
                failed = Some(Error::host(
                    format!("freezing the filesystem of volume {id}"),
                    err,
                ));
            }
            Err(_) => {}
        }
    }
    match failed {
        Some(err) => Err(err),
        None => Ok(frozen),
    }
}

fn warn_undo(id: &GroupSnapshotId, err: &Error) {
    tracing::warn!(group = %id, error = %err, "could not remove what a failed group snapshot cut left; the next call with its name, or the next start, removes it");
}
