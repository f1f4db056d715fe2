//! The one place a Kubernetes client is made: in-cluster (the service account's token and CA),
//! else $KUBECONFIG.

use kube::Client;

/// Whether the client repeats a call the API server asks it to repeat later (429, 503).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retries {
    /// kube's default: repeated, with the server's Retry-After.
    On,
    /// Never: for callers whose next round is the retry, and who must see a refusal (a
    /// PodDisruptionBudget's 429 would otherwise be repeated for minutes inside one call).
    Off,
}

/// A client for this process's credentials.
pub async fn make(retries: Retries) -> Result<Client, kube::Error> {
    let mut config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    if retries == Retries::Off {
        config.default_retry = false;
    }
    Client::try_from(config)
}

/// Runs a command's `work` on a runtime of its own; a runtime that cannot be made is an error
/// like the command's.
pub fn block_on<T>(
    work: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| err.to_string())?
        .block_on(work)
}
