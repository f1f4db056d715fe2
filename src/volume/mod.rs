//! The volume domain: where volumes live on disk, what we remember about them, and the
//! operations kubelet and the provisioner ask for. Nothing here knows about gRPC.
//!
//! On-disk layout under the data dir:
//! - `volumes/<id>/`     a filesystem volume's data (mode 0777, like emptyDir)
//! - `volumes/<id>.img`  a block volume's backing file (sparse)
//! - `state/<id>.json`   the volume's record, the commit point of its existence
//! - `volumes/.creating-<id>[.img]`  data of a create not yet committed
//! - `lost+found/`       data found without a record, kept for an admin

pub mod capacity;
mod create;
mod devices;
mod expand;
pub mod guard;
pub mod id;
mod publish;
pub mod record;
mod recover;
pub mod stats;
pub mod store;

use std::fs;

use nix::fcntl::{Flock, FlockArg};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, IoContext, Result};
use crate::host::fsstat::{self, Space};
use crate::host::tree::WalkError;

pub use create::CreateRequest;
pub use publish::PublishRequest;
pub use stats::VolumeStats;

use guard::OperationGuards;
use id::VolumeId;
use record::{VolumeKind, VolumeRecord};
use store::Store;

/// Prefix of data not yet committed by a record.
pub const STAGING_PREFIX: &str = ".creating-";

/// Paths inside the data directory.
#[derive(Debug, Clone)]
pub struct Layout {
    pub root: PathBuf,
    pub volumes: PathBuf,
    pub state: PathBuf,
}

impl Layout {
    pub fn new(root: &Path) -> Layout {
        Layout {
            root: root.to_path_buf(),
            volumes: root.join("volumes"),
            state: root.join("state"),
        }
    }

    /// Where a volume's data lives on the host.
    pub fn data_path(&self, id: &VolumeId, kind: VolumeKind) -> PathBuf {
        match kind {
            VolumeKind::Filesystem => self.volumes.join(id.as_str()),
            VolumeKind::Block => self.volumes.join(format!("{id}.img")),
        }
    }

    /// Where a volume's data is made before its record commits it.
    pub fn staging_path(&self, id: &VolumeId, kind: VolumeKind) -> PathBuf {
        let final_path = self.data_path(id, kind);
        let name = final_path.file_name().expect("data paths end in a name");
        self.volumes
            .join(format!("{STAGING_PREFIX}{}", name.to_string_lossy()))
    }

    /// Where data found without a record is moved instead of being deleted.
    pub fn lost_and_found(&self) -> PathBuf {
        self.root.join("lost+found")
    }

    /// The id a file name in `volumes/` belongs to, if it is one of ours.
    pub fn id_of_data_entry(file_name: &str) -> Option<VolumeId> {
        VolumeId::parse(file_name.strip_suffix(".img").unwrap_or(file_name))
    }
}

/// Whether a volume is healthy, as CSI's VolumeCondition reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub abnormal: bool,
    pub message: String,
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
    /// Held for our lifetime: one driver per data directory, whatever socket it serves.
    _lock: Flock<fs::File>,
    layout: Layout,
    kubelet_dir: PathBuf,
    store: Store,
    guards: OperationGuards,
}

impl Volumes {
    /// Opens (creating if needed) the data directory, loads every record and reconciles the
    /// host with them: see `recover`.
    pub fn open(data_dir: &Path, kubelet_dir: &Path) -> Result<Volumes> {
        for dir in [kubelet_dir, data_dir] {
            fs::create_dir_all(dir).context(|| format!("creating {}", dir.display()))?;
        }
        // The data dir holds every volume: only root may look inside; pods reach their own
        // volume through its bind mount.
        set_mode(data_dir, 0o700)?;
        // Canonical paths: the kernel reports loop backing files and mounts that way.
        let data_dir = data_dir
            .canonicalize()
            .context(|| format!("resolving {}", data_dir.display()))?;
        let kubelet_dir = kubelet_dir
            .canonicalize()
            .context(|| format!("resolving {}", kubelet_dir.display()))?;
        let lock = lock_data_dir(&data_dir)?;
        let layout = Layout::new(&data_dir);
        fs::create_dir_all(&layout.volumes)
            .context(|| format!("creating {}", layout.volumes.display()))?;
        let (store, report) = Store::open(&layout.state)
            .context(|| format!("loading records from {}", layout.state.display()))?;
        let volumes = Volumes {
            _lock: lock,
            layout,
            kubelet_dir,
            store,
            guards: OperationGuards::default(),
        };
        volumes.recover(report)?;
        Ok(volumes)
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
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
        let mut entries: Vec<CensusEntry> = [VolumeKind::Filesystem, VolumeKind::Block]
            .into_iter()
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

    /// Free space of the data directory's filesystem.
    pub fn space(&self) -> Result<Space> {
        fsstat::space(&self.layout.root)
            .context(|| format!("statvfs {}", self.layout.root.display()))
    }

    /// Ready when the data and state directories exist, are writable and not on a read-only mount.
    pub fn check_ready(&self) -> Result<()> {
        for dir in [&self.layout.volumes, &self.layout.state] {
            nix::unistd::access(dir.as_path(), nix::unistd::AccessFlags::W_OK)
                .map_err(std::io::Error::from)
                .context(|| format!("data directory {} is not writable", dir.display()))?;
        }
        let space = self.space()?;
        if space.read_only {
            return Err(Error::FailedPrecondition(format!(
                "data directory {} is on a read-only filesystem",
                self.layout.root.display()
            )));
        }
        Ok(())
    }

    /// Healthy unless the volume's data is missing or of the wrong type.
    pub fn condition(&self, record: &VolumeRecord) -> Condition {
        let path = self.layout.data_path(&record.id, record.kind);
        let problem = match fsstat::lstat_if_exists(&path) {
            Ok(None) => Some(format!(
                "data of volume {} is missing at {}",
                record.id,
                path.display()
            )),
            Ok(Some(stat)) => {
                let right_type = match record.kind {
                    VolumeKind::Filesystem => stat.is_dir(),
                    VolumeKind::Block => stat.is_regular_file(),
                };
                (!right_type).then(|| {
                    format!(
                        "data of volume {} at {} is not a {}",
                        record.id,
                        path.display(),
                        match record.kind {
                            VolumeKind::Filesystem => "directory",
                            VolumeKind::Block => "regular file",
                        }
                    )
                })
            }
            Err(err) => Some(format!(
                "cannot inspect data of volume {}: {err}",
                record.id
            )),
        };
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

    /// Claims the per-volume operation slot (ABORTED for a concurrent second caller).
    fn claim(&self, id: &VolumeId) -> Result<guard::OperationGuard> {
        self.guards
            .acquire(format!("volume:{id}"), &format!("volume {id}"))
    }
}

/// Takes `<data-dir>/.lock`, or fails naming the reason: two drivers reconciling one data
/// directory would undo each other's work (e.g. remove a create in progress as an orphan).
fn lock_data_dir(data_dir: &Path) -> Result<Flock<fs::File>> {
    let path = data_dir.join(".lock");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .context(|| format!("opening {}", path.display()))?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
        if errno == nix::errno::Errno::EWOULDBLOCK {
            Error::FailedPrecondition(format!(
                "another stickyvol instance is using the data directory {}",
                data_dir.display()
            ))
        } else {
            Error::host(format!("locking {}", path.display()), errno.into())
        }
    })
}

/// A walk over volume `id`'s data that failed. A mount inside the volume is for an admin to
/// remove (FAILED_PRECONDITION); an io error keeps its errno, so its gRPC code follows it.
fn walk_failure(id: &VolumeId, doing: &str, err: WalkError) -> Error {
    match err {
        WalkError::MountPoint(at) => Error::FailedPrecondition(format!(
            "volume {id} contains a mount point at {}; refusing to cross it",
            at.display()
        )),
        WalkError::Io { path, source } => {
            Error::host(format!("{doing} {} of volume {id}", path.display()), source)
        }
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .context(|| format!("setting mode {mode:o} on {}", path.display()))
}
