//! A directory of small JSON records, one file per object, with an in-memory index, so every
//! lookup is O(1) or O(log n) whatever the number of objects. Volume records (`store`) and
//! snapshot records (`snapshot`) both live in one.
//!
//! A record is written atomically (temp file → fsync → rename → fsync the directory), so after a
//! crash each record is either the old or the new version, never a torn one.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Display;
use std::fs::{self, File};
use std::io::{self, Write};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde::Serialize;
use serde::de::DeserializeOwned;

pub const RECORD_SUFFIX: &str = ".json";
pub const TEMP_SUFFIX: &str = ".tmp";

/// What a record type tells the directory about itself.
pub trait Record: Serialize + DeserializeOwned + std::fmt::Debug {
    type Id: Ord + Clone + Display + std::hash::Hash + std::fmt::Debug;
    fn id(&self) -> &Self::Id;
    /// The CO's idempotency key.
    fn name(&self) -> &str;
    fn parse_id(text: &str) -> Option<Self::Id>;
}

#[derive(Debug)]
pub struct Records<R: Record> {
    dir: PathBuf,
    index: RwLock<Index<R>>,
}

#[derive(Debug)]
struct Index<R: Record> {
    by_id: BTreeMap<R::Id, Arc<R>>,
    by_name: HashMap<String, R::Id>,
}

/// What loading found besides good records.
#[derive(Debug)]
pub struct Loaded<Id> {
    /// Records that exist but cannot be read: their objects must be left alone, not treated
    /// as orphans.
    pub unreadable: Vec<(Id, String)>,
    /// Leftover temp files from an interrupted write, removed.
    pub removed_temp_files: usize,
}

impl<R: Record> Records<R> {
    /// Loads every record in `dir` (created if missing); other files are left alone.
    pub fn open(dir: &Path) -> io::Result<(Records<R>, Loaded<R::Id>)> {
        fs::create_dir_all(dir)?;
        let mut index = Index {
            by_id: BTreeMap::new(),
            by_name: HashMap::new(),
        };
        let mut loaded = Loaded {
            unreadable: Vec::new(),
            removed_temp_files: 0,
        };
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let file_name = entry.file_name();
            let Some(file_name) = file_name.to_str() else {
                continue;
            };
            if file_name.ends_with(TEMP_SUFFIX) {
                fs::remove_file(entry.path())?;
                loaded.removed_temp_files += 1;
                continue;
            }
            let Some(id) = file_name.strip_suffix(RECORD_SUFFIX).and_then(R::parse_id) else {
                continue;
            };
            match read_json::<R>(&entry.path()) {
                Ok(record) if *record.id() == id => index.insert(Arc::new(record)),
                Ok(record) => loaded
                    .unreadable
                    .push((id, format!("record names a different id {}", record.id()))),
                Err(err) => loaded.unreadable.push((id, err.to_string())),
            }
        }
        let records = Records {
            dir: dir.to_path_buf(),
            index: RwLock::new(index),
        };
        Ok((records, loaded))
    }

    pub fn get(&self, id: &R::Id) -> Option<Arc<R>> {
        self.read_index().by_id.get(id).cloned()
    }

    pub fn find_by_name(&self, name: &str) -> Option<Arc<R>> {
        let index = self.read_index();
        let id = index.by_name.get(name)?;
        index.by_id.get(id).cloned()
    }

    /// Whether a record file exists for `id`, readable or not.
    pub fn has_record_file(&self, id: &R::Id) -> bool {
        self.record_path(id).exists()
    }

    pub fn len(&self) -> usize {
        self.read_index().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn all(&self) -> Vec<Arc<R>> {
        self.read_index().by_id.values().cloned().collect()
    }

    /// Up to `max` records with ids after `after` (in id = creation order) that `keep`
    /// accepts, and whether more such records remain.
    pub fn page_after(
        &self,
        after: Option<&R::Id>,
        max: usize,
        keep: impl Fn(&R) -> bool,
    ) -> (Vec<Arc<R>>, bool) {
        let index = self.read_index();
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut range = index
            .by_id
            .range((lower, Bound::Unbounded))
            .map(|(_, r)| r)
            .filter(|r| keep(r));
        let page: Vec<_> = range.by_ref().take(max).cloned().collect();
        let more = range.next().is_some();
        (page, more)
    }

    /// Writes `record` durably and makes it visible.
    pub fn put(&self, record: Arc<R>) -> io::Result<()> {
        self.write(record.id(), &*record)?;
        self.write_index().insert(record);
        Ok(())
    }

    /// Makes `record` visible without writing it (its durable part did not change).
    pub fn replace_in_memory(&self, record: Arc<R>) {
        self.write_index().insert(record);
    }

    /// Durably writes `durable` as the record of `id`, leaving the index alone.
    pub fn write(&self, id: &R::Id, durable: &impl Serialize) -> io::Result<()> {
        let bytes = serde_json::to_vec_pretty(durable)?;
        write_durably(&self.temp_path(id), &self.record_path(id), &bytes)
    }

    /// Durably removes the record of `id`; a missing record is fine.
    pub fn remove(&self, id: &R::Id) -> io::Result<()> {
        match fs::remove_file(self.record_path(id)) {
            Ok(()) => sync_dir(&self.dir)?,
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(err),
        }
        let mut index = self.write_index();
        if let Some(record) = index.by_id.remove(id) {
            index.by_name.remove(record.name());
        }
        Ok(())
    }

    /// A file beside the record of `id`, e.g. `<id>.publications.json`.
    pub fn side_path(&self, id: &R::Id, suffix: &str) -> PathBuf {
        self.dir.join(format!("{id}{suffix}"))
    }

    /// A temp name for writing the side file `suffix` (swept at the next open).
    pub fn side_temp_path(&self, id: &R::Id, suffix: &str) -> PathBuf {
        self.dir.join(format!(".{id}{suffix}{TEMP_SUFFIX}"))
    }

    fn record_path(&self, id: &R::Id) -> PathBuf {
        self.side_path(id, RECORD_SUFFIX)
    }

    fn temp_path(&self, id: &R::Id) -> PathBuf {
        self.side_temp_path(id, RECORD_SUFFIX)
    }

    fn read_index(&self) -> RwLockReadGuard<'_, Index<R>> {
        self.index.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_index(&self) -> RwLockWriteGuard<'_, Index<R>> {
        self.index.write().unwrap_or_else(|e| e.into_inner())
    }
}

impl<R: Record> Index<R> {
    fn insert(&mut self, record: Arc<R>) {
        self.by_name
            .insert(record.name().to_string(), record.id().clone());
        self.by_id.insert(record.id().clone(), record);
    }
}

pub fn read_json<T: DeserializeOwned>(path: &Path) -> io::Result<T> {
    let bytes = fs::read(path)?;
    serde_json::from_slice(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// temp file → fsync → rename over `path` → fsync the directory.
pub fn write_durably(temp: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = File::create(temp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(temp, path)?;
    sync_dir(path.parent().unwrap_or(Path::new("/")))
}

/// Makes a directory's entries (creations, renames, removals) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
