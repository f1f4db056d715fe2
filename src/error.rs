//! The driver's error type and its one deliberate mapping to gRPC codes.
//!
//! Every failure is built with a message that names the volume (or path) and the reason, and each
//! variant picks its code on purpose: kubelet and the sidecars retry or give up based on it.

use std::io;
use tonic::{Code, Status};

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

/// Host failures: a full disk (also our journal's own "full" error) is the caller's capacity problem, a busy resource is worth a retry
/// (kubelet retries UNAVAILABLE as "uncertain"), anything else is our fault.
fn host_code(err: &io::Error) -> Code {
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
        Status::new(err.code(), err.to_string())
    }
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
