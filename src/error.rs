//! Domain errors and **the** mapping to gRPC status codes.
//!
//! Contention is never an error (it is a [`crate::claim::Outcome`]). Everything
//! that is an error goes through [`Error`], and [`From<Error> for Status`] is the
//! only place where a gRPC code is chosen. Machine-readable reasons travel in
//! the `anarchon-reason` metadata key and as the first word of the message.

use tonic::{metadata::MetadataValue, Code, Status};

/// The metadata key that carries a machine-readable reason.
pub const REASON_KEY: &str = "anarchon-reason";
/// For `fenced`: why the token does not hold the run (`taken_over`,
/// `not_holder`, `released`, `finished`, `holder_dead`).
pub const FENCE_REASON_KEY: &str = "anarchon-fence-reason";

/// Why a token no longer holds its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceReason {
    /// Another attempt took the run over.
    TakenOver,
    /// The run has finished (interrupted, or released with another result).
    Finished,
    /// The holder already released the run with this token.
    Released,
    /// The holding runtime is dead (expired, left, or restarted).
    HolderDead,
    /// The token never held the run (a wrong token): see
    /// [`crate::claim::wrong_token`].
    NotHolder,
}

impl FenceReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FenceReason::TakenOver => "taken_over",
            FenceReason::Finished => "finished",
            FenceReason::Released => "released",
            FenceReason::HolderDead => "holder_dead",
            FenceReason::NotHolder => "not_holder",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input. `field` names the offending request field or config key.
    #[error("invalid {field}: {message}")]
    InvalidArgument {
        field: &'static str,
        message: String,
    },
    /// The token no longer holds the run.
    #[error("fenced: {} ({})", fence_text(*.0), .0.as_str())]
    Fenced(FenceReason),
    /// The backend has no leases (once backends).
    #[error("no_leases: the {0} backend has no leases")]
    NoLeases(&'static str),
    /// No such run.
    #[error("not found: {0}")]
    NotFound(String),
    /// The store cannot be reached. Retry later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered something we could not use.
    #[error("store error: {0}")]
    Store(String),
    /// The client's deadline passed.
    #[error("deadline exceeded")]
    DeadlineExceeded,
    /// A configured limit was hit.
    #[error("limit reached: {0}")]
    ResourceExhausted(String),
    /// Missing or wrong credentials.
    #[error("unauthenticated")]
    Unauthenticated,
    #[error("permission denied: {0}")]
    PermissionDenied(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn fence_text(r: FenceReason) -> &'static str {
    match r {
        FenceReason::NotHolder => "the token never held the run",
        _ => "the token no longer holds the run",
    }
}

impl Error {
    pub fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field,
            message: message.into(),
        }
    }

    /// The machine-readable reason, if this error has one.
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            Error::Fenced(_) => Some("fenced"),
            Error::NoLeases(_) => Some("no_leases"),
            Error::InvalidArgument { field, .. } => Some(field),
            _ => None,
        }
    }

    /// Short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidArgument { .. } => "invalid_argument",
            Error::Fenced(FenceReason::NotHolder) => "not_holder",
            Error::Fenced(_) => "fenced",
            Error::NoLeases(_) => "no_leases",
            Error::NotFound(_) => "not_found",
            Error::Unavailable(_) => "unavailable",
            Error::Store(_) => "store",
            Error::DeadlineExceeded => "deadline_exceeded",
            Error::ResourceExhausted(_) => "resource_exhausted",
            Error::Unauthenticated => "unauthenticated",
            Error::PermissionDenied(_) => "permission_denied",
        }
    }
}

impl From<Error> for Status {
    fn from(err: Error) -> Status {
        let code = match &err {
            Error::InvalidArgument { .. } => Code::InvalidArgument,
            Error::Fenced(_) | Error::NoLeases(_) => Code::FailedPrecondition,
            Error::NotFound(_) => Code::NotFound,
            Error::Unavailable(_) => Code::Unavailable,
            Error::Store(_) => Code::Internal,
            Error::DeadlineExceeded => Code::DeadlineExceeded,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::Unauthenticated => Code::Unauthenticated,
            Error::PermissionDenied(_) => Code::PermissionDenied,
        };
        let mut status = Status::new(code, err.to_string());
        if let Some(reason) = err.reason() {
            if let Ok(v) = MetadataValue::try_from(reason) {
                status.metadata_mut().insert(REASON_KEY, v);
            }
        }
        if let Error::Fenced(f) = &err {
            if let Ok(v) = MetadataValue::try_from(f.as_str()) {
                status.metadata_mut().insert(FENCE_REASON_KEY, v);
            }
        }
        status
    }
}

/// An error and its causes (`std::error::Error::source`), `: `-separated:
/// `transport error: tcp connect error: Connection refused (os error 111)`.
/// A cause whose text is already shown (an io error wrapped with its own
/// message as the source) is not repeated.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !text.is_empty() && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

/// Reads the machine-readable reason from a status (client side).
pub fn status_reason(status: &Status) -> Option<String> {
    status
        .metadata()
        .get(REASON_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}
