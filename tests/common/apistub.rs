//! A stub Kubernetes API server for tests of the driver's API clients (orphan check, overflow
//! check): plain HTTP on a free port of 127.0.0.1, answering each request with what a test's
//! handler returns, and a kubeconfig pointing at it (`Options::kubeconfig`).

use std::convert::Infallible;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// Answers (status code, JSON body) to a request's method, path (with its query) and body.
pub type Handler = Arc<dyn Fn(&str, &str, &[u8]) -> (u16, Value) + Send + Sync>;

/// A Kubernetes `Status` of a failure.
pub fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": reason, "reason": reason, "code": code})
}

/// What a handler answers to a watch that has nothing to tell: the stub holds the request a
/// second, as a quiet API server holds a watch, then ends it (an answer at once would have the
/// client watch again at once, in a loop).
pub fn idle_watch() -> (u16, Value) {
    (IDLE_WATCH, Value::Null)
}

const IDLE_WATCH: u16 = 0;

/// A Kubernetes `Status` of a success.
pub fn success() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200})
}

async fn answer(
    handler: Handler,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().to_string();
    let path = req
        .uri()
        .path_and_query()
        .map_or_else(String::new, ToString::to_string);
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let (code, reply) = handler(&method, &path, &body);
    if code == IDLE_WATCH {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        return Ok(Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::new()))
            .unwrap());
    }
    Ok(Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(reply.to_string())))
        .unwrap())
}

/// Serves `handler` for the rest of the test; the kubeconfig (written into `dir`) that reaches it.
pub async fn serve(handler: Handler, dir: &Path) -> PathBuf {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| answer(handler.clone(), req));
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let kubeconfig = dir.join("kubeconfig");
    fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: stub\n  cluster: {{server: \"http://{address}\"}}\n\
             users:\n- name: stub\n  user: {{}}\ncontexts:\n- name: stub\n  context: {{cluster: stub, user: stub}}\n\
             current-context: stub\n"
        ),
    )
    .unwrap();
    kubeconfig
}
