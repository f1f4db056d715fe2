//! Who may call the admin API: root on the node only. Exporting, importing or deleting any
//! volume is more than kubelet and the sidecars need: the admin API has its own socket, away
//! from the CSI socket's directory they mount, with mode 0600; and, should that mode be
//! loosened, the check here is on the caller's credentials, which the kernel recorded when it
//! connected (SO_PEERCRED), not on the socket's file mode.

use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Status};

/// The interceptor the admin service is served behind: it runs before every admin RPC, the
/// streaming ones included (before their first message is read).
#[allow(clippy::result_large_err)] // tonic's interceptor signature
pub fn root_only(request: Request<()>) -> Result<Request<()>, Status> {
    check(request.extensions().get::<UdsConnectInfo>())?;
    Ok(request)
}

/// Fails closed: a connection whose credentials are unknown is refused like a non-root one.
#[allow(clippy::result_large_err)]
fn check(connection: Option<&UdsConnectInfo>) -> Result<(), Status> {
    let Some(cred) = connection.and_then(|c| c.peer_cred) else {
        return Err(Status::permission_denied(
            "the stickyvol admin API is for root on the node only, and this caller's \
             credentials are unknown",
        ));
    };
    if cred.uid() == 0 {
        return Ok(());
    }
    let pid = cred
        .pid()
        .map_or_else(String::new, |pid| format!(", pid {pid}"));
    Err(Status::permission_denied(format!(
        "the stickyvol admin API is for root on the node only; this caller runs as uid {}{pid} \
         (run the command as root, e.g. with sudo or kubectl exec into the stickyvol container)",
        cred.uid()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn root_passes_and_unknown_callers_are_refused() {
        // Tests run as root: each end of a pair sees the other's (our) credentials.
        let (ours, _theirs) = tokio::net::UnixStream::pair().unwrap();
        let info = tonic::transport::server::Connected::connect_info(&ours);
        assert_eq!(
            info.peer_cred.map(|c| c.uid()),
            Some(0),
            "tests run as root"
        );
        assert!(check(Some(&info)).is_ok());

        let unknown = UdsConnectInfo {
            peer_addr: None,
            peer_cred: None,
        };
        for refused in [check(Some(&unknown)), check(None)] {
            let status = refused.unwrap_err();
            assert_eq!(status.code(), tonic::Code::PermissionDenied);
            assert!(status.message().contains("root"), "{}", status.message());
        }
    }

    #[tokio::test]
    async fn the_interceptor_reads_the_connection_from_the_extensions() {
        let (ours, _theirs) = tokio::net::UnixStream::pair().unwrap();
        let mut request = Request::new(());
        request
            .extensions_mut()
            .insert(tonic::transport::server::Connected::connect_info(&ours));
        assert!(root_only(request).is_ok());
        let status = root_only(Request::new(())).unwrap_err();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
    }
}
