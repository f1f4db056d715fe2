//! The driver's error type and its one deliberate mapping to gRPC codes.
//!
//! Every failure is built with a message that names the volume (or path) and the reason, and each
//! variant picks its code on purpose: kubelet and the sidecars retry or give up based on it.

use std::fmt::Display;
use std::io;
use std::path::Path;

use tonic::{Code, Status};

use crate::host::tree::{WalkError, beyond_limit, is_beyond_limit};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request itself is wrong; retrying it unchanged cannot succeed.
    #[error("{0}")]
    InvalidArgument(String),
    /// The volume (or the path given for it) is unknown.
    #[error("{0}")]
    NotFound(String),
    /// A different object already holds the name or target.
    #[error("{0}")]
    AlreadyExists(String),
    /// The request is valid, but the volume is not in a state that allows it.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The requested capacity cannot be satisfied by any volume we could make.
    #[error("{0}")]
    OutOfRange(String),
    /// Not enough room (or too many volumes) on this node.
    #[error("{0}")]
    ResourceExhausted(String),
    /// Another operation on the same volume or name is running.
    #[error("an operation is already in progress for {0}; retry later")]
    Pending(String),
    /// This instance does not do the requested kind of work (e.g. controller mode).
    #[error("{0}")]
    Unimplemented(String),
    /// Data handed to us arrived damaged: an import stream cut short or failing its checksum.
    #[error("{0}")]
    DataLoss(String),
    /// The host refused a system call.
    #[error("{context}: {source}")]
    Host {
        context: String,
        #[source]
        source: io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an io::Error with what we were doing, e.g. "mounting volume X at /path".
    pub fn host(context: impl Into<String>, source: io::Error) -> Self {
        Error::Host {
            context: context.into(),
            source,
        }
    }

    /// A walk over volume `id`'s data that failed; see [`Error::walk_at`].
    pub fn volume_walk(id: impl Display, doing: &str, err: WalkError) -> Self {
        Self::walk_of(&format!("volume {id}"), doing, err)
    }

    /// A walk over the data at `root` (a snapshot's or a volume's) that failed. A mount inside
    /// it is for an admin to remove, a tree deeper than we walk for its owner to change (both
    /// FAILED_PRECONDITION); an io error keeps its errno, so its gRPC code follows it.
    pub fn walk_at(root: &Path, doing: &str, err: WalkError) -> Self {
        Self::walk_of(&root.display().to_string(), doing, err)
    }

    fn walk_of(subject: &str, doing: &str, err: WalkError) -> Self {
        match err {
            WalkError::MountPoint(at) => Error::FailedPrecondition(format!(
                "{subject} contains a mount point at {}; refusing to cross it",
                at.display()
            )),
            WalkError::TooDeep { path, limit } => Error::FailedPrecondition(format!(
                "{subject} holds directories more than {limit} levels deep (at {}), more than stickyvol walks; {doing} refused",
                path.display()
            )),
            WalkError::Budget { .. } => {
                Error::FailedPrecondition(format!("{doing} {subject} stopped: {err}"))
            }
            WalkError::Io { path, source } => {
                Error::host(format!("{doing} {} of {subject}", path.display()), source)
            }
        }
    }

    /// The same error again (same variant, message and errno), for a second caller.
    pub fn duplicate(&self) -> Error {
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            Error::NotFound(m) => Error::NotFound(m.clone()),
            Error::AlreadyExists(m) => Error::AlreadyExists(m.clone()),
            Error::FailedPrecondition(m) => Error::FailedPrecondition(m.clone()),
            Error::OutOfRange(m) => Error::OutOfRange(m.clone()),
            Error::ResourceExhausted(m) => Error::ResourceExhausted(m.clone()),
            Error::Pending(m) => Error::Pending(m.clone()),
            Error::Unimplemented(m) => Error::Unimplemented(m.clone()),
            Error::DataLoss(m) => Error::DataLoss(m.clone()),
            Error::Host { context, source } => Error::Host {
                context: context.clone(),
                source: match source.raw_os_error() {
                    Some(errno) => io::Error::from_raw_os_error(errno),
                    None if is_beyond_limit(source) => beyond_limit(source.to_string()),
                    None => io::Error::new(source.kind(), source.to_string()),
                },
            },
        }
    }

    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::OutOfRange(_) => Code::OutOfRange,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::Pending(_) => Code::Aborted,
            Error::Unimplemented(_) => Code::Unimplemented,
            Error::DataLoss(_) => Code::DataLoss,
            Error::Host { source, .. } => host_code(source),
        }
    }

    /// The same error (same code) with `more` said at the end of its message.
    pub fn followed_by(self, more: &str) -> Error {
        let more = |m: String| m + more;
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(more(m)),
            Error::NotFound(m) => Error::NotFound(more(m)),
            Error::AlreadyExists(m) => Error::AlreadyExists(more(m)),
            Error::FailedPrecondition(m) => Error::FailedPrecondition(more(m)),
            Error::OutOfRange(m) => Error::OutOfRange(more(m)),
            Error::ResourceExhausted(m) => Error::ResourceExhausted(more(m)),
            Error::Pending(m) => Error::Pending(more(m)),
            Error::Unimplemented(m) => Error::Unimplemented(more(m)),
            Error::DataLoss(m) => Error::DataLoss(more(m)),
            Error::Host { context, source } => Error::Host {
                context: more(context),
                source,
            },
        }
    }
}

/// Host failures: a full disk (also our journal's own "full" error) is the caller's capacity
/// problem, a busy resource is worth a retry (kubelet retries UNAVAILABLE as "uncertain"), a
/// tree beyond our documented bounds waits for its owner to change it, anything else is our
/// fault.
fn host_code(err: &io::Error) -> Code {
    if is_beyond_limit(err) {
        return Code::FailedPrecondition;
    }
    if matches!(
        err.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    ) {
        return Code::ResourceExhausted;
    }
    match err.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => Code::ResourceExhausted,
        Some(libc::EBUSY) | Some(libc::EAGAIN) | Some(libc::EINTR) => Code::Unavailable,
        _ => Code::Internal,
    }
}

impl From<Error> for Status {
    fn from(err: Error) -> Status {
        Status::new(err.code(), bounded_message(err.to_string()))
    }
}

/// The most bytes of an error message a Status carries. It travels in an HTTP/2 header, and
/// a pod's tree can put a path of hundreds of KiB into a message (1,000 levels of 255-byte
/// names), which the transport refuses whole: the caller would see a protocol error instead.
pub const MAX_STATUS_MESSAGE: usize = 4096;

/// `message` cut to `MAX_STATUS_MESSAGE` bytes: its start and its end (where the reason is)
/// with what was left out counted between them.
fn bounded_message(message: String) -> String {
    if message.len() <= MAX_STATUS_MESSAGE {
        return message;
    }
    let head = message.floor_char_boundary(MAX_STATUS_MESSAGE / 2);
    let tail = message.ceil_char_boundary(message.len() - MAX_STATUS_MESSAGE / 2 + 64);
    format!(
        "{} … ({} bytes left out) … {}",
        &message[..head],
        tail - head,
        &message[tail..]
    )
}

/// Adds context to io results in one call: `fs::create_dir(p).context(|| format!(...))?`.
pub trait IoContext<T> {
    fn context<C: Into<String>>(self, context: impl FnOnce() -> C) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn context<C: Into<String>>(self, context: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|source| Error::host(context(), source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_message_keeps_its_start_and_its_reason_within_the_bound() {
        let path = "/é".repeat(100_000);
        let err = Error::host(
            format!("importing {path}"),
            beyond_limit("more than 262144 hard-linked files await their other names".into()),
        );
        let status = Status::from(err);
        assert_eq!(status.code(), Code::FailedPrecondition);
        let message = status.message();
        assert!(message.len() <= MAX_STATUS_MESSAGE, "{}", message.len());
        assert!(message.starts_with("importing /é/é"), "{message}");
        assert!(message.ends_with("await their other names"), "{message}");
        assert!(message.contains("bytes left out"), "{message}");
        let short = Status::from(Error::NotFound("volume sv-x".into()));
        assert_eq!(short.message(), "volume sv-x");
    }

    #[test]
    fn a_duplicate_of_a_tree_beyond_our_limits_keeps_its_code() {
        let err = Error::host("copying", beyond_limit("too many".into()));
        assert_eq!(err.duplicate().code(), Code::FailedPrecondition);
        let other = Error::host("copying", io::Error::other("odd"));
        assert_eq!(other.duplicate().code(), Code::Internal);
    }
}
