//! The client side of the admin API: one channel to the driver's admin socket, the five calls, the
//! streaming of export and import through bounded buffers, and failures turned into messages
//! that say what to do.

use std::error::Error as StdError;
use std::fmt;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use prost::bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::Stream;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::admin_api::{self as api, admin_client::AdminClient, export_volume_response};
use crate::config::DEFAULT_ADMIN_SOCKET;
use crate::unix_channel;

/// How long `volumes` and `volume show` wait for an answer. Export, import and delete have no
/// deadline: they may run for hours, and removing a large volume takes a while.
pub const DESCRIBE_DEADLINE: Duration = Duration::from_secs(60);

/// How much of stdin one import message carries.
pub const IMPORT_CHUNK: usize = 1024 * 1024;

/// How many chunks may wait between stdin or stdout and the connection: memory stays bounded
/// (a few MiB) however large the volume.
const BUFFERED_CHUNKS: usize = 4;

/// The largest message we accept from the driver (a long volume list, a large export chunk).
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Why an admin command failed. Its `Display` is the message for the person at the terminal.
#[derive(Debug)]
pub enum AdminError {
    /// The socket could not be reached.
    Connect {
        socket: PathBuf,
        error: tonic::transport::Error,
    },
    /// The driver answered with an error (or the connection broke during the call).
    Status { socket: PathBuf, status: Status },
    /// Writing the export stream out failed.
    Output(io::Error),
    /// Reading the stream to import failed.
    Input(io::Error),
    /// The driver broke the protocol (a bug on one side or the other).
    Protocol(String),
    /// An export failed after part of its stream was written out.
    Incomplete {
        written: u64,
        cause: Box<AdminError>,
    },
}

impl fmt::Display for AdminError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdminError::Connect { socket, error } => match io_cause(error) {
                Some(io) => f.write_str(&connection_problem(socket, io)),
                None => write!(
                    f,
                    "cannot connect to {}: {}",
                    socket.display(),
                    error_chain(error)
                ),
            },
            AdminError::Status { socket, status } => f.write_str(&status_problem(socket, status)),
            AdminError::Output(err) if err.kind() == io::ErrorKind::BrokenPipe => f.write_str(
                "stdout was closed before the stream ended (did the command reading it fail?)",
            ),
            AdminError::Output(err) => write!(f, "writing the stream to stdout: {err}"),
            AdminError::Input(err) => write!(f, "reading the stream from stdin: {err}"),
            AdminError::Protocol(what) => write!(
                f,
                "{what} (the driver and this command do not agree on the protocol: \
                 are they the same version?)"
            ),
            AdminError::Incomplete { written, cause } => write!(
                f,
                "{cause}; the {written} bytes already written to stdout are an incomplete \
                 stream: discard them"
            ),
        }
    }
}

impl StdError for AdminError {}

/// What an io error on connecting to `socket` means and what to do about it.
pub fn connection_problem(socket: &Path, err: &io::Error) -> String {
    known_connection_problem(socket, err)
        .unwrap_or_else(|| format!("cannot connect to {}: {err}", socket.display()))
}

/// The advice for the io errors that have one: no socket, no permission, no listener.
fn known_connection_problem(socket: &Path, err: &io::Error) -> Option<String> {
    let path = socket.display();
    let kind = match err.raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR) => io::ErrorKind::NotFound,
        Some(libc::EACCES | libc::EPERM) => io::ErrorKind::PermissionDenied,
        Some(libc::ECONNREFUSED) => io::ErrorKind::ConnectionRefused,
        _ => err.kind(),
    };
    match kind {
        io::ErrorKind::NotFound => Some(format!(
            "no stickyvol driver is serving at {path}: is it running on this node? \
             (--admin-socket or ADMIN_SOCKET point elsewhere)"
        )),
        io::ErrorKind::PermissionDenied => Some(format!(
            "permission denied on {path}: the socket is root-only; run this as root"
        )),
        io::ErrorKind::ConnectionRefused => Some(format!(
            "nothing is listening on {path} (a stale socket: is the driver running?)"
        )),
        _ => None,
    }
}

/// What a gRPC status from the driver at `socket` means. The driver's messages are written for
/// people, so they are shown as they are, after a word on the code where that helps.
pub fn status_problem(socket: &Path, status: &Status) -> String {
    let path = socket.display();
    let message = status.message();
    // Not the driver's answer but our side's: the connection could not be re-established
    // (say why, as on connecting), or it broke during the call.
    if matches!(status.code(), Code::Unavailable | Code::Unknown)
        && let Some(source) = StdError::source(status)
    {
        if let Some(advice) = io_cause(source).and_then(|io| known_connection_problem(socket, io)) {
            return advice;
        }
        return format!(
            "lost the connection to the driver at {path} (did it stop or restart?): {}",
            error_chain(source)
        );
    }
    let message = if message.is_empty() {
        status.code().description().to_string()
    } else {
        message.to_string()
    };
    match status.code() {
        // Routing answers an unknown service with an empty message, generated stubs with this.
        Code::Unimplemented if message_is_generic(status) => format!(
            "{path} does not serve the admin API (is it the driver's CSI socket? the admin API \
             has a socket of its own: --admin-socket, by default {DEFAULT_ADMIN_SOCKET})"
        ),
        Code::Unimplemented => format!("not supported by the driver at {path}: {message}"),
        Code::Aborted => format!("busy, try again: {message}"),
        Code::Unavailable => {
            format!("the driver at {path} is unavailable (did it stop or restart?): {message}")
        }
        Code::DeadlineExceeded => format!(
            "the driver at {path} did not answer in time ({message}): it may be busy; try again"
        ),
        Code::Internal | Code::Unknown => {
            format!("the driver failed: {message} (its log may say more)")
        }
        Code::InvalidArgument => format!("invalid request: {message}"),
        Code::PermissionDenied => format!("permission denied: {message}"),
        Code::ResourceExhausted => format!("out of resources: {message}"),
        Code::DataLoss => format!("the stream did not arrive intact: {message}"),
        Code::Cancelled => format!("cancelled: {message}"),
        Code::NotFound
        | Code::FailedPrecondition
        | Code::AlreadyExists
        | Code::OutOfRange
        | Code::Unauthenticated
        | Code::Ok => message,
    }
}

fn message_is_generic(status: &Status) -> bool {
    matches!(status.message(), "" | "Not yet implemented")
}

/// The first io error in `err`'s source chain (`err` included).
fn io_cause<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a io::Error> {
    let mut next: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return Some(io);
        }
        next = err.source();
    }
    None
}

/// `err: its source: its source's source`, skipping repeats.
fn error_chain(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(err) = next {
        let part = err.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        next = err.source();
    }
    text
}

/// A connection to the admin API of the driver at one socket.
pub struct Admin {
    client: AdminClient<Channel>,
    socket: PathBuf,
}

impl Admin {
    /// Connects to `socket`; `deadline` bounds every call on this connection.
    pub async fn connect(socket: &Path, deadline: Option<Duration>) -> Result<Admin, AdminError> {
        let channel = unix_channel::connect(socket, deadline)
            .await
            .map_err(|error| AdminError::Connect {
                socket: socket.to_path_buf(),
                error,
            })?;
        let client = AdminClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(Admin {
            client,
            socket: socket.to_path_buf(),
        })
    }

    fn status(&self, status: Status) -> AdminError {
        AdminError::Status {
            socket: self.socket.clone(),
            status,
        }
    }

    /// Every volume of the node (of `pool` only, when given).
    pub async fn describe_volumes(
        &mut self,
        pool: Option<&str>,
        measure: bool,
    ) -> Result<Vec<api::Volume>, AdminError> {
        let request = api::DescribeVolumesRequest {
            pool: pool.unwrap_or_default().to_string(),
            measure,
        };
        match self.client.describe_volumes(request).await {
            Ok(response) => Ok(response.into_inner().volumes),
            Err(status) => Err(self.status(status)),
        }
    }

    pub async fn describe_volume(&mut self, volume_id: &str) -> Result<api::Volume, AdminError> {
        let request = api::DescribeVolumeRequest {
            volume_id: volume_id.to_string(),
        };
        match self.client.describe_volume(request).await {
            Ok(response) => Ok(response.into_inner()),
            Err(status) => Err(self.status(status)),
        }
    }

    pub async fn remove_volume(&mut self, volume_id: &str) -> Result<(), AdminError> {
        let request = api::RemoveVolumeRequest {
            volume_id: volume_id.to_string(),
        };
        match self.client.remove_volume(request).await {
            Ok(_) => Ok(()),
            Err(status) => Err(self.status(status)),
        }
    }

    /// Lifts the volume's read-only fence; what it changed (`was_fenced` false: it had none).
    pub async fn unfence_volume(
        &mut self,
        volume_id: &str,
    ) -> Result<api::UnfenceVolumeResponse, AdminError> {
        let request = api::UnfenceVolumeRequest {
            volume_id: volume_id.to_string(),
        };
        match self.client.unfence_volume(request).await {
            Ok(response) => Ok(response.into_inner()),
            Err(status) => Err(self.status(status)),
        }
    }

    /// Fills the volume from PV `source_pv` on another node, straight from that node's plugin.
    pub async fn pull_volume(
        &mut self,
        volume_id: &str,
        (source_pv, from_disk): (&str, Option<&str>),
    ) -> Result<api::PullVolumeResponse, AdminError> {
        let request = api::PullVolumeRequest {
            volume_id: volume_id.to_string(),
            source_pv: source_pv.to_string(),
            from_disk: from_disk.unwrap_or_default().to_string(),
        };
        match self.client.pull_volume(request).await {
            Ok(response) => Ok(response.into_inner()),
            Err(status) => Err(self.status(status)),
        }
    }

    /// Streams the volume's export into `out` (through a writer thread, so a slow reader of
    /// `out` holds the driver back instead of filling memory). `on_start` hears the stream's
    /// `start`, `on_progress` the stream bytes received so far. Returns the stream's length.
    pub async fn export_volume<W: Write + Send + 'static>(
        &mut self,
        volume_id: &str,
        out: W,
        on_start: impl FnOnce(&api::ExportStart),
        mut on_progress: impl FnMut(u64),
    ) -> Result<u64, AdminError> {
        let request = api::ExportVolumeRequest {
            volume_id: volume_id.to_string(),
        };
        let mut stream = match self.client.export_volume(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => return Err(self.status(status)),
        };
        let first = match stream.message().await {
            Ok(first) => first,
            Err(status) => return Err(self.status(status)),
        };
        match first.and_then(|m| m.message) {
            Some(export_volume_response::Message::Start(start)) => on_start(&start),
            Some(export_volume_response::Message::Data(_)) => {
                return Err(AdminError::Protocol(
                    "the driver sent export data before the stream's start".into(),
                ));
            }
            None => {
                return Err(AdminError::Protocol(
                    "the driver ended the export without starting it".into(),
                ));
            }
        }

        let (chunks, to_write) = mpsc::channel::<Bytes>(BUFFERED_CHUNKS);
        let writer = tokio::task::spawn_blocking(move || write_chunks(to_write, out));
        let mut received = 0u64;
        let streamed: Result<(), AdminError> = loop {
            match stream.message().await {
                Ok(Some(message)) => match message.message {
                    Some(export_volume_response::Message::Data(data)) => {
                        let length = data.len() as u64;
                        if chunks.send(data).await.is_err() {
                            // The writer stopped: its error says why.
                            break Ok(());
                        }
                        received += length;
                        on_progress(received);
                    }
                    Some(export_volume_response::Message::Start(_)) => {
                        break Err(AdminError::Protocol(
                            "the driver started the export stream twice".into(),
                        ));
                    }
                    None => {}
                },
                Ok(None) => break Ok(()),
                Err(status) => break Err(self.status(status)),
            }
        };
        // Ends the writer's input; dropping the stream (on return) cancels the call if it is
        // still going.
        drop(chunks);
        let written = match writer.await {
            Ok(result) => result,
            Err(join) => Err(io::Error::other(format!(
                "the writer thread failed: {join}"
            ))),
        };
        match (streamed, written) {
            (_, Err(err)) => Err(AdminError::Output(err)),
            (Err(cause), Ok(())) if received > 0 => Err(AdminError::Incomplete {
                written: received,
                cause: Box::new(cause),
            }),
            (Err(cause), Ok(())) => Err(cause),
            (Ok(()), Ok(())) => Ok(received),
        }
    }

    /// Streams `input` (read on its own thread, [`IMPORT_CHUNK`] bytes at a time, a few chunks
    /// ahead at most) into the volume. `on_progress` hears the stream bytes sent so far, a few
    /// times a second.
    pub async fn import_volume<R: Read + Send + 'static>(
        &mut self,
        volume_id: &str,
        replace: bool,
        input: R,
        mut on_progress: impl FnMut(u64),
    ) -> Result<api::ImportVolumeResponse, AdminError> {
        let (chunks, to_send) = mpsc::channel(BUFFERED_CHUNKS);
        // A plain thread, not the runtime's blocking pool: a read from a pipe that never ends
        // must not keep the runtime from shutting down once the call is over.
        std::thread::Builder::new()
            .name("stdin-reader".into())
            .spawn(move || read_chunks(input, chunks))
            .map_err(AdminError::Input)?;
        let sent = Arc::new(AtomicU64::new(0));
        let (failure, mut failed) = oneshot::channel();
        let outgoing = Outgoing {
            // The volume first, alone: the driver can refuse before any data is read.
            header: Some(api::ImportVolumeRequest {
                volume_id: volume_id.to_string(),
                replace,
                data: Bytes::new(),
            }),
            chunks: to_send,
            sent: sent.clone(),
            failure: Some(failure),
        };
        // A clone (cheap: the channel is shared) leaves `self` free for mapping errors.
        let mut client = self.client.clone();
        let call = client.import_volume(outgoing);
        tokio::pin!(call);
        let mut ticker = tokio::time::interval(super::progress::REDRAW_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut reader_may_fail = true;
        loop {
            tokio::select! {
                result = &mut call => {
                    return match result {
                        Ok(response) => Ok(response.into_inner()),
                        Err(status) => Err(self.status(status)),
                    };
                }
                // Returning drops the call, which cancels it: the driver never sees a
                // stream that merely looks short.
                failure = &mut failed, if reader_may_fail => match failure {
                    Ok(err) => return Err(AdminError::Input(err)),
                    Err(_) => reader_may_fail = false,
                },
                _ = ticker.tick() => on_progress(sent.load(Ordering::Relaxed)),
            }
        }
    }
}

/// Writes every chunk to `out` (buffered), then flushes.
fn write_chunks(mut chunks: mpsc::Receiver<Bytes>, out: impl Write) -> io::Result<()> {
    let mut out = BufWriter::with_capacity(IMPORT_CHUNK, out);
    while let Some(chunk) = chunks.blocking_recv() {
        out.write_all(&chunk)?;
    }
    out.flush()
}

/// Reads `input` in full chunks (the last one may be short) until its end, an error (sent on
/// as the last item) or the receiver going away.
fn read_chunks(mut input: impl Read, chunks: mpsc::Sender<io::Result<Vec<u8>>>) {
    loop {
        match read_chunk(&mut input, IMPORT_CHUNK) {
            Ok(chunk) if chunk.is_empty() => return,
            Ok(chunk) => {
                if chunks.blocking_send(Ok(chunk)).is_err() {
                    return;
                }
            }
            Err(err) => {
                let _ = chunks.blocking_send(Err(err));
                return;
            }
        }
    }
}

/// Up to `size` bytes: fewer only at the end of `input`.
fn read_chunk(input: &mut impl Read, size: usize) -> io::Result<Vec<u8>> {
    let mut chunk = vec![0; size];
    let mut filled = 0;
    while filled < size {
        match input.read(&mut chunk[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    chunk.truncate(filled);
    Ok(chunk)
}

/// The import's request stream: the header, then one message per chunk. A read error is
/// handed over through `failure` and the stream then never ends, so the call is cancelled
/// rather than completed with a truncated stream.
struct Outgoing {
    header: Option<api::ImportVolumeRequest>,
    chunks: mpsc::Receiver<io::Result<Vec<u8>>>,
    sent: Arc<AtomicU64>,
    failure: Option<oneshot::Sender<io::Error>>,
}

impl Stream for Outgoing {
    type Item = api::ImportVolumeRequest;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(header) = self.header.take() {
            return Poll::Ready(Some(header));
        }
        if self.failure.is_none() {
            return Poll::Pending;
        }
        match self.chunks.poll_recv(cx) {
            Poll::Ready(Some(Ok(data))) => {
                self.sent.fetch_add(data.len() as u64, Ordering::Relaxed);
                Poll::Ready(Some(api::ImportVolumeRequest {
                    data: data.into(),
                    ..Default::default()
                }))
            }
            Poll::Ready(Some(Err(err))) => {
                if let Some(failure) = self.failure.take() {
                    let _ = failure.send(err);
                }
                Poll::Pending
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Mutex;

    use tokio_stream::StreamExt;
    use tokio_stream::wrappers::UnixListenerStream;
    use tonic::{Request, Response, Streaming};

    use crate::admin_api::admin_server::{Admin as AdminService, AdminServer};

    fn socket() -> PathBuf {
        PathBuf::from("/run/x/admin.sock")
    }

    #[test]
    fn connection_failures_say_what_to_do() {
        let cases = [
            (
                libc::ENOENT,
                "no stickyvol driver is serving at /run/x/admin.sock",
            ),
            (libc::EACCES, "permission denied on /run/x/admin.sock"),
            (libc::EPERM, "run this as root"),
            (
                libc::ECONNREFUSED,
                "nothing is listening on /run/x/admin.sock",
            ),
            (libc::EIO, "cannot connect to /run/x/admin.sock: "),
        ];
        for (errno, expected) in cases {
            let text = connection_problem(&socket(), &io::Error::from_raw_os_error(errno));
            assert!(text.contains(expected), "{errno}: {text}");
        }
    }

    #[test]
    fn statuses_keep_the_drivers_words() {
        let cases = [
            (
                Status::unimplemented(""),
                "/run/x/admin.sock does not serve the admin API (is it the driver's CSI socket?",
            ),
            (
                Status::unimplemented("Not yet implemented"),
                "/run/x/admin.sock does not serve the admin API",
            ),
            (
                Status::unimplemented("block volumes cannot be exported yet"),
                "not supported by the driver at /run/x/admin.sock: block volumes cannot",
            ),
            (
                Status::not_found("volume sv-1 is not on this node"),
                "volume sv-1 is not on this node",
            ),
            (
                Status::failed_precondition("sv-1 is published"),
                "sv-1 is published",
            ),
            (
                Status::aborted("an operation on sv-1 is in progress"),
                "busy, try again: an operation on sv-1 is in progress",
            ),
            (
                Status::internal("disk on fire"),
                "the driver failed: disk on fire",
            ),
        ];
        for (status, expected) in cases {
            let text = status_problem(&socket(), &status);
            assert!(text.starts_with(expected), "{status:?}: {text}");
        }
        assert_eq!(
            status_problem(&socket(), &Status::not_found("gone")),
            "gone"
        );
    }

    #[test]
    fn a_broken_connection_is_explained_like_a_failed_one() {
        let status = Status::from_error(Box::new(io::Error::from_raw_os_error(libc::ECONNREFUSED)));
        assert!(
            status_problem(&socket(), &status).starts_with("nothing is listening on"),
            "{}",
            status_problem(&socket(), &status)
        );
        let status = Status::from_error(Box::new(io::Error::from(io::ErrorKind::ConnectionReset)));
        let text = status_problem(&socket(), &status);
        assert!(
            text.starts_with(
                "lost the connection to the driver at /run/x/admin.sock (did it stop or restart?): "
            ),
            "{text}"
        );
    }

    #[tokio::test]
    async fn connecting_to_a_missing_or_dead_socket() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("admin.sock");
        let err = Admin::connect(&missing, None).await.err().unwrap();
        assert!(
            err.to_string()
                .starts_with("no stickyvol driver is serving at"),
            "{err}"
        );

        let stale = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        let err = Admin::connect(&stale, None).await.err().unwrap();
        assert!(
            err.to_string().starts_with("nothing is listening on"),
            "{err}"
        );
    }

    /// A driver stand-in: a fixed export stream, and an import that checks what it got.
    #[derive(Default)]
    struct Fake {
        export: Vec<api::ExportVolumeResponse>,
        /// Ends the export stream when set.
        export_failure: Option<Status>,
        imported: Arc<Mutex<Vec<api::ImportVolumeRequest>>>,
    }

    #[tonic::async_trait]
    impl AdminService for Fake {
        async fn remove_volume(
            &self,
            request: Request<api::RemoveVolumeRequest>,
        ) -> Result<Response<api::RemoveVolumeResponse>, Status> {
            let id = request.into_inner().volume_id;
            if id == "sv-busy" {
                return Err(Status::failed_precondition(format!(
                    "{id} is published at /var/lib/kubelet/pods/…: stop its pods first"
                )));
            }
            Ok(Response::new(api::RemoveVolumeResponse {}))
        }

        async fn export_volume(
            &self,
            _request: Request<api::ExportVolumeRequest>,
        ) -> Result<Response<tonic::codegen::BoxStream<api::ExportVolumeResponse>>, Status>
        {
            let mut messages: Vec<_> = self.export.iter().cloned().map(Ok).collect();
            messages.extend(self.export_failure.clone().map(Err));
            Ok(Response::new(Box::pin(tokio_stream::iter(messages))))
        }

        async fn import_volume(
            &self,
            request: Request<Streaming<api::ImportVolumeRequest>>,
        ) -> Result<Response<api::ImportVolumeResponse>, Status> {
            let mut stream = request.into_inner();
            let mut bytes = 0;
            while let Some(message) = stream.next().await {
                let message = message?;
                bytes += message.data.len() as u64;
                self.imported.lock().unwrap().push(message);
            }
            Ok(Response::new(api::ImportVolumeResponse {
                stream_bytes: bytes,
                data_bytes: bytes,
                entries: 1,
                sha256: "00".into(),
            }))
        }
    }

    /// Serves `fake` on a socket in a new temporary directory.
    async fn serve(fake: Fake) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(AdminServer::new(fake))
                .serve_with_incoming(UnixListenerStream::new(listener)),
        );
        (dir, path)
    }

    fn data(bytes: &[u8]) -> api::ExportVolumeResponse {
        api::ExportVolumeResponse {
            message: Some(export_volume_response::Message::Data(
                Bytes::copy_from_slice(bytes),
            )),
        }
    }

    fn start(data_bytes: u64) -> api::ExportVolumeResponse {
        api::ExportVolumeResponse {
            message: Some(export_volume_response::Message::Start(api::ExportStart {
                data_bytes,
                source: "directly".into(),
            })),
        }
    }

    /// A `Write` whose bytes the test can read afterwards.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn export_writes_the_data_in_order_after_the_start() {
        let fake = Fake {
            export: vec![start(5), data(b"hel"), data(b""), data(b"lo!")],
            ..Fake::default()
        };
        let (_dir, path) = serve(fake).await;
        let mut admin = Admin::connect(&path, None).await.unwrap();
        let out = Shared::default();
        let mut started = None;
        let mut progress = Vec::new();
        let length = admin
            .export_volume(
                "sv-1",
                out.clone(),
                |s| started = Some(s.clone()),
                |n| progress.push(n),
            )
            .await
            .unwrap();
        assert_eq!(length, 6);
        assert_eq!(&*out.0.lock().unwrap(), b"hello!");
        assert_eq!(started.unwrap().data_bytes, 5);
        assert_eq!(progress, [3, 3, 6]);
    }

    #[tokio::test]
    async fn export_refuses_data_before_start_and_reports_a_cut_stream() {
        let (_dir, path) = serve(Fake {
            export: vec![data(b"x"), data(b"y")],
            ..Fake::default()
        })
        .await;
        let mut admin = Admin::connect(&path, None).await.unwrap();
        let err = admin
            .export_volume("sv-1", io::sink(), |_| {}, |_| {})
            .await
            .unwrap_err();
        assert!(matches!(err, AdminError::Protocol(_)), "{err}");

        // One `start`, then the driver fails: nothing written, the driver's words.
        let (_dir, path) = serve(Fake {
            export: vec![start(5)],
            export_failure: Some(Status::aborted("the volume went away")),
            ..Fake::default()
        })
        .await;
        let mut admin = Admin::connect(&path, None).await.unwrap();
        let err = admin
            .export_volume("sv-1", io::sink(), |_| {}, |_| {})
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "busy, try again: the volume went away");
    }

    #[tokio::test]
    async fn a_failure_after_data_says_the_output_is_incomplete() {
        let (_dir, path) = serve(Fake {
            export: vec![start(5), data(b"abc")],
            export_failure: Some(Status::aborted("the volume went away")),
            ..Fake::default()
        })
        .await;
        let mut admin = Admin::connect(&path, None).await.unwrap();
        let out = Shared::default();
        let err = admin
            .export_volume("sv-1", out.clone(), |_| {}, |_| {})
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "busy, try again: the volume went away; the 3 bytes already written to stdout are \
             an incomplete stream: discard them"
        );
        assert_eq!(&*out.0.lock().unwrap(), b"abc");
    }

    /// Refuses every write, as a closed pipe does.
    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _buf: &[u8]) -> io::Result<usize> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_closed_stdout_stops_the_export() {
        let big = vec![0u8; IMPORT_CHUNK];
        let (_dir, path) = serve(Fake {
            export: std::iter::once(start(8 << 20))
                .chain(std::iter::repeat_n(data(&big), 8))
                .collect(),
            ..Fake::default()
        })
        .await;
        let mut admin = Admin::connect(&path, None).await.unwrap();
        let err = admin
            .export_volume("sv-1", Closed, |_| {}, |_| {})
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("stdout was closed before the stream ended"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn import_sends_the_volume_first_then_full_chunks() {
        let fake = Fake::default();
        let imported = fake.imported.clone();
        let (_dir, path) = serve(fake).await;
        let mut admin = Admin::connect(&path, None).await.unwrap();
        let input: Vec<u8> = (0..IMPORT_CHUNK * 2 + 10).map(|i| i as u8).collect();
        let response = admin
            .import_volume("sv-1", true, io::Cursor::new(input.clone()), |_| {})
            .await
            .unwrap();
        assert_eq!(response.stream_bytes, input.len() as u64);
        let messages = imported.lock().unwrap();
        let shape: Vec<_> = messages
            .iter()
            .map(|m| (m.volume_id.as_str(), m.replace, m.data.len()))
            .collect();
        assert_eq!(
            shape,
            [
                ("sv-1", true, 0),
                ("", false, IMPORT_CHUNK),
                ("", false, IMPORT_CHUNK),
                ("", false, 10)
            ]
        );
        let received: Vec<u8> = messages.iter().flat_map(|m| m.data.to_vec()).collect();
        assert_eq!(received, input);
    }

    /// Reads some bytes, then fails.
    struct Failing(bool);

    impl Read for Failing {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if std::mem::replace(&mut self.0, true) {
                Err(io::Error::other("the disk is unreadable"))
            } else {
                buf[..3].copy_from_slice(b"abc");
                Ok(3)
            }
        }
    }

    #[tokio::test]
    async fn a_read_error_cancels_the_import() {
        let fake = Fake::default();
        let (_dir, path) = serve(fake).await;
        let mut admin = Admin::connect(&path, None).await.unwrap();
        let err = admin
            .import_volume("sv-1", false, Failing(false), |_| {})
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "reading the stream from stdin: the disk is unreadable"
        );
    }

    #[tokio::test]
    async fn delete_reports_the_drivers_refusal() {
        let (_dir, path) = serve(Fake::default()).await;
        let mut admin = Admin::connect(&path, None).await.unwrap();
        admin.remove_volume("sv-1").await.unwrap();
        let err = admin.remove_volume("sv-busy").await.unwrap_err();
        assert!(
            err.to_string().starts_with("sv-busy is published at"),
            "{err}"
        );
        // The fake serves no describe: what an older driver would answer.
        let err = admin.describe_volumes(None, false).await.unwrap_err();
        assert!(
            err.to_string().contains("does not serve the admin API"),
            "{err}"
        );
    }
}
