//! The simulated API server over HTTP: lists (whole from the "watch cache" for
//! resourceVersion=0, which ignores `limit` as the real one does; otherwise pages of `limit`
//! with `continue`), watches (replayed from a resourceVersion, then live, with bookmarks, ended
//! after `timeoutSeconds`; too old a resourceVersion is 410 Gone), both narrowed by a
//! `metadata.name` field selector and a label selector (`selector`), GETs, and the writes the
//! controller and the node plugin make. One listener per client, each counting its requests
//! and the bytes it was sent.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::selector::Selector;
use super::store::{Change, Store};

/// Resources whose path segment is followed by an object's name.
const RESOURCES: &[&str] = &[
    "nodes",
    "persistentvolumes",
    "persistentvolumeclaims",
    "pods",
    "statefulsets",
    "storageclasses",
    "leases",
    "events",
    "configmaps",
];
/// How often a watch that asked for them gets a bookmark (the API server: about a minute).
const BOOKMARK_EVERY: Duration = Duration::from_secs(30);

/// What one client asked and was sent.
#[derive(Debug, Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
}

impl Counters {
    pub fn read(&self) -> (u64, u64) {
        (
            self.requests.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
}

type Body = BoxBody<Bytes, Infallible>;

/// Serves `store` on a free port of 127.0.0.1 until the process ends.
pub async fn serve(store: Arc<Store>) -> std::io::Result<(SocketAddr, Arc<Counters>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let counters = Arc::new(Counters::default());
    let counted = counters.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (store, counters) = (store.clone(), counted.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req| answer(store.clone(), counters.clone(), req));
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((address, counters))
}

/// A request's path split into its collection and object name, and its query.
struct Target {
    collection: String,
    name: Option<String>,
    query: Vec<(String, String)>,
}

impl Target {
    fn parse(path_and_query: &str) -> Target {
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        let parts: Vec<&str> = path.split('/').collect();
        let named = parts.len() >= 2 && RESOURCES.contains(&parts[parts.len() - 2]);
        let (collection, name) = if named {
            (
                parts[..parts.len() - 1].join("/"),
                Some(parts[parts.len() - 1].to_string()),
            )
        } else {
            (path.to_string(), None)
        };
        let query = query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), decode(v)))
            .collect();
        Target {
            collection,
            name,
            query,
        }
    }

    fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Percent-decoding of a query value.
fn decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": reason, "reason": reason, "code": code})
}

fn full(counters: &Counters, code: u16, body: Bytes) -> Response<Body> {
    counters
        .bytes
        .fetch_add(body.len() as u64, Ordering::Relaxed);
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(body).boxed())
        .unwrap()
}

fn json_reply(counters: &Counters, code: u16, value: &Value) -> Response<Body> {
    full(counters, code, Bytes::from(value.to_string()))
}

async fn answer(
    store: Arc<Store>,
    counters: Arc<Counters>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    counters.requests.fetch_add(1, Ordering::Relaxed);
    let method = req.method().to_string();
    let target = Target::parse(
        &req.uri()
            .path_and_query()
            .map_or_else(String::new, ToString::to_string),
    );
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if method != "GET" {
        let path = match &target.name {
            Some(name) => format!("{}/{name}", target.collection),
            None => target.collection.clone(),
        };
        store.note_write(&method, &path);
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let reply = match (method.as_str(), target.name.clone()) {
        ("GET", None) if matches!(target.param("watch"), Some("true" | "1")) => {
            watch(&store, &counters, &target)
        }
        ("GET", None) => list(&store, &counters, &target),
        ("GET", Some(name)) => match store.get(&target.collection, &name) {
            Some(object) => json_reply(&counters, 200, &object),
            None => json_reply(&counters, 404, &status(404, "NotFound")),
        },
        ("POST", None) => create(&store, &counters, &target.collection, body),
        ("PUT", Some(name)) => replace(&store, &counters, &target.collection, &name, body),
        ("PATCH", Some(name)) => patch(&store, &counters, &target.collection, &name, body),
        ("DELETE", Some(name)) => delete(&store, &counters, &target.collection, &name, &body),
        _ => json_reply(&counters, 405, &status(405, "MethodNotAllowed")),
    };
    Ok(reply)
}

fn field_name(target: &Target) -> Option<String> {
    target
        .param("fieldSelector")
        .and_then(|s| s.strip_prefix("metadata.name="))
        .map(str::to_string)
}

fn list(store: &Store, counters: &Counters, target: &Target) -> Response<Body> {
    let after = target.param("continue").filter(|c| !c.is_empty());
    let from_cache = target.param("resourceVersion") == Some("0") && after.is_none();
    let limit = target
        .param("limit")
        .and_then(|l| l.parse().ok())
        .filter(|_| !from_cache);
    let filter = Filter::of(target);
    let page = store.page(&target.collection, after, limit, |name, object| {
        filter.selects(name, object)
    });
    let mut out = Vec::with_capacity(page.items.iter().map(|i| i.len() + 1).sum::<usize>() + 128);
    let cont = page.more_after.unwrap_or_default();
    out.extend_from_slice(
        format!(
            "{{\"kind\":\"List\",\"apiVersion\":\"v1\",\"metadata\":{{\"resourceVersion\":\"{}\",\"continue\":\"{cont}\"}},\"items\":[",
            page.version
        )
        .as_bytes(),
    );
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item);
    }
    out.extend_from_slice(b"]}");
    full(counters, 200, Bytes::from(out))
}

fn event_line(kind: &str, object: &[u8]) -> Bytes {
    let mut line = Vec::with_capacity(object.len() + 32);
    line.extend_from_slice(format!("{{\"type\":\"{kind}\",\"object\":").as_bytes());
    line.extend_from_slice(object);
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

fn gone_line() -> Bytes {
    event_line("ERROR", status(410, "Expired").to_string().as_bytes())
}

fn watch(store: &Arc<Store>, counters: &Arc<Counters>, target: &Target) -> Response<Body> {
    let from: u64 = target
        .param("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| store.version());
    let timeout = target
        .param("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    let bookmarks = target.param("allowWatchBookmarks") == Some("true");
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let filter = Filter::of(target);
    tokio::spawn(stream_changes(
        store.clone(),
        counters.clone(),
        filter,
        from,
        bookmarks,
        timeout,
        tx,
    ));
    let body = StreamBody::new(
        tokio_stream::wrappers::ReceiverStream::new(rx)
            .map(|b| Ok::<_, Infallible>(Frame::data(b))),
    );
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(body))
        .unwrap()
}

/// What a list or watch asks for: its collection, a `metadata.name` field selector, a label
/// selector. A watch is told the changes of objects that match after the change (an object
/// that stops matching is not told as DELETED, as a real API server would).
struct Filter {
    collection: String,
    name: Option<String>,
    labels: Selector,
}

impl Filter {
    fn of(target: &Target) -> Filter {
        Filter {
            collection: target.collection.clone(),
            name: field_name(target),
            labels: Selector::parse(target.param("labelSelector").unwrap_or_default()),
        }
    }

    fn selects(&self, name: &str, object: &[u8]) -> bool {
        self.name.as_ref().is_none_or(|n| n == name) && self.labels.matches(object)
    }

    fn matches(&self, change: &Change) -> bool {
        change.collection == self.collection && self.selects(&change.name, &change.object)
    }
}

async fn stream_changes(
    store: Arc<Store>,
    counters: Arc<Counters>,
    filter: Filter,
    from: u64,
    bookmarks: bool,
    timeout: Duration,
    tx: mpsc::Sender<Bytes>,
) {
    let send = |line: Bytes| {
        counters
            .bytes
            .fetch_add(line.len() as u64, Ordering::Relaxed);
        tx.send(line)
    };
    let Some(mut subscription) = store.subscribe(from) else {
        let _ = send(gone_line()).await;
        return;
    };
    let mut last = from;
    for change in subscription.backlog.iter().filter(|c| filter.matches(c)) {
        last = change.version;
        if send(event_line(change.kind, &change.object)).await.is_err() {
            return;
        }
    }
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut bookmark = tokio::time::interval(BOOKMARK_EVERY);
    bookmark.tick().await;
    loop {
        let line = tokio::select! {
            _ = &mut deadline => return,
            _ = bookmark.tick(), if bookmarks => {
                let version = store.version();
                event_line("BOOKMARK", format!("{{\"kind\":\"Bookmark\",\"apiVersion\":\"v1\",\"metadata\":{{\"resourceVersion\":\"{version}\"}}}}").as_bytes())
            }
            change = subscription.live.recv() => match change {
                Ok(change) if change.version <= last || !filter.matches(&change) => continue,
                Ok(change) => {
                    last = change.version;
                    event_line(change.kind, &change.object)
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    let _ = send(gone_line()).await;
                    return;
                }
                Err(_) => return,
            },
        };
        if send(line).await.is_err() {
            return;
        }
    }
}

fn create(store: &Store, counters: &Counters, collection: &str, body: Value) -> Response<Body> {
    if collection.ends_with("/events") {
        return json_reply(counters, 201, &body);
    }
    let Some(name) = body["metadata"]["name"].as_str() else {
        return json_reply(counters, 422, &status(422, "Invalid"));
    };
    if store.get(collection, name).is_some() {
        return json_reply(counters, 409, &status(409, "AlreadyExists"));
    }
    let stored = store.put(collection, body);
    json_reply(counters, 201, &stored)
}

fn replace(
    store: &Store,
    counters: &Counters,
    collection: &str,
    name: &str,
    body: Value,
) -> Response<Body> {
    let Some(current) = store.get(collection, name) else {
        return json_reply(counters, 404, &status(404, "NotFound"));
    };
    let wanted = body["metadata"]["resourceVersion"].as_str();
    if wanted.is_some_and(|v| Some(v) != current["metadata"]["resourceVersion"].as_str()) {
        return json_reply(counters, 409, &status(409, "Conflict"));
    }
    let stored = store.put(collection, body);
    json_reply(counters, 200, &stored)
}

/// A server-side apply (ConfigMaps: the body is the object) or a merge patch of finalizers.
fn patch(
    store: &Store,
    counters: &Counters,
    collection: &str,
    name: &str,
    body: Value,
) -> Response<Body> {
    let Some(mut current) = store.get(collection, name) else {
        if collection.ends_with("/configmaps") {
            let stored = store.put(collection, body);
            return json_reply(counters, 201, &stored);
        }
        return json_reply(counters, 404, &status(404, "NotFound"));
    };
    if collection.ends_with("/configmaps") {
        let stored = store.put(collection, body);
        return json_reply(counters, 200, &stored);
    }
    if let Some(finalizers) = body["metadata"].get("finalizers") {
        current["metadata"]["finalizers"] = finalizers.clone();
    }
    let done = !current["metadata"]["deletionTimestamp"].is_null()
        && current["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty());
    if done {
        store.remove(collection, name);
        return json_reply(counters, 200, &current);
    }
    let stored = store.put(collection, current);
    json_reply(counters, 200, &stored)
}

fn delete(
    store: &Store,
    counters: &Counters,
    collection: &str,
    name: &str,
    body: &Value,
) -> Response<Body> {
    let Some(mut current) = store.get(collection, name) else {
        return json_reply(counters, 404, &status(404, "NotFound"));
    };
    let uid = body["preconditions"]["uid"].as_str();
    if uid.is_some_and(|u| Some(u) != current["metadata"]["uid"].as_str()) {
        return json_reply(counters, 409, &status(409, "Conflict"));
    }
    let held = current["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty());
    if held {
        current["metadata"]["deletionTimestamp"] = json!("2026-11-27T12:00:00Z");
        let stored = store.put(collection, current);
        return json_reply(counters, 200, &stored);
    }
    store.remove(collection, name);
    json_reply(counters, 200, &current)
}
