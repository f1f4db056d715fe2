//! The crash-safe record store: one JSON file per volume under `<data-dir>/state/`, plus an
//! in-memory index so every lookup is O(1) or O(log n) whatever the number of volumes.
//!
//! A record is written atomically (temp file → fsync → rename → fsync the directory), so after a
//! crash each record is either the old or the new version, never a torn one. The record is the
//! commit point of a volume's existence: see `volume::create`.
//!
//! Publications are kept beside the record, in `<id>.publications.json`, written atomically but
//! without fsync: they describe mounts and loop devices, which a power loss (the only thing that
//! can lose unsynced writes) takes away too. A driver crash leaves the page cache, and so the
//! file, intact. This keeps two disk flushes off every NodePublish and NodeUnpublish, and a
//! torn publications file can never damage the record itself.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{self, Write};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use super::id::VolumeId;
use super::record::{Publication, VolumeRecord};

const RECORD_SUFFIX: &str = ".json";
const PUBLICATIONS_SUFFIX: &str = ".publications.json";
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
    /// Publications files that could not be read (after a power loss): treated as none.
    pub unreadable_publications: Vec<(VolumeId, String)>,
}

impl Store {
    /// Loads every record in `dir` (created if missing).
    pub fn open(dir: &Path) -> io::Result<(Store, LoadReport)> {
        fs::create_dir_all(dir)?;
        let mut index = Index::default();
        let mut report = LoadReport::default();
        let mut inline = Vec::new();
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
            if file_name.ends_with(PUBLICATIONS_SUFFIX) {
                continue; // read with its record
            }
            let Some(id) = file_name
                .strip_suffix(RECORD_SUFFIX)
                .and_then(VolumeId::parse)
            else {
                continue;
            };
            match read_record(&entry.path()) {
                Ok(mut record) if record.id == id => {
                    match read_publications(&dir.join(format!("{id}{PUBLICATIONS_SUFFIX}"))) {
                        Ok(Some(publications)) => record.publications = publications,
                        // None, or kept inside the record by an older version: moved out below.
                        Ok(None) if !record.publications.is_empty() => inline.push(id.clone()),
                        Ok(None) => {}
                        Err(err) => {
                            record.publications.clear();
                            report.unreadable_publications.push((id, err.to_string()));
                        }
                    }
                    index.insert(Arc::new(record))
                }
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
        for id in inline {
            store.move_publications_out(&id)?;
        }
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

    /// Writes what changed of `record` (durably, publications aside), then makes it visible.
    /// Callers hold the volume's operation guard, so writes of one volume never interleave.
    pub fn put(&self, record: VolumeRecord) -> io::Result<Arc<VolumeRecord>> {
        let id = record.id.clone();
        let old = self.get(&id);
        let durable = record.without_publications();
        if old
            .as_ref()
            .is_none_or(|o| o.without_publications() != durable)
        {
            let bytes = serde_json::to_vec_pretty(&durable)?;
            let temp = self.dir.join(format!(".{id}{RECORD_SUFFIX}{TEMP_SUFFIX}"));
            write_durably(&temp, &self.record_path(&id), &bytes)?;
        }
        let old_publications = old.as_ref().map_or(&[][..], |o| &o.publications[..]);
        if old_publications != record.publications.as_slice() {
            self.write_publications(&id, &record.publications)?;
        }
        let record = Arc::new(record);
        self.write_index().insert(record.clone());
        Ok(record)
    }

    /// Upgrades a record that carries its publications inline (older versions): the side file
    /// first, then the record without them, so a crash in between loses nothing.
    fn move_publications_out(&self, id: &VolumeId) -> io::Result<()> {
        let Some(record) = self.get(id) else {
            return Ok(());
        };
        self.write_publications(id, &record.publications)?;
        let bytes = serde_json::to_vec_pretty(&record.without_publications())?;
        let temp = self.dir.join(format!(".{id}{RECORD_SUFFIX}{TEMP_SUFFIX}"));
        write_durably(&temp, &self.record_path(id), &bytes)
    }

    /// Atomically, without fsync (see the module comment); no file when there are none.
    fn write_publications(&self, id: &VolumeId, publications: &[Publication]) -> io::Result<()> {
        let path = self.publications_path(id);
        if publications.is_empty() {
            return match fs::remove_file(&path) {
                Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
                _ => Ok(()),
            };
        }
        let temp = self
            .dir
            .join(format!(".{id}{PUBLICATIONS_SUFFIX}{TEMP_SUFFIX}"));
        fs::write(&temp, serde_json::to_vec(publications)?)?;
        fs::rename(&temp, &path)
    }

    /// Durably removes the record of `id`; a missing record is fine.
    pub fn remove(&self, id: &VolumeId) -> io::Result<()> {
        match fs::remove_file(self.publications_path(id)) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => return Err(err),
            _ => {}
        }
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

    fn publications_path(&self, id: &VolumeId) -> PathBuf {
        self.dir.join(format!("{id}{PUBLICATIONS_SUFFIX}"))
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

/// None when there is no publications file.
fn read_publications(path: &Path) -> io::Result<Option<Vec<Publication>>> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
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

    fn publication(target: &str) -> Publication {
        Publication {
            target: target.into(),
            readonly: false,
            access_mode: AccessMode::SingleNodeWriter,
            mount_flags: vec![],
            loop_device: None,
        }
    }

    #[test]
    fn publications_live_beside_the_record_and_a_torn_file_means_none() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path()).unwrap();
        let created = store.put(record("a")).unwrap();
        let record_file = dir.path().join(format!("{}.json", created.id));
        let pub_file = dir.path().join(format!("{}.publications.json", created.id));
        let durable_before = fs::read(&record_file).unwrap();
        let mut published = (*created).clone();
        published.publications.push(publication("/k/pods/1/mount"));
        store.put(published.clone()).unwrap();
        // Publishing leaves the durable record alone.
        assert_eq!(fs::read(&record_file).unwrap(), durable_before);
        assert!(pub_file.exists());
        let (reopened, report) = Store::open(dir.path()).unwrap();
        assert!(report.unreadable_publications.is_empty());
        assert_eq!(*reopened.get(&created.id).unwrap(), published);

        fs::write(&pub_file, b"[{\"target\":").unwrap();
        let (reopened, report) = Store::open(dir.path()).unwrap();
        assert_eq!(report.unreadable_publications.len(), 1);
        let loaded = reopened.get(&created.id).unwrap();
        assert!(loaded.publications.is_empty());
        assert_eq!(
            loaded.without_publications(),
            created.without_publications()
        );

        // Unpublishing the last target removes the file; deleting removes both.
        store.put((*created).clone()).unwrap();
        assert!(!pub_file.exists());
        store.put(published).unwrap();
        store.remove(&created.id).unwrap();
        assert!(!pub_file.exists() && !record_file.exists());
    }

    #[test]
    fn publications_kept_inline_by_older_versions_still_load() {
        let dir = tempfile::tempdir().unwrap();
        let mut old = record("a");
        old.publications.push(publication("/k/t"));
        let inline = serde_json::to_vec(&old).unwrap();
        assert!(String::from_utf8_lossy(&inline).contains("/k/t"));
        fs::write(dir.path().join(format!("{}.json", old.id)), inline).unwrap();
        let (store, _) = Store::open(dir.path()).unwrap();
        assert_eq!(*store.get(&old.id).unwrap(), old);
        // Moved out at load: a later change of a durable field keeps them, and an unpublish
        // does not bring them back at the next load.
        let record_file = fs::read_to_string(dir.path().join(format!("{}.json", old.id))).unwrap();
        assert!(!record_file.contains("/k/t"), "{record_file}");
        let mut grown = old.clone();
        grown.capacity_bytes *= 2;
        store.put(grown.clone()).unwrap();
        let (reopened, _) = Store::open(dir.path()).unwrap();
        assert_eq!(*reopened.get(&old.id).unwrap(), grown);
        let mut unpublished = grown;
        unpublished.publications.clear();
        reopened.put(unpublished.clone()).unwrap();
        let (reopened, _) = Store::open(dir.path()).unwrap();
        assert_eq!(*reopened.get(&old.id).unwrap(), unpublished);
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
