//! Unit tests' API server: a kube `Client` whose every request a test's function answers, in
//! process, without a network or a listener, and the answers such a function gives.

use std::convert::Infallible;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, Response};
use kube::Client;
use serde_json::{Value, json};

/// What a test's function answers.
pub type Answer = Response<Full<Bytes>>;

/// A client whose requests `answer(method, path, body)` answers.
pub fn client<F>(answer: F) -> Client
where
    F: Fn(&str, &str, &[u8]) -> Answer + Clone + Send + Sync + 'static,
{
    let service = tower::service_fn(move |req: Request<kube::client::Body>| {
        let answer = answer.clone();
        async move {
            let method = req.method().to_string();
            let path = req.uri().path().to_string();
            let body = req.into_body().collect().await.unwrap().to_bytes();
            Ok::<_, Infallible>(answer(&method, &path, &body))
        }
    });
    Client::new(service, "default")
}

/// `body` as JSON with HTTP status `code`.
pub fn respond(code: u16, body: &Value) -> Answer {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// A failure as the API server words it: a `Status` with `reason` as its reason and message.
pub fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": reason, "reason": reason, "code": code})
}

/// A metadata list of Nodes with these names, as `GET /api/v1/nodes` answers a metadata request.
pub fn node_names(names: &[&str]) -> Value {
    let items: Vec<Value> = names
        .iter()
        .map(|name| json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": {"name": name}}))
        .collect();
    json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": {}, "items": items})
}
