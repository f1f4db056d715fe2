//! A directory of small JSON records, one file per object, with an in-memory index, so every
//! lookup is O(1) or O(log n) whatever the number of objects. Volume records (`store`) and
//! snapshot records (`snapshot`) both live in one.
//!
//! Every change is committed by one entry in the state's journal (`journal`: one flush, shared
//! by concurrent commits) and is then visible in memory. The record's file is written back
//! later, by the journal's compaction (atomically, temp file → rename, then flushed before the
//! journal generation is dropped): while the driver runs, a file may lag its record by up to
//! one compaction interval, and loading replays the journal over the files. Keeping the file
//! write off the commit path keeps creates and deletes at one append and one flush, with no
//! inode allocated in the state directory.
//!
//! Files of older versions (one durably written JSON per record, no journal) load unchanged:
//! they are what a compacted state looks like. A record that needs a newer format than this
//! release reads (see `format`) stops the load before anything is changed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Display;
use std::fs;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::files::remove_file_if_present;
use super::format::{self, Refusals};
use super::journal::{self, Appended, Entry, Journal, Op};

pub const RECORD_SUFFIX: &str = ".json";
pub const TEMP_SUFFIX: &str = ".tmp";

/// What a record type tells the directory about itself.
pub trait Record: Serialize + DeserializeOwned + std::fmt::Debug {
    type Id: Ord + Clone + Display + std::hash::Hash + std::fmt::Debug;
    fn id(&self) -> &Self::Id;
    /// The CO's idempotency key.
    fn name(&self) -> &str;
    fn parse_id(text: &str) -> Option<Self::Id>;
    /// The lowest state format a reader needs to read this record correctly (see `format`).
    fn needs(&self) -> u32 {
        1
    }
}

#[derive(Debug)]
pub struct Records<R: Record> {
    dir: PathBuf,
    journal: Journal,
    index: RwLock<Index<R>>,
}

#[derive(Debug)]
struct Index<R: Record> {
    by_id: BTreeMap<R::Id, Arc<R>>,
    by_name: HashMap<String, R::Id>,
    /// Records found at load whose files cannot be read (until rewritten or removed).
    unreadable: HashSet<R::Id>,
}

/// The record files as found, before anything was changed (see `Records::read_on_disk`).
struct OnDisk<R: Record> {
    /// Each record file's id, and its record or why it cannot be read.
    records: Vec<(R::Id, Result<R, String>)>,
    /// Left by writes a crash interrupted, to remove.
    temp_files: Vec<PathBuf>,
}

/// What loading found besides good records.
#[derive(Debug)]
pub struct Loaded<Id> {
    /// Records that exist but cannot be read: their objects must be left alone, not treated
    /// as orphans.
    pub unreadable: Vec<(Id, String)>,
    /// Leftover temp files from an interrupted write, removed.
    pub removed_temp_files: usize,
    /// Records created by an entry still in the journal (not compacted yet): recent enough
    /// that a power loss may have taken their (unsynced) data with it.
    pub created_recently: HashSet<Id>,
    /// Records removed by an entry still in the journal: data of theirs found at start was
    /// deleted by the CO (its removal may not have reached the disk), not lost.
    pub removed_recently: HashSet<Id>,
    /// Torn journal tails ignored (already logged).
    pub torn: Vec<String>,
}

impl<R: Record> Records<R> {
    /// Loads every record in `dir` (created if missing) and replays the journal `name` of
    /// `journal_dir` over them; other files are left alone. Refuses records this release
    /// cannot read before it changes anything (`read_on_disk`, which reads each file once).
    pub fn open(
        dir: &Path,
        journal_dir: &Path,
        name: &str,
        options: journal::Options,
    ) -> io::Result<(Records<R>, Loaded<R::Id>)> {
        let on_disk = Self::read_on_disk(dir, journal_dir, name)?;
        fs::create_dir_all(dir)?;
        let mut index = Index {
            by_id: BTreeMap::new(),
            by_name: HashMap::new(),
            unreadable: HashSet::new(),
        };
        let mut loaded = Loaded {
            unreadable: Vec::new(),
            removed_temp_files: 0,
            created_recently: HashSet::new(),
            removed_recently: HashSet::new(),
            torn: Vec::new(),
        };
        for temp in &on_disk.temp_files {
            fs::remove_file(temp)?;
            loaded.removed_temp_files += 1;
        }
        // The files first: once the journal is open, its compaction may write them back.
        index.add_files(on_disk.records, &mut loaded);
        let options = journal::Options {
            write_back: Some(write_back::<R>(dir)),
            ..options
        };
        let (journal, replay) = Journal::open(journal_dir, name, dir, options)?;
        loaded.torn = replay.torn.clone();
        // Replay: the last entry of a record wins. The files catch up when the journal's
        // compaction writes these entries back.
        for entry in &replay.entries {
            index.replay(entry, name, &mut loaded)?;
        }
        index.unreadable = loaded.unreadable.iter().map(|(id, _)| id.clone()).collect();
        let records = Records {
            dir: dir.to_path_buf(),
            journal,
            index: RwLock::new(index),
        };
        Ok((records, loaded))
    }

    /// Refuses the records of `dir` and the journal `name` of `journal_dir` if one needs a
    /// newer format than this release reads, or the journal is of a newer version; reads
    /// everything, changes nothing. `open` does it first; callers opening several record sets
    /// check them all before opening any (opening changes files: temp files removed, the
    /// journal continued and compacted).
    pub fn check_format(dir: &Path, journal_dir: &Path, name: &str) -> io::Result<()> {
        Self::read_on_disk(dir, journal_dir, name).map(drop)
    }

    /// The record files of `dir` and the temp files of interrupted writes, read without
    /// changing anything, and refused if a record needs a newer format than this release
    /// reads: the newest journal entry of a record (what the load keeps), else its file.
    fn read_on_disk(dir: &Path, journal_dir: &Path, name: &str) -> io::Result<OnDisk<R>> {
        let replay = journal::peek(journal_dir, name)?;
        let mut newest: HashMap<&str, &Entry> = HashMap::new();
        for entry in &replay.entries {
            newest.insert(&entry.id, entry);
        }
        let mut refusals = Refusals::default();
        let mut on_disk = OnDisk {
            records: Vec::new(),
            temp_files: Vec::new(),
        };
        let files = match fs::read_dir(dir) {
            Err(err) if err.kind() == io::ErrorKind::NotFound => None,
            files => Some(files?),
        };
        for file in files.into_iter().flatten() {
            let file = file?;
            let file_name = file.file_name();
            let Some(file_name) = file_name.to_str() else {
                continue;
            };
            if file_name.ends_with(TEMP_SUFFIX) {
                on_disk.temp_files.push(file.path());
                continue;
            }
            let Some(text) = file_name.strip_suffix(RECORD_SUFFIX) else {
                continue;
            };
            let Some(id) = R::parse_id(text) else {
                continue;
            };
            let path = file.path();
            let parsed = fs::read(&path).map_err(|e| e.to_string()).and_then(|json| {
                if !newest.contains_key(text) {
                    refusals.check(|| path.display().to_string(), &json);
                }
                serde_json::from_slice::<R>(&json).map_err(|e| e.to_string())
            });
            on_disk.records.push((id, parsed));
        }
        for entry in newest.values().filter(|e| e.op != Op::Remove) {
            let place = || {
                format!(
                    "the record of {} in the journal {}/{name}.*",
                    entry.id,
                    journal_dir.display()
                )
            };
            refusals.check(place, &entry.json);
        }
        refusals.into_result()?;
        Ok(on_disk)
    }

    /// Whether the journal can take commits (see `Journal::health`).
    pub fn journal_health(&self) -> Result<(), String> {
        self.journal.health()
    }

    pub fn journal_stats(&self) -> journal::Stats {
        self.journal.stats()
    }

    /// The journal's flush count (for tests and measurements).
    pub fn flushes(&self) -> u64 {
        self.journal.flushes()
    }

    /// Compacts the journal now, in this thread.
    #[cfg(test)]
    pub fn compact_now(&self) -> io::Result<()> {
        self.journal.compact_now()
    }

    pub fn get(&self, id: &R::Id) -> Option<Arc<R>> {
        self.read_index().by_id.get(id).cloned()
    }

    pub fn find_by_name(&self, name: &str) -> Option<Arc<R>> {
        let index = self.read_index();
        let id = index.by_name.get(name)?;
        index.by_id.get(id).cloned()
    }

    /// Whether a record exists for `id`, readable or not.
    pub fn has_record_file(&self, id: &R::Id) -> bool {
        let index = self.read_index();
        index.by_id.contains_key(id) || index.unreadable.contains(id)
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
        self.write(&record)?;
        self.write_index().insert(record);
        Ok(())
    }

    /// Makes `record` visible without writing it (its durable part did not change).
    pub fn replace_in_memory(&self, record: Arc<R>) {
        self.write_index().insert(record);
    }

    /// Durably writes `durable` as its record, with the format it needs, leaving the index
    /// alone: one journal commit (the one flush; the file is written back by compaction, see
    /// the module comment). Callers serialize the writes of one record (operation guards).
    pub fn write(&self, durable: &R) -> io::Result<()> {
        let id = durable.id();
        let json = serde_json::to_vec_pretty(&format::stamped(durable, durable.needs()))?;
        let (exists, unreadable) = {
            let index = self.read_index();
            (index.by_id.contains_key(id), index.unreadable.contains(id))
        };
        let op = if exists || unreadable {
            Op::Update
        } else {
            Op::Create
        };
        self.journal.commit(Entry {
            op,
            id: id.to_string(),
            json,
        })?;
        if unreadable {
            self.write_index().unreadable.remove(id);
        }
        Ok(())
    }

    /// Durably removes the record of `id`; a missing record is fine (and costs no flush).
    pub fn remove(&self, id: &R::Id) -> io::Result<()> {
        let removal = self.start_remove(id)?;
        self.finish_remove(id, removal)
    }

    /// The first half of `remove`: commits the removal of `id`'s record to the journal and
    /// starts its disk write, leaving the record visible; the caller may work meanwhile, then
    /// must `finish_remove`. Committed means final: the next flush makes it durable.
    pub fn start_remove(&self, id: &R::Id) -> io::Result<Option<Appended>> {
        if !self.has_record_file(id) {
            return Ok(None);
        }
        self.journal
            .append(Entry {
                op: Op::Remove,
                id: id.to_string(),
                json: Vec::new(),
            })
            .map(Some)
    }

    /// Waits until the removal started by `start_remove` is durable, then drops the record.
    pub fn finish_remove(&self, id: &R::Id, removal: Option<Appended>) -> io::Result<()> {
        if let Some(appended) = removal {
            self.journal.wait(appended)?;
        }
        let mut index = self.write_index();
        if let Some(record) = index.by_id.remove(id) {
            index.by_name.remove(record.name());
        }
        index.unreadable.remove(id);
        Ok(())
    }

    /// A file beside the record of `id`, e.g. `<id>.publications.json`.
    pub fn side_path(&self, id: &R::Id, suffix: &str) -> PathBuf {
        file_of(&self.dir, id, suffix)
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

    /// Indexes the record files as read at load; those that cannot be used go to `loaded`.
    fn add_files(&mut self, records: Vec<(R::Id, Result<R, String>)>, loaded: &mut Loaded<R::Id>) {
        for (id, parsed) in records {
            match parsed {
                Ok(record) if *record.id() == id => self.insert(Arc::new(record)),
                Ok(record) => loaded.unreadable.push((
                    id.clone(),
                    format!("record names a different id {}", record.id()),
                )),
                Err(err) => loaded.unreadable.push((id.clone(), err)),
            }
        }
    }

    /// Applies one entry of the journal `name` over the index, noting in `loaded` what it
    /// says of its record (readable again, created or removed recently).
    fn replay(&mut self, entry: &Entry, name: &str, loaded: &mut Loaded<R::Id>) -> io::Result<()> {
        let Some(id) = R::parse_id(&entry.id) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the journal {name} names an invalid id {:?}", entry.id),
            ));
        };
        loaded.unreadable.retain(|(bad, _)| *bad != id);
        if let Some(old) = self.by_id.remove(&id) {
            self.by_name.remove(old.name());
        }
        match entry.op {
            Op::Create | Op::Update => {
                match serde_json::from_slice::<R>(&entry.json) {
                    Ok(record) if *record.id() == id => self.insert(Arc::new(record)),
                    Ok(_) => loaded
                        .unreadable
                        .push((id.clone(), "journal entry names another id".into())),
                    Err(err) => loaded
                        .unreadable
                        .push((id.clone(), format!("journal entry: {err}"))),
                }
                if entry.op == Op::Create {
                    loaded.created_recently.insert(id.clone());
                }
                loaded.removed_recently.remove(&id);
            }
            Op::Remove => {
                loaded.created_recently.remove(&id);
                loaded.removed_recently.insert(id.clone());
            }
        }
        Ok(())
    }
}

/// How compaction writes a journal entry back into the record files of `dir`: atomically
/// (temp → rename), without flush (compaction flushes them all at once).
fn write_back<R: Record>(dir: &Path) -> journal::WriteBack {
    let dir = dir.to_path_buf();
    Arc::new(move |entry: &Entry| {
        // Ids become file names: only ours (the journal is ours too, but checked anyway).
        if R::parse_id(&entry.id).is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the journal names an invalid id {:?}", entry.id),
            ));
        }
        let path = file_of(&dir, &entry.id, RECORD_SUFFIX);
        match entry.op {
            Op::Remove => remove_file_if_present(&path),
            Op::Create | Op::Update => {
                let temp = temp_file_of(&dir, &entry.id, RECORD_SUFFIX);
                fs::write(&temp, &entry.json)?;
                fs::rename(&temp, &path)
            }
        }
    })
}

fn file_of(dir: &Path, id: &impl Display, suffix: &str) -> PathBuf {
    dir.join(format!("{id}{suffix}"))
}

fn temp_file_of(dir: &Path, id: &impl Display, suffix: &str) -> PathBuf {
    dir.join(format!(".{id}{suffix}{TEMP_SUFFIX}"))
}

#[cfg(test)]
mod tests {
    use super::super::files::read_json;
    use super::*;
    use crate::volume::state::journal_file;
    use serde::Deserialize;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Thing {
        id: String,
        name: String,
        version: u32,
    }

    impl Record for Thing {
        type Id = String;
        fn id(&self) -> &String {
            &self.id
        }
        fn name(&self) -> &str {
            &self.name
        }
        fn parse_id(text: &str) -> Option<String> {
            text.starts_with("t-").then(|| text.to_string())
        }
        /// Versions from 100 on stand for what came with format 2.
        fn needs(&self) -> u32 {
            if self.version >= 100 { 2 } else { 1 }
        }
    }

    fn thing(id: &str, version: u32) -> Arc<Thing> {
        Arc::new(Thing {
            id: format!("t-{id}"),
            name: format!("name-{id}"),
            version,
        })
    }

    fn manual() -> journal::Options {
        journal::Options {
            background: false,
            ..Default::default()
        }
    }

    fn open(dir: &Path) -> (Records<Thing>, Loaded<String>) {
        Records::open(dir, &dir.join("journal"), "things", manual()).unwrap()
    }

    fn state(records: &Records<Thing>) -> Vec<Thing> {
        records.all().iter().map(|t| (**t).clone()).collect()
    }

    /// A kill -9: nothing of `Drop` runs.
    fn crash(records: Records<Thing>) {
        std::mem::forget(records);
    }

    /// What a power loss may do to record files never flushed: lose them all.
    fn lose_unflushed_files(dir: &Path) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "json") {
                fs::write(&path, b"").unwrap();
            }
        }
    }

    /// Puts a, b and c (one per op, one flush each), updates a, removes b.
    fn changes(records: &Records<Thing>) -> Vec<Thing> {
        records.put(thing("a", 1)).unwrap();
        records.put(thing("b", 1)).unwrap();
        records.put(thing("c", 1)).unwrap();
        records.put(thing("a", 2)).unwrap();
        records.remove(&"t-b".to_string()).unwrap();
        assert_eq!(records.flushes(), 5, "one flush per change");
        vec![(*thing("a", 2)).clone(), (*thing("c", 1)).clone()]
    }

    #[test]
    fn the_journal_alone_restores_what_the_files_lost() {
        let dir = tempfile::tempdir().unwrap();
        let (records, _) = open(dir.path());
        let expected = changes(&records);
        crash(records);
        lose_unflushed_files(dir.path());
        let (records, loaded) = open(dir.path());
        assert_eq!(state(&records), expected);
        assert!(loaded.unreadable.is_empty(), "{:?}", loaded.unreadable);
        assert_eq!(
            loaded.created_recently,
            HashSet::from(["t-a".to_string(), "t-c".to_string()])
        );
        assert_eq!(loaded.removed_recently, HashSet::from(["t-b".to_string()]));
        // The files are repaired from the journal by its compaction.
        records.compact_now().unwrap();
        assert!(!dir.path().join("t-b.json").exists());
        let file: Thing = read_json(&dir.path().join("t-a.json")).unwrap();
        assert_eq!(file, expected[0]);
    }

    #[test]
    fn commits_write_no_file_and_compaction_writes_them_back() {
        let dir = tempfile::tempdir().unwrap();
        let (records, _) = open(dir.path());
        let expected = changes(&records);
        let files = || {
            let mut names: Vec<String> = fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n.ends_with(".json"))
                .collect();
            names.sort();
            names
        };
        assert!(files().is_empty(), "{:?}", files());
        // A removed record is gone at once, though its file (if any) waits for compaction.
        assert!(!records.has_record_file(&"t-b".to_string()));
        records.compact_now().unwrap();
        assert_eq!(files(), vec!["t-a.json", "t-c.json"]);
        let file: Thing = read_json(&dir.path().join("t-a.json")).unwrap();
        assert_eq!(file, expected[0]);
        records.remove(&"t-a".to_string()).unwrap();
        assert!(dir.path().join("t-a.json").exists());
        records.compact_now().unwrap();
        assert_eq!(files(), vec!["t-c.json"]);
    }

    #[test]
    fn an_unreadable_record_counts_until_removed() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("t-bad.json"), b"{ not json").unwrap();
        let (records, loaded) = open(dir.path());
        assert_eq!(loaded.unreadable.len(), 1);
        let bad = "t-bad".to_string();
        assert!(records.has_record_file(&bad) && records.get(&bad).is_none());
        records.remove(&bad).unwrap();
        assert!(!records.has_record_file(&bad));
        records.compact_now().unwrap();
        assert!(!dir.path().join("t-bad.json").exists());
    }

    #[test]
    fn a_crash_after_rotation_before_the_flush_keeps_every_change() {
        let dir = tempfile::tempdir().unwrap();
        let (records, _) = open(dir.path());
        let mut expected = changes(&records);
        // Step 1 of a compaction (a new generation), then more changes in it.
        records.journal.rotate_only().unwrap();
        records.put(thing("d", 1)).unwrap();
        expected.push((*thing("d", 1)).clone());
        crash(records);
        // Files written after the compaction's flush were never flushed.
        fs::write(dir.path().join("t-d.json"), b"").unwrap();
        let (records, loaded) = open(dir.path());
        assert_eq!(state(&records), expected);
        // The old generation is not compacted: its creates still count as recent.
        assert_eq!(loaded.created_recently.len(), 3);
    }

    #[test]
    fn after_a_compaction_the_files_alone_are_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let (records, _) = open(dir.path());
        let expected = changes(&records);
        records.compact_now().unwrap();
        crash(records);
        let (records, loaded) = open(dir.path());
        assert_eq!(state(&records), expected);
        assert!(loaded.created_recently.is_empty() && loaded.removed_recently.is_empty());
    }

    #[test]
    fn old_layout_without_a_journal_loads_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let old = thing("old", 7);
        fs::write(
            dir.path().join("t-old.json"),
            serde_json::to_vec_pretty(&*old).unwrap(),
        )
        .unwrap();
        let (records, loaded) = open(dir.path());
        assert_eq!(state(&records), vec![(*old).clone()]);
        assert!(loaded.created_recently.is_empty());
        // Changed through the journal from then on.
        records.put(thing("old", 8)).unwrap();
        crash(records);
        let (records, _) = open(dir.path());
        assert_eq!(state(&records), vec![(*thing("old", 8)).clone()]);
    }

    #[test]
    fn a_torn_last_change_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let (records, _) = open(dir.path());
        records.put(thing("a", 1)).unwrap();
        records.put(thing("a", 2)).unwrap();
        crash(records);
        // A power loss in the middle of the second commit: its entry is torn, its file lost.
        let journal = dir.path().join("journal");
        let last = fs::read_dir(&journal)
            .unwrap()
            .map(|e| e.unwrap().path())
            .max()
            .unwrap();
        journal_file::tear_last_entry(&last);
        fs::write(dir.path().join("t-a.json"), b"").unwrap();
        let (records, loaded) = open(dir.path());
        assert_eq!(state(&records), vec![(*thing("a", 1)).clone()]);
        assert_eq!(loaded.torn.len(), 1);
    }

    /// Every file under `dir` and its bytes.
    fn files_under(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut files = BTreeMap::new();
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files.extend(files_under(&path));
            } else {
                files.insert(path.clone(), fs::read(&path).unwrap());
            }
        }
        files
    }

    const FROM_THE_FUTURE: &str = r#"{"id":"t-new","name":"n","version":1,"needs":9,"written_by":"stickyvol 9.0.0 (commit f00)"}"#;

    #[test]
    fn a_record_file_needing_a_newer_format_stops_the_open_with_nothing_changed() {
        let dir = tempfile::tempdir().unwrap();
        let (records, _) = open(dir.path());
        records.put(thing("a", 1)).unwrap();
        records.compact_now().unwrap();
        records.put(thing("b", 1)).unwrap();
        crash(records);
        fs::write(dir.path().join("t-new.json"), FROM_THE_FUTURE).unwrap();
        // Loading would remove it, and continue the journal.
        fs::write(dir.path().join(".t-a.json.tmp"), b"half").unwrap();
        let before = files_under(dir.path());
        let err =
            Records::<Thing>::open(dir.path(), &dir.path().join("journal"), "things", manual())
                .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let message = err.to_string();
        assert!(
            message.contains("t-new.json needs state format 9"),
            "{message}"
        );
        assert!(
            message.contains("stickyvol 9.0.0 (commit f00)"),
            "{message}"
        );
        assert_eq!(files_under(dir.path()), before);
    }

    #[test]
    fn a_journal_entry_needing_a_newer_format_stops_the_open_with_nothing_changed() {
        let dir = tempfile::tempdir().unwrap();
        let (records, _) = open(dir.path());
        records.put(thing("a", 1)).unwrap();
        records
            .journal
            .commit(Entry {
                op: Op::Update,
                id: "t-new".into(),
                json: FROM_THE_FUTURE.as_bytes().to_vec(),
            })
            .unwrap();
        crash(records);
        let before = files_under(dir.path());
        let err =
            Records::<Thing>::open(dir.path(), &dir.path().join("journal"), "things", manual())
                .unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("the record of t-new in the journal"),
            "{message}"
        );
        assert_eq!(files_under(dir.path()), before);
        // Removed later in the journal, it is no longer there to misread.
        let (records, _) = {
            let journal = dir.path().join("journal");
            let (journal, _) = Journal::open(&journal, "things", dir.path(), manual()).unwrap();
            journal
                .commit(Entry {
                    op: Op::Remove,
                    id: "t-new".into(),
                    json: Vec::new(),
                })
                .unwrap();
            std::mem::forget(journal);
            open(dir.path())
        };
        assert_eq!(state(&records), vec![(*thing("a", 1)).clone()]);
    }

    #[test]
    fn a_record_file_is_judged_by_the_journal_entry_that_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("t-new.json"), FROM_THE_FUTURE).unwrap();
        let journal = dir.path().join("journal");
        let (journal, _) = Journal::open(&journal, "things", dir.path(), manual()).unwrap();
        // Written over by a release that reads it (the load keeps this entry, not the file).
        let replacement = Thing {
            id: "t-new".into(),
            name: "n".into(),
            version: 2,
        };
        journal
            .commit(Entry {
                op: Op::Update,
                id: "t-new".into(),
                json: serde_json::to_vec(&replacement).unwrap(),
            })
            .unwrap();
        std::mem::forget(journal);
        let (records, _) = open(dir.path());
        assert_eq!(state(&records), vec![replacement]);
    }

    #[test]
    fn the_format_a_record_needs_is_written_and_kept_by_compaction() {
        let dir = tempfile::tempdir().unwrap();
        let (records, _) = open(dir.path());
        records.put(thing("old", 1)).unwrap();
        records.put(thing("new", 100)).unwrap();
        records.compact_now().unwrap();
        let file = |id: &str| -> serde_json::Value {
            serde_json::from_slice(&fs::read(dir.path().join(format!("t-{id}.json"))).unwrap())
                .unwrap()
        };
        assert_eq!(file("new")["needs"], 2);
        assert_eq!(file("new")["written_by"], format::WRITER);
        assert!(file("old").get("needs").is_none(), "{}", file("old"));
        drop(records);
        // Read back by this release, which reads format 2.
        let (records, loaded) = open(dir.path());
        assert!(loaded.unreadable.is_empty(), "{:?}", loaded.unreadable);
        assert_eq!(
            state(&records),
            vec![(*thing("new", 100)).clone(), (*thing("old", 1)).clone()]
        );
    }
}
