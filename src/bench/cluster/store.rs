//! The simulated API server's objects: collections of serialized objects by name, one
//! resourceVersion counter for all, and a bounded log of changes that watches replay from and
//! are told of, as etcd and the watch cache keep them.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hyper::body::Bytes;
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// How many changes a watch may start behind (older ones answer 410 Gone, and the client lists
/// again), like the API server's watch cache window.
const LOG_LENGTH: usize = 50_000;

/// A change, as a watch event's type and object.
#[derive(Debug, Clone)]
pub struct Change {
    pub version: u64,
    pub collection: String,
    pub name: String,
    pub kind: &'static str,
    pub object: Bytes,
}

/// A write the clients made, and when (the reaction times are measured from these).
#[derive(Debug, Clone)]
pub struct Write {
    pub at: Instant,
    pub method: String,
    pub path: String,
}

#[derive(Default)]
struct State {
    version: u64,
    /// Collection path (e.g. /api/v1/nodes) → objects by name, serialized.
    collections: HashMap<String, BTreeMap<String, Bytes>>,
    log: VecDeque<Arc<Change>>,
    writes: Vec<Write>,
}

/// One page of a list.
pub struct Page {
    pub version: u64,
    pub items: Vec<Bytes>,
    /// The name to continue after, when more remain.
    pub more_after: Option<String>,
}

/// What a watch starts with: the changes since its resourceVersion and the live ones to come,
/// or None when its resourceVersion is older than the log (410 Gone).
pub struct Subscription {
    pub backlog: Vec<Arc<Change>>,
    pub live: broadcast::Receiver<Arc<Change>>,
}

pub struct Store {
    state: Mutex<State>,
    changes: broadcast::Sender<Arc<Change>>,
}

impl Store {
    pub fn new() -> Store {
        Store {
            state: Mutex::new(State::default()),
            changes: broadcast::channel(65_536).0,
        }
    }

    pub fn version(&self) -> u64 {
        self.state.lock().unwrap().version
    }

    /// Creates or replaces `object` in `collection`, at a new resourceVersion, telling watches.
    /// Returns the object as stored.
    pub fn put(&self, collection: &str, mut object: Value) -> Value {
        let mut state = self.state.lock().unwrap();
        state.version += 1;
        let version = state.version;
        object["metadata"]["resourceVersion"] = json!(version.to_string());
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let bytes = Bytes::from(object.to_string());
        let objects = state.collections.entry(collection.to_string()).or_default();
        let kind = match objects.insert(name.clone(), bytes.clone()) {
            Some(_) => "MODIFIED",
            None => "ADDED",
        };
        self.record(&mut state, collection, name, kind, bytes);
        object
    }

    /// Removes object `name`, telling watches; the object as it was.
    pub fn remove(&self, collection: &str, name: &str) -> Option<Value> {
        let mut state = self.state.lock().unwrap();
        let old = state.collections.get_mut(collection)?.remove(name)?;
        state.version += 1;
        let mut object: Value = serde_json::from_slice(&old).ok()?;
        object["metadata"]["resourceVersion"] = json!(state.version.to_string());
        let bytes = Bytes::from(object.to_string());
        self.record(&mut state, collection, name.to_string(), "DELETED", bytes);
        Some(object)
    }

    fn record(
        &self,
        state: &mut State,
        collection: &str,
        name: String,
        kind: &'static str,
        object: Bytes,
    ) {
        let change = Arc::new(Change {
            version: state.version,
            collection: collection.to_string(),
            name,
            kind,
            object,
        });
        if state.log.len() == LOG_LENGTH {
            state.log.pop_front();
        }
        state.log.push_back(change.clone());
        let _ = self.changes.send(change);
    }

    pub fn get(&self, collection: &str, name: &str) -> Option<Value> {
        let state = self.state.lock().unwrap();
        let bytes = state.collections.get(collection)?.get(name)?;
        serde_json::from_slice(bytes).ok()
    }

    /// Up to `limit` objects (all: None) after `after`, of those `keep` takes (by name and
    /// serialized object: the list's selectors).
    pub fn page(
        &self,
        collection: &str,
        after: Option<&str>,
        limit: Option<usize>,
        keep: impl Fn(&str, &[u8]) -> bool,
    ) -> Page {
        let state = self.state.lock().unwrap();
        let empty = BTreeMap::new();
        let objects = state.collections.get(collection).unwrap_or(&empty);
        let mut items = Vec::new();
        let mut last = None;
        let range = objects.range::<str, _>((
            after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded),
            std::ops::Bound::Unbounded,
        ));
        let mut more_after = None;
        for (name, bytes) in range.filter(|(name, bytes)| keep(name, bytes)) {
            if limit.is_some_and(|l| items.len() >= l) {
                more_after = last;
                break;
            }
            items.push(bytes.clone());
            last = Some(name.clone());
        }
        Page {
            version: state.version,
            items,
            more_after,
        }
    }

    /// The changes after `version` and those to come; None when `version` is out of the log.
    pub fn subscribe(&self, version: u64) -> Option<Subscription> {
        let state = self.state.lock().unwrap();
        let oldest = state.log.front().map_or(state.version, |c| c.version - 1);
        if version < oldest {
            return None;
        }
        let backlog = state
            .log
            .iter()
            .filter(|c| c.version > version)
            .cloned()
            .collect();
        Some(Subscription {
            backlog,
            live: self.changes.subscribe(),
        })
    }

    pub fn note_write(&self, method: &str, path: &str) {
        let mut state = self.state.lock().unwrap();
        state.writes.push(Write {
            at: Instant::now(),
            method: method.to_string(),
            path: path.to_string(),
        });
    }

    /// The first write of `method` on `path` made at or after `since`.
    pub fn written(&self, method: &str, path: &str, since: Instant) -> Option<Instant> {
        let state = self.state.lock().unwrap();
        state
            .writes
            .iter()
            .find(|w| w.at >= since && w.method == method && w.path == path)
            .map(|w| w.at)
    }
}
