//! Unit tests' API server: a kube `Client` whose every request a test's function answers, in
//! process, without a network or a listener.

use std::convert::Infallible;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, Response};
use kube::Client;

/// A client whose requests `answer(method, path, body)` answers.
pub fn client<F>(answer: F) -> Client
where
    F: Fn(&str, &str, &[u8]) -> Response<Full<Bytes>> + Clone + Send + Sync + 'static,
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
