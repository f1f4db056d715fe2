//! The crash-safe volume store: one JSON record per volume under `<data-dir>/state/`, its
//! changes committed by the journal `<data-dir>/state/journal/volumes.<n>` (see `records` and
//! `journal`): the commit point of a volume's existence (see `volume::create`).
//!
//! Publications are kept in `<id>.publications.json`, written atomically but never flushed:
//! they describe mounts and loop devices, which a power loss (the only thing that can lose
//! unflushed writes) or a reboot takes away too. A driver crash leaves the page cache, and so
//! the file, intact. They live in the run directory (`--run-dir`, e.g. /run/stickyvol on a
//! tmpfs: a reboot empties it, as it empties the mounts), or beside the records without one.
//! This keeps disk flushes off every NodePublish and NodeUnpublish, and a torn publications
//! file can never damage the record itself.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::journal;
use super::journal::Appended;

use super::files::{read_json, remove_file_if_present};
pub use super::files::{sync_dir, write_durably};
use super::id::VolumeId;
use super::record::{Publication, VolumeRecord};
use super::records::{Record, Records, TEMP_SUFFIX};

const PUBLICATIONS_SUFFIX: &str = ".publications.json";
/// Under the state directory: the journals of volume and snapshot records.
pub const JOURNAL_DIR: &str = "journal";

impl Record for VolumeRecord {
    type Id = VolumeId;
    fn id(&self) -> &VolumeId {
        &self.id
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn parse_id(text: &str) -> Option<VolumeId> {
        VolumeId::parse(text)
    }
    fn needs(&self) -> u32 {
        super::format::needs_for(self.kind, self.encryption.is_some())
    }
}

#[derive(Debug)]
pub struct Store {
    records: Records<VolumeRecord>,
    /// Where publications files live (see the module comment).
    run: PathBuf,
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
    /// Volumes created by a journal entry not compacted yet (see `recover`).
    pub created_recently: HashSet<VolumeId>,
    /// Volumes removed by a journal entry not compacted yet (see `recover`).
    pub removed_recently: HashSet<VolumeId>,
    /// Torn journal tails ignored (already logged as warnings).
    pub torn: Vec<String>,
}

impl Store {
    /// Loads every record in `dir` (created if missing) and the journal `dir/journal/volumes.*`
    /// over them, with their publications.
    pub fn open(
        dir: &Path,
        run_dir: Option<&Path>,
        options: journal::Options,
    ) -> io::Result<(Store, LoadReport)> {
        let (records, loaded) =
            Records::<VolumeRecord>::open(dir, &dir.join(JOURNAL_DIR), "volumes", options)?;
        let run = match run_dir {
            Some(run) => {
                fs::create_dir_all(run)?;
                fs::set_permissions(run, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
                sweep_temp_files(run)?;
                run.to_path_buf()
            }
            None => dir.to_path_buf(),
        };
        let mut report = LoadReport {
            unreadable: loaded.unreadable,
            removed_temp_files: loaded.removed_temp_files,
            unreadable_publications: Vec::new(),
            created_recently: loaded.created_recently,
            removed_recently: loaded.removed_recently,
            torn: loaded.torn,
        };
        let store = Store { records, run };
        for record in store.records.all() {
            let id = &record.id;
            match store.read_publications(id) {
                Ok(Some(publications)) => {
                    let mut with = (*record).clone();
                    with.publications = publications;
                    store.records.replace_in_memory(Arc::new(with));
                }
                // Kept inside the record by an older version: moved out.
                Ok(None) if !record.publications.is_empty() => {
                    store.move_publications_out(&record)?
                }
                Ok(None) => {}
                Err(err) => {
                    let mut without = (*record).clone();
                    without.publications.clear();
                    store.records.replace_in_memory(Arc::new(without));
                    report
                        .unreadable_publications
                        .push((id.clone(), err.to_string()));
                }
            }
        }
        Ok((store, report))
    }

    pub fn get(&self, id: &VolumeId) -> Option<Arc<VolumeRecord>> {
        self.records.get(id)
    }

    pub fn find_by_name(&self, name: &str) -> Option<Arc<VolumeRecord>> {
        self.records.find_by_name(name)
    }

    /// Whether a record exists for `id`, readable or not.
    pub fn has_record_file(&self, id: &VolumeId) -> bool {
        self.records.has_record_file(id)
    }

    /// Whether the journal can take commits (see `Journal::health`).
    pub fn journal_health(&self) -> Result<(), String> {
        self.records.journal_health()
    }

    pub fn journal_stats(&self) -> super::journal::Stats {
        self.records.journal_stats()
    }

    /// The journal's flush count so far.
    pub fn flushes(&self) -> u64 {
        self.records.flushes()
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn all(&self) -> Vec<Arc<VolumeRecord>> {
        self.records.all()
    }

    /// Up to `max` records with ids after `after`, in id (= creation) order, and whether more remain.
    pub fn page_after(
        &self,
        after: Option<&VolumeId>,
        max: usize,
    ) -> (Vec<Arc<VolumeRecord>>, bool) {
        self.records.page_after(after, max, |_| true)
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
            self.records.write(&durable)?;
        }
        let old_publications = old.as_ref().map_or(&[][..], |o| &o.publications[..]);
        if old_publications != record.publications.as_slice() {
            self.write_publications(&id, &record.publications)?;
        }
        let record = Arc::new(record);
        self.records.replace_in_memory(record.clone());
        Ok(record)
    }

    /// Upgrades a record that carries its publications inline (older versions): the side file
    /// first, then the record without them, so a crash in between loses nothing.
    fn move_publications_out(&self, record: &VolumeRecord) -> io::Result<()> {
        self.write_publications(&record.id, &record.publications)?;
        self.records.write(&record.without_publications())
    }

    /// Atomically, without fsync (see the module comment); no file when there are none.
    fn write_publications(&self, id: &VolumeId, publications: &[Publication]) -> io::Result<()> {
        let path = self.publications_path(id);
        if publications.is_empty() {
            return remove_file_if_present(&path);
        }
        let temp = self
            .run
            .join(format!(".{id}{PUBLICATIONS_SUFFIX}{TEMP_SUFFIX}"));
        fs::write(&temp, serde_json::to_vec(publications)?)?;
        fs::rename(&temp, &path)
    }

    fn publications_path(&self, id: &VolumeId) -> PathBuf {
        self.run.join(format!("{id}{PUBLICATIONS_SUFFIX}"))
    }

    /// The publications of `id` (None: no file). A file an earlier start left beside the
    /// record, when the run directory is elsewhere now, is moved there first.
    fn read_publications(&self, id: &VolumeId) -> io::Result<Option<Vec<Publication>>> {
        let beside = self.records.side_path(id, PUBLICATIONS_SUFFIX);
        let path = self.publications_path(id);
        if beside != path
            && let Some(publications) = read_publications(&beside)?
        {
            self.write_publications(id, &publications)?;
            remove_file_if_present(&beside)?;
        }
        read_publications(&path)
    }

    /// Durably removes the record of `id`; a missing record is fine.
    pub fn remove(&self, id: &VolumeId) -> io::Result<()> {
        let removal = self.start_remove(id)?;
        self.finish_remove(id, removal)
    }

    /// `remove` in two halves, to overlap work with the journal's write (see
    /// `Records::start_remove`): once started, the removal is committed.
    pub fn start_remove(&self, id: &VolumeId) -> io::Result<Option<Appended>> {
        self.records.start_remove(id)
    }

    pub fn finish_remove(&self, id: &VolumeId, removal: Option<Appended>) -> io::Result<()> {
        // The wait first: returning before it would leave the removal unacknowledged.
        self.records.finish_remove(id, removal)?;
        remove_file_if_present(&self.publications_path(id))
    }
}

/// Removes the temp files of publications writes a crash interrupted.
fn sweep_temp_files(run: &Path) -> io::Result<()> {
    for entry in fs::read_dir(run)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') && name.ends_with(&format!("{PUBLICATIONS_SUFFIX}{TEMP_SUFFIX}")) {
            remove_file_if_present(&run.join(&*name))?;
        }
    }
    Ok(())
}

/// None when there is no publications file.
fn read_publications(path: &Path) -> io::Result<Option<Vec<Publication>>> {
    match read_json(path) {
        Ok(publications) => Ok(Some(publications)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::state::record::{AccessMode, Allocation, SizeLimit, VolumeKind};

    fn record(name: &str) -> VolumeRecord {
        VolumeRecord {
            id: VolumeId::generate(&crate::volume::state::id::NodeTag::of("test")),
            name: name.into(),
            kind: VolumeKind::Filesystem,
            capacity_bytes: 1 << 20,
            asked_bytes: None,
            pool: "default".into(),
            size_limit: SizeLimit::ProjectQuota { project_id: 7 },
            allocation: Allocation::Thin,
            access_modes: vec![AccessMode::SingleNodeWriter],
            mount_flags: vec![],
            parameters: Default::default(),
            created_unix_ms: 1,
            content_source: None,
            importing: false,
            unchecked: false,
            orphaned: None,
            fenced: None,
            io_limits: Default::default(),
            on_overflow: None,
            encryption: None,
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
            loop_backing_file: None,
            staging: false,
            pod: None,
        }
    }

    /// The bounds CreateVolume applies (`request`) keep every record within what the journal
    /// writes and reads back, however its bytes are escaped.
    #[test]
    fn the_largest_record_a_request_can_make_fits_a_journal_frame() {
        use crate::class::MAX_PARAMETER_BYTES;
        use crate::faces::request::MAX_NAME_BYTES;
        use crate::volume::state::journal_file::MAX_PAYLOAD;
        let mut big = record(&"\u{1}".repeat(MAX_NAME_BYTES));
        let key = "csi.storage.k8s.io/pv/name".to_string();
        big.parameters = [(key.clone(), "\u{1}".repeat(MAX_PARAMETER_BYTES - key.len()))].into();
        let json = serde_json::to_vec_pretty(&big).unwrap();
        assert!(
            json.len() > 6 * MAX_PARAMETER_BYTES - 1024,
            "escaped: {}",
            json.len()
        );
        assert!(json.len() < MAX_PAYLOAD / 4, "{} bytes", json.len());
    }

    #[test]
    fn publications_live_beside_the_record_and_a_torn_file_means_none() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path(), None, Default::default()).unwrap();
        let created = store.put(record("a")).unwrap();
        let record_file = dir.path().join(format!("{}.json", created.id));
        let pub_file = dir.path().join(format!("{}.publications.json", created.id));
        // Record files are written back by the journal's compaction.
        store.records.compact_now().unwrap();
        let durable_before = fs::read(&record_file).unwrap();
        let flushes_before = store.flushes();
        let mut published = (*created).clone();
        published.publications.push(publication("/k/pods/1/mount"));
        store.put(published.clone()).unwrap();
        // Publishing leaves the durable record alone.
        assert_eq!(store.flushes(), flushes_before);
        store.records.compact_now().unwrap();
        assert_eq!(fs::read(&record_file).unwrap(), durable_before);
        assert!(pub_file.exists());
        // One store per directory at a time, as the pool lock ensures in the driver: a second
        // one's background compaction would race this one's.
        drop(store);
        let (reopened, report) = Store::open(dir.path(), None, Default::default()).unwrap();
        assert!(report.unreadable_publications.is_empty());
        assert_eq!(*reopened.get(&created.id).unwrap(), published);
        drop(reopened);

        fs::write(&pub_file, b"[{\"target\":").unwrap();
        let (store, report) = Store::open(dir.path(), None, Default::default()).unwrap();
        assert_eq!(report.unreadable_publications.len(), 1);
        let loaded = store.get(&created.id).unwrap();
        assert!(loaded.publications.is_empty());
        assert_eq!(
            loaded.without_publications(),
            created.without_publications()
        );

        // Unpublishing the last target removes the file; deleting removes both.
        store.put(published.clone()).unwrap();
        assert!(pub_file.exists());
        store.put((*created).clone()).unwrap();
        assert!(!pub_file.exists());
        store.put(published).unwrap();
        store.remove(&created.id).unwrap();
        assert!(!pub_file.exists());
        store.records.compact_now().unwrap();
        assert!(!record_file.exists());
    }

    #[test]
    fn publications_kept_inline_by_older_versions_still_load() {
        let dir = tempfile::tempdir().unwrap();
        let mut old = record("a");
        old.publications.push(publication("/k/t"));
        let inline = serde_json::to_vec(&old).unwrap();
        assert!(String::from_utf8_lossy(&inline).contains("/k/t"));
        fs::write(dir.path().join(format!("{}.json", old.id)), inline).unwrap();
        let (store, _) = Store::open(dir.path(), None, Default::default()).unwrap();
        assert_eq!(*store.get(&old.id).unwrap(), old);
        // Moved out at load: a later change of a durable field keeps them, and an unpublish
        // does not bring them back at the next load.
        store.records.compact_now().unwrap();
        let record_file = fs::read_to_string(dir.path().join(format!("{}.json", old.id))).unwrap();
        assert!(!record_file.contains("/k/t"), "{record_file}");
        let mut grown = old.clone();
        grown.capacity_bytes *= 2;
        store.put(grown.clone()).unwrap();
        drop(store);
        let (reopened, _) = Store::open(dir.path(), None, Default::default()).unwrap();
        assert_eq!(*reopened.get(&old.id).unwrap(), grown);
        let mut unpublished = grown;
        unpublished.publications.clear();
        reopened.put(unpublished.clone()).unwrap();
        drop(reopened);
        let (reopened, _) = Store::open(dir.path(), None, Default::default()).unwrap();
        assert_eq!(*reopened.get(&old.id).unwrap(), unpublished);
    }

    #[test]
    fn records_written_before_pools_existed_load_with_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let id = VolumeId::generate(&crate::volume::state::id::NodeTag::of("test"));
        let old = format!(
            r#"{{"id":"{id}","name":"pv-1","kind":"block","capacity_bytes":4096,"access_modes":["SINGLE_NODE_WRITER"],"created_unix_ms":1}}"#
        );
        fs::write(dir.path().join(format!("{id}.json")), old).unwrap();
        let (store, report) = Store::open(dir.path(), None, Default::default()).unwrap();
        assert!(report.unreadable.is_empty(), "{:?}", report.unreadable);
        let loaded = store.get(&id).unwrap();
        assert_eq!(loaded.pool, "default");
        assert_eq!(loaded.size_limit, SizeLimit::None);
        assert_eq!(loaded.allocation, Allocation::Thin);
    }

    #[test]
    fn records_survive_a_reopen_and_temp_files_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path(), None, Default::default()).unwrap();
        let a = store.put(record("a")).unwrap();
        let b = store.put(record("b")).unwrap();
        store.remove(&b.id).unwrap();
        fs::write(dir.path().join(".x.json.tmp"), b"partial").unwrap();
        drop(store);

        let (store, report) = Store::open(dir.path(), None, Default::default()).unwrap();
        assert_eq!(report.removed_temp_files, 1);
        assert_eq!(store.len(), 1);
        assert_eq!(store.find_by_name("a").unwrap().id, a.id);
        assert!(store.find_by_name("b").is_none());
    }

    #[test]
    fn unreadable_records_are_reported_not_dropped_silently() {
        let dir = tempfile::tempdir().unwrap();
        let id = VolumeId::generate(&crate::volume::state::id::NodeTag::of("test"));
        fs::write(dir.path().join(format!("{id}.json")), b"{not json").unwrap();
        let (store, report) = Store::open(dir.path(), None, Default::default()).unwrap();
        assert!(store.is_empty());
        assert_eq!(report.unreadable.len(), 1);
        assert!(store.has_record_file(&id));
    }

    #[test]
    fn pages_follow_id_order_and_tolerate_deleted_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path(), None, Default::default()).unwrap();
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

    #[test]
    fn an_image_volume_record_needs_format_2_and_reads_back_whole() {
        use crate::volume::state::record::FsType;
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path(), None, Default::default()).unwrap();
        let mut image = record("image");
        image.kind = VolumeKind::Image(FsType::Xfs);
        image.allocation = Allocation::Thick;
        let plain = store.put(record("plain")).unwrap();
        let image = store.put(image).unwrap();
        store.records.compact_now().unwrap();
        let file = |id: &VolumeId| -> serde_json::Value {
            serde_json::from_slice(&fs::read(dir.path().join(format!("{id}.json"))).unwrap())
                .unwrap()
        };
        assert_eq!(file(&image.id)["needs"], 2, "{}", file(&image.id));
        assert!(
            file(&plain.id).get("needs").is_none(),
            "{}",
            file(&plain.id)
        );
        drop(store);
        let (store, report) = Store::open(dir.path(), None, Default::default()).unwrap();
        assert!(report.unreadable.is_empty(), "{:?}", report.unreadable);
        assert_eq!(store.get(&image.id).unwrap(), image);
        assert_eq!(store.get(&plain.id).unwrap(), plain);
    }

    #[test]
    fn an_encrypted_volume_record_needs_format_3_and_reads_back_whole() {
        use crate::volume::state::record::Luks;
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path(), None, Default::default()).unwrap();
        let mut block = record("sealed");
        block.kind = VolumeKind::Block;
        block.encryption = Some(Luks { formatted: true });
        let block = store.put(block).unwrap();
        store.records.compact_now().unwrap();
        let json: serde_json::Value = serde_json::from_slice(
            &fs::read(dir.path().join(format!("{}.json", block.id))).unwrap(),
        )
        .unwrap();
        assert_eq!(json["needs"], 3, "{json}");
        assert_eq!(json["encryption"]["formatted"], true, "{json}");
        drop(store);
        let (store, report) = Store::open(dir.path(), None, Default::default()).unwrap();
        assert!(report.unreadable.is_empty(), "{:?}", report.unreadable);
        assert_eq!(store.get(&block.id).unwrap(), block);
    }
}
