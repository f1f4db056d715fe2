//! The crash-safe record store: one JSON file per volume under `<data-dir>/state/`, plus an
//! in-memory index so every lookup is O(1) or O(log n) whatever the number of volumes.
//!
//! A record is written atomically (temp file → fsync → rename → fsync the directory), so after a
//! crash each record is either the old or the new version, never a torn one. The record is the
//! commit point of a volume's existence: see `volume::create`.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{self, Write};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use super::id::VolumeId;
use super::record::VolumeRecord;

const RECORD_SUFFIX: &str = ".json";
const TEMP_SUFFIX: &str = ".tmp";

#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    index: RwLock<Index>,
}

#[derive(Debug, Default)]
struct Index {
    by_id: BTreeMap<VolumeId, Arc<VolumeRecord>>,
    by_name: HashMap<String, VolumeId>,
}

/// What loading found besides good records.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Records that exist but cannot be read: their volumes must be left alone, not treated as orphans.
    pub unreadable: Vec<(VolumeId, String)>,
    /// Leftover temp files from an interrupted write, removed.
    pub removed_temp_files: usize,
}

impl Store {
    /// Loads every record in `dir` (created if missing).
    pub fn open(dir: &Path) -> io::Result<(Store, LoadReport)> {
        fs::create_dir_all(dir)?;
        let mut index = Index::default();
        let mut report = LoadReport::default();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let file_name = entry.file_name();
            let Some(file_name) = file_name.to_str() else {
                continue;
            };
            if file_name.ends_with(TEMP_SUFFIX) {
                fs::remove_file(entry.path())?;
                report.removed_temp_files += 1;
                continue;
            }
            let Some(id) = file_name
                .strip_suffix(RECORD_SUFFIX)
                .and_then(VolumeId::parse)
            else {
                continue;
            };
            match read_record(&entry.path()) {
                Ok(record) if record.id == id => index.insert(Arc::new(record)),
                Ok(record) => report.unreadable.push((
                    id,
                    format!("record names a different volume id {}", record.id),
                )),
                Err(err) => report.unreadable.push((id, err.to_string())),
            }
        }
        let store = Store {
            dir: dir.to_path_buf(),
            index: RwLock::new(index),
        };
        Ok((store, report))
    }

    pub fn get(&self, id: &VolumeId) -> Option<Arc<VolumeRecord>> {
        self.read_index().by_id.get(id).cloned()
    }

    pub fn find_by_name(&self, name: &str) -> Option<Arc<VolumeRecord>> {
        let index = self.read_index();
        let id = index.by_name.get(name)?;
        index.by_id.get(id).cloned()
    }

    /// Whether a record file exists for `id`, readable or not.
    pub fn has_record_file(&self, id: &VolumeId) -> bool {
        self.record_path(id).exists()
    }

    pub fn len(&self) -> usize {
        self.read_index().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn all(&self) -> Vec<Arc<VolumeRecord>> {
        self.read_index().by_id.values().cloned().collect()
    }

    /// Up to `max` records with ids after `after`, in id (= creation) order, and whether more remain.
    pub fn page_after(
        &self,
        after: Option<&VolumeId>,
        max: usize,
    ) -> (Vec<Arc<VolumeRecord>>, bool) {
        let index = self.read_index();
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut range = index.by_id.range((lower, Bound::Unbounded));
        let page: Vec<_> = range.by_ref().take(max).map(|(_, r)| r.clone()).collect();
        let more = range.next().is_some();
        (page, more)
    }

    /// Durably writes `record`, then makes it visible.
    pub fn put(&self, record: VolumeRecord) -> io::Result<Arc<VolumeRecord>> {
        let bytes = serde_json::to_vec_pretty(&record)?;
        let path = self.record_path(&record.id);
        let temp = self
            .dir
            .join(format!(".{}{RECORD_SUFFIX}{TEMP_SUFFIX}", record.id));
        write_durably(&temp, &path, &bytes)?;
        let record = Arc::new(record);
        self.write_index().insert(record.clone());
        Ok(record)
    }

    /// Durably removes the record of `id`; a missing record is fine.
    pub fn remove(&self, id: &VolumeId) -> io::Result<()> {
        match fs::remove_file(self.record_path(id)) {
            Ok(()) => sync_dir(&self.dir)?,
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(err),
        }
        let mut index = self.write_index();
        if let Some(record) = index.by_id.remove(id) {
            index.by_name.remove(&record.name);
        }
        Ok(())
    }

    fn record_path(&self, id: &VolumeId) -> PathBuf {
        self.dir.join(format!("{id}{RECORD_SUFFIX}"))
    }

    fn read_index(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_index(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(|e| e.into_inner())
    }
}

impl Index {
    fn insert(&mut self, record: Arc<VolumeRecord>) {
        self.by_name.insert(record.name.clone(), record.id.clone());
        self.by_id.insert(record.id.clone(), record);
    }
}

fn read_record(path: &Path) -> io::Result<VolumeRecord> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::record::{AccessMode, Allocation, SizeLimit, VolumeKind};

    fn record(name: &str) -> VolumeRecord {
        VolumeRecord {
            id: VolumeId::generate(),
            name: name.into(),
            kind: VolumeKind::Filesystem,
            capacity_bytes: 1 << 20,
            pool: "default".into(),
            size_limit: SizeLimit::ProjectQuota { project_id: 7 },
            allocation: Allocation::Thin,
            access_modes: vec![AccessMode::SingleNodeWriter],
            mount_flags: vec![],
            parameters: Default::default(),
            created_unix_ms: 1,
            publications: vec![],
        }
    }

    #[test]
    fn records_written_before_pools_existed_load_with_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let id = VolumeId::generate();
        let old = format!(
            r#"{{"id":"{id}","name":"pv-1","kind":"block","capacity_bytes":4096,"access_modes":["SINGLE_NODE_WRITER"],"created_unix_ms":1}}"#
        );
        fs::write(dir.path().join(format!("{id}.json")), old).unwrap();
        let (store, report) = Store::open(dir.path()).unwrap();
        assert!(report.unreadable.is_empty(), "{:?}", report.unreadable);
        let loaded = store.get(&id).unwrap();
        assert_eq!(loaded.pool, "default");
        assert_eq!(loaded.size_limit, SizeLimit::None);
        assert_eq!(loaded.allocation, Allocation::Thin);
    }

    #[test]
    fn records_survive_a_reopen_and_temp_files_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path()).unwrap();
        let a = store.put(record("a")).unwrap();
        let b = store.put(record("b")).unwrap();
        store.remove(&b.id).unwrap();
        fs::write(dir.path().join(".x.json.tmp"), b"partial").unwrap();
        drop(store);

        let (store, report) = Store::open(dir.path()).unwrap();
        assert_eq!(report.removed_temp_files, 1);
        assert_eq!(store.len(), 1);
        assert_eq!(store.find_by_name("a").unwrap().id, a.id);
        assert!(store.find_by_name("b").is_none());
    }

    #[test]
    fn unreadable_records_are_reported_not_dropped_silently() {
        let dir = tempfile::tempdir().unwrap();
        let id = VolumeId::generate();
        fs::write(dir.path().join(format!("{id}.json")), b"{not json").unwrap();
        let (store, report) = Store::open(dir.path()).unwrap();
        assert!(store.is_empty());
        assert_eq!(report.unreadable.len(), 1);
        assert!(store.has_record_file(&id));
    }

    #[test]
    fn pages_follow_id_order_and_tolerate_deleted_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path()).unwrap();
        let ids: Vec<_> = (0..5)
            .map(|i| store.put(record(&format!("v{i}"))).unwrap().id.clone())
            .collect();
        let mut sorted = ids.clone();
        sorted.sort();
        let (page, more) = store.page_after(None, 2);
        assert!(more);
        assert_eq!(
            page.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
            sorted[..2]
        );
        store.remove(&sorted[1]).unwrap();
        let (page, more) = store.page_after(Some(&sorted[1]), 10);
        assert!(!more);
        assert_eq!(page.len(), 3);
    }
}
