//! Moving a volume's content in and out as one export stream (see `host::archive`): what
//! `stickyvol volume export` and `stickyvol volume import` ask the driver for.
//!
//! Export reads a volume nobody writes: an unpublished one, held for the whole export (a
//! publish meanwhile gets ABORTED and kubelet retries), or a temporary snapshot of a published
//! one where the pool makes snapshots cheaply (btrfs or reflinks). Import writes into an
//! unpublished volume it holds, after emptying it; it succeeds only once the stream's checksum
//! matched and the data is on disk. Any failure empties the volume again, and a crash midway is
//! caught at the next start by the record's `importing` mark: the volume is never left
//! half-written without saying so (it is emptied in the background once the driver serves, and
//! publish refuses it until then).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{FallocateFlags, fallocate};
use nix::unistd::{Whence, lseek};
use tracing::{error, info, warn};

use super::cow;
use super::in_flight::{CopyKind, copies_in_flight};
use super::snapshot::remove_snapshot_data;
use crate::error::{Error, IoContext, Result};
use crate::host::archive::{self, ArchiveError, Header, ImageOf, Importer, Kind, Summary};
use crate::host::{copy, safe_delete};
use crate::volume::Volumes;
use crate::volume::encryption;
use crate::volume::guard::OperationGuard;
use crate::volume::space::limits::size_file;
use crate::volume::space::mechanism::Mechanism;
use crate::volume::space::throttle::{caller_gone, node_walks};
use crate::volume::state::id::VolumeId;
use crate::volume::state::record::{VolumeKind, VolumeRecord};

/// What an export reads, held until it is dropped: the volume's operation slot (read directly)
/// or a temporary snapshot.
pub struct ExportSource {
    pub header: Header,
    /// How the content is read, for the admin.
    pub description: String,
    path: PathBuf,
    id: VolumeId,
    _snapshot: Option<TemporarySnapshot>,
    _slot: Option<OperationGuard>,
}

impl ExportSource {
    /// Writes the whole export stream to `out`.
    pub fn write_to(&self, out: &mut dyn Write) -> Result<Summary> {
        let Some(_slot) = node_walks().take() else {
            return Err(Error::host(
                format!("waiting to export volume {}", self.id),
                caller_gone(),
            ));
        };
        let _running = copies_in_flight().start(CopyKind::Export);
        archive::export(&self.path, &self.header, out)
            .map_err(|err| archive_failure(&self.id, "exporting", err))
    }
}

/// A snapshot taken for one export, removed when the export ends (or, after a crash, at the
/// next start).
struct TemporarySnapshot {
    path: PathBuf,
    volume: VolumeId,
}

impl Drop for TemporarySnapshot {
    fn drop(&mut self) {
        if let Err(err) = remove_snapshot_data(&self.path) {
            warn!(volume = %self.volume, path = %self.path.display(), error = %err, "could not remove the temporary snapshot of an export; the next start removes it");
        }
    }
}

fn kind_of(kind: VolumeKind) -> Kind {
    match kind {
        VolumeKind::Filesystem => Kind::Tree,
        // An image volume travels as its image file, filesystem and all.
        VolumeKind::Block | VolumeKind::Image(_) => Kind::Image,
    }
}

/// What an image stream of a volume of `kind` holds (None: a tree).
pub(super) fn image_of(kind: VolumeKind) -> Option<ImageOf> {
    match kind {
        VolumeKind::Filesystem => None,
        VolumeKind::Block => Some(ImageOf::Raw),
        VolumeKind::Image(fs) => Some(ImageOf::Filesystem(fs)),
    }
}

impl Volumes {
    /// Prepares an export of volume `id` (see the module comment for what it reads).
    pub fn open_export(&self, id: &VolumeId) -> Result<ExportSource> {
        let record = self.get(id)?;
        encryption::refuse_stream(&record, "exported")?;
        let pool = self.pool_of(&record)?;
        let data = pool.data_path(id, record.kind);
        let header_of = |path: &Path| {
            match record.kind {
                VolumeKind::Filesystem => archive::tree_header(path, id.as_str()),
                VolumeKind::Block => archive::image_header(path, id.as_str(), ImageOf::Raw),
                VolumeKind::Image(fs) => {
                    archive::image_header(path, id.as_str(), ImageOf::Filesystem(fs))
                }
            }
            .map_err(|err| archive_failure(id, "reading", err))
        };
        // Held first, then checked: a publish cannot slip in between.
        let slot = self.claim(id)?;
        let live = self.live_targets(&record)?;
        if live.is_empty() {
            return Ok(ExportSource {
                header: header_of(&data)?,
                description: "directly (unpublished; publishing it waits until the export ends)"
                    .into(),
                path: data,
                id: id.clone(),
                _snapshot: None,
                _slot: Some(slot),
            });
        }
        if pool.cow == Mechanism::Copy {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is published at {} and pool {:?} cannot snapshot it cheaply (no btrfs snapshots or reflinks there); stop the pods using it (e.g. scale the workload to 0) and export again",
                list(&live),
                pool.name
            )));
        }
        // Published: a snapshot is a consistent point in time the pods may write past.
        drop(slot);
        let _reading = self.claim_reading(id)?;
        let path = pool.export_snapshot_path(record.kind);
        let snapshot = TemporarySnapshot {
            path: path.clone(),
            volume: id.clone(),
        };
        let taken = self.with_frozen(&record, || {
            cow::snapshot_unflushed(pool, record.kind, &data, &path, &mut copy::Always)
        })?;
        // Once thawed, as every copy of a frozen volume.
        cow::sync_copy(&path)?;
        Ok(ExportSource {
            header: header_of(&path)?,
            description: format!(
                "from a temporary snapshot ({}), as the volume is published",
                match taken.mechanism {
                    Mechanism::BtrfsSnapshot => "btrfs snapshot",
                    Mechanism::Reflink => "reflink copy",
                    Mechanism::Copy => "copy",
                }
            ),
            path,
            id: id.clone(),
            _snapshot: Some(snapshot),
            _slot: None,
        })
    }

    /// Fills volume `id` from the export stream `input`; `replace` allows discarding what it
    /// holds. Returns once the data is verified and on disk.
    pub fn import(&self, id: &VolumeId, replace: bool, input: impl Read) -> Result<Summary> {
        let record = self.get(id)?;
        encryption::refuse_stream(&record, "imported")?;
        let pool = self.pool_of(&record)?;
        let _slot = self.claim(id)?;
        // Not while a snapshot or clone of it copies its data.
        let _unread = self.claim_unread(id)?;
        let live = self.live_targets(&record)?;
        if !live.is_empty() {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is published at {}; an import needs it unpublished (stop the pods using it first)",
                list(&live)
            )));
        }
        let data = pool.data_path(id, record.kind);
        let (importer, header) =
            Importer::start(input).map_err(|err| archive_failure(id, "importing", err))?;
        check_fits(&record, &header)?;
        if !replace && holds_data(&record, &data)? {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is not empty; `stickyvol volume import --replace` discards its content first"
            )));
        }
        let _running = copies_in_flight().start(CopyKind::Import);
        // From here until the mark is cleared, a crash leaves a volume the next start empties.
        let record = self.mark_importing(&record, true)?;
        self.empty(&record, &data)?;
        let capacity = record.capacity_bytes as u64;
        let imported = match record.kind {
            VolumeKind::Filesystem => importer.into_tree(&data, capacity),
            VolumeKind::Block | VolumeKind::Image(_) => importer.into_image(&data),
        }
        .map_err(|err| archive_failure(id, "importing", err))
        .and_then(|summary| {
            copy::sync_filesystem(&data)
                .context(|| format!("syncing {}", data.display()))
                .map(|()| summary)
        });
        let summary = match imported {
            Ok(summary) => summary,
            Err(err) => {
                let emptied = self.empty(&record, &data).and_then(|()| {
                    copy::sync_filesystem(&data).context(|| format!("syncing {}", data.display()))
                });
                return Err(match emptied {
                    Ok(()) => {
                        self.mark_importing(&record, false)?;
                        err.followed_by("; the volume was left empty")
                    }
                    Err(also) => err.followed_by(&format!("; emptying the volume failed too ({also}): it holds part of the stream until the driver restarts and empties it")),
                });
            }
        };
        // An image's filesystem is checked before the kernel first mounts it (`stage`).
        self.store
            .put(VolumeRecord {
                importing: false,
                unchecked: record.kind.image_fs().is_some(),
                ..(*record).clone()
            })
            .context(|| format!("writing the record of volume {id}"))?;
        info!(volume = %id, from = %header.source, bytes = summary.stream_bytes, data_bytes = summary.data_bytes, entries = summary.entries, "imported volume content");
        Ok(summary)
    }

    /// After a start: empties the volumes an import was writing when the driver stopped, on a
    /// thread of its own once the socket serves (a walk of a big tree must not hold the node's
    /// storage down, nor its failure stop the driver). Until then publish refuses them.
    pub fn finish_interrupted_imports(self: &Arc<Self>) {
        let marked: Vec<VolumeId> = self
            .store
            .all()
            .iter()
            .filter(|r| r.importing)
            .map(|r| r.id.clone())
            .collect();
        if marked.is_empty() {
            return;
        }
        let volumes = self.clone();
        let spawned = std::thread::Builder::new()
            .name("import-cleanup".into())
            .spawn(move || {
                for id in &marked {
                    match volumes.finish_interrupted_import(id) {
                        Ok(()) => {
                            warn!(volume = %id, "an import into this volume was interrupted; its partial content was removed and the volume is empty")
                        }
                        Err(err) => {
                            error!(volume = %id, error = %err, "cannot remove the partial content of an interrupted import; the volume stays unpublishable until `stickyvol volume import --replace` fills it or it is deleted")
                        }
                    }
                }
            });
        if let Err(err) = spawned {
            error!(error = %err, "cannot start removing the content of interrupted imports");
        }
    }

    fn finish_interrupted_import(&self, id: &VolumeId) -> Result<()> {
        let _slot = self.claim(id)?;
        let _unread = self.claim_unread(id)?;
        // Deleted, or filled by `import --replace`, since start.
        let Some(record) = self.store.get(id).filter(|r| r.importing) else {
            return Ok(());
        };
        let pool = self.pool_of(&record)?;
        let data = pool.data_path(&record.id, record.kind);
        self.empty(&record, &data)?;
        copy::sync_filesystem(&data).context(|| format!("syncing {}", data.display()))?;
        self.mark_importing(&record, false)?;
        Ok(())
    }

    fn mark_importing(&self, record: &VolumeRecord, importing: bool) -> Result<Arc<VolumeRecord>> {
        self.store
            .put(VolumeRecord {
                importing,
                ..record.clone()
            })
            .context(|| format!("writing the record of volume {}", record.id))
    }

    /// Removes a volume's content, keeping the volume: its directory (with its quota or
    /// subvolume), or its image (all holes again, thick ones reallocated).
    fn empty(&self, record: &VolumeRecord, data: &Path) -> Result<()> {
        match record.kind {
            VolumeKind::Filesystem => safe_delete::remove_contents(data)
                .map_err(|err| Error::volume_walk(&record.id, "emptying", err)),
            VolumeKind::Block | VolumeKind::Image(_) => {
                let file = OpenOptions::new()
                    .write(true)
                    .open(data)
                    .context(|| format!("opening {}", data.display()))?;
                let size = record.capacity_bytes as u64;
                fallocate(
                    file.as_fd(),
                    FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
                    0,
                    size as libc::off_t,
                )
                .map_err(std::io::Error::from)
                .context(|| format!("zeroing {}", data.display()))?;
                if record.fully_allocated() {
                    size_file(&file, data, record.allocation, size)?;
                }
                Ok(())
            }
        }
    }
}

/// The stream's kind and size against the volume's: refused before anything is written.
fn check_fits(record: &VolumeRecord, header: &Header) -> Result<()> {
    let id = &record.id;
    if header.kind != kind_of(record.kind) {
        let found = match header.kind {
            Kind::Tree => "filesystem",
            Kind::Image => "block",
        };
        return Err(Error::InvalidArgument(format!(
            "the stream holds a {found} volume (from {}) but volume {id} is a {} volume",
            header.source,
            record.kind.as_str()
        )));
    }
    check_image_of(record, header)?;
    let capacity = record.capacity_bytes as u64;
    let needed = match header.kind {
        Kind::Tree => header.allocated_bytes,
        Kind::Image => header.size_bytes,
    };
    if needed > capacity {
        return Err(Error::OutOfRange(format!(
            "the stream (from {}) needs {needed} bytes but volume {id} holds {capacity}; expand the volume or import into a bigger one",
            header.source
        )));
    }
    Ok(())
}

/// An image stream's bytes against the volume's kind: an image volume's filesystem is mounted
/// by the node's kernel, so it takes only a stream that says it holds that very filesystem; a
/// block volume takes raw bytes (from older releases too, which did not say), never a
/// filesystem of an image volume. Refused before anything is written.
fn check_image_of(record: &VolumeRecord, header: &Header) -> Result<()> {
    let (Some(wanted), Kind::Image) = (image_of(record.kind), header.kind) else {
        return Ok(());
    };
    let fits = match header.image {
        Some(found) => found == wanted,
        None => wanted == ImageOf::Raw,
    };
    if fits {
        return Ok(());
    }
    let id = &record.id;
    let found = match header.image {
        None => {
            "raw bytes (an export of an older release, which does not say what its image holds)"
                .to_string()
        }
        Some(ImageOf::Raw) => "a block volume's raw bytes".to_string(),
        Some(ImageOf::Filesystem(fs)) => format!("an image volume's {} filesystem", fs.name()),
    };
    let wanted = match wanted {
        ImageOf::Raw => "a block volume's raw bytes".to_string(),
        ImageOf::Filesystem(fs) => format!("an {} image volume's export", fs.name()),
    };
    Err(Error::InvalidArgument(format!(
        "the stream (from {}) holds {found}, but volume {id} is a {} volume and takes only {wanted}: the node mounts an image volume's filesystem, and must never mount bytes nobody said were one; export the source again with this release, into a volume of the same kind and filesystem",
        header.source,
        record.kind.as_str()
    )))
}

/// Whether the volume holds anything: an entry in its directory, or data in its image.
fn holds_data(record: &VolumeRecord, data: &Path) -> Result<bool> {
    let context = || format!("inspecting {}", data.display());
    match record.kind {
        VolumeKind::Filesystem => Ok(std::fs::read_dir(data).context(context)?.next().is_some()),
        VolumeKind::Block | VolumeKind::Image(_) => {
            let file = File::open(data).context(context)?;
            match lseek(file.as_fd(), 0, Whence::SeekData) {
                Ok(_) => Ok(true),
                // Nothing but holes (and unwritten, fallocated extents) to the end.
                Err(Errno::ENXIO) => Ok(false),
                Err(err) => Err(std::io::Error::from(err)).context(context),
            }
        }
    }
}

fn list(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A failed export or import, with the code its cause calls for: something that is no
/// export stream is the caller's (INVALID_ARGUMENT), a damaged one DATA_LOSS, one too big for
/// the volume (bytes or entries) OUT_OF_RANGE; host errors keep their errno.
fn archive_failure(id: &VolumeId, doing: &str, err: ArchiveError) -> Error {
    match err {
        ArchiveError::Walk(err) => Error::volume_walk(id, doing, err),
        ArchiveError::TooLarge { .. } | ArchiveError::TooManyEntries { .. } => {
            Error::OutOfRange(format!("{doing} volume {id}: {err}"))
        }
        ArchiveError::Output(source) | ArchiveError::Input(source) => {
            Error::host(format!("{doing} volume {id}"), source)
        }
        err @ (ArchiveError::NotAnExport
        | ArchiveError::Version(_)
        | ArchiveError::WrongKind { .. }) => {
            Error::InvalidArgument(format!("{doing} volume {id}: {err}"))
        }
        err @ (ArchiveError::Corrupt(_) | ArchiveError::Truncated(_)) => {
            Error::DataLoss(format!("{doing} volume {id}: {err}"))
        }
    }
}
