//! Domain errors and **the** mapping to gRPC and HTTP status codes.
//!
//! Contention is never an error (it is a [`crate::claim::Outcome`]). Everything
//! that is an error goes through [`Error`] (the claims, the stores, the admin
//! HTTP server) or [`MeshError`] (the mesh's links), and this file is the only
//! place where a gRPC code ([`From<Error> for Status`], [`From<MeshError> for
//! Status`]) or an HTTP status ([`Error::http_status`]) is chosen.
//! Machine-readable reasons travel in the `anarchon-reason` metadata key and
//! as the first word of the message.
//!
//! Reading statuses back is here too: what tonic's codec answered before a
//! handler ran ([`codec_error`]), whether a link broke on an oversized frame
//! ([`is_frame_too_large`]), and how a peer refused our dial
//! ([`dial_refusal`]).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tonic::{metadata::MetadataValue, Code, Status};

use crate::mesh::marks::Refusal;

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
    /// A request (or mesh frame) larger than the limit named by `key`
    /// (`max_request_bytes`, `max_frame_bytes`); `detail` is tonic's text.
    #[error("{key}: the request is larger than the configured {key} ({detail})")]
    TooLarge { key: &'static str, detail: String },
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
            Error::TooLarge { key, .. } => Some(key),
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
            Error::TooLarge { .. } => "out_of_range",
        }
    }

    /// The HTTP status of this error, for the admin HTTP server.
    pub fn http_status(&self) -> StatusCode {
        match self {
            Error::InvalidArgument { .. } => StatusCode::BAD_REQUEST,
            Error::Fenced(_) | Error::NoLeases(_) => StatusCode::CONFLICT,
            Error::NotFound(_) => StatusCode::NOT_FOUND,
            // A full server is as unavailable as a store that cannot be reached.
            Error::Unavailable(_) | Error::ResourceExhausted(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Error::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Error::Unauthenticated => StatusCode::UNAUTHORIZED,
            Error::PermissionDenied(_) => StatusCode::FORBIDDEN,
            Error::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }

    /// The admin HTTP answer to this error: its [`Error::http_status`], and
    /// `body` as the text the client sees.
    pub fn http_response(&self, body: impl Into<String>) -> Response {
        (self.http_status(), body.into()).into_response()
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
            Error::TooLarge { .. } => Code::OutOfRange,
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
    with_causes(e.to_string(), e.source())
}

/// `text`, then each cause from `next` on whose text is not shown yet,
/// `: `-separated (see [`error_chain`]).
pub fn with_causes(text: String, mut next: Option<&(dyn std::error::Error + 'static)>) -> String {
    let mut out = text;
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

// ---- the mesh --------------------------------------------------------------

/// The metadata key of a refusing runtime's node id (`store_mismatch`).
pub const NODE_KEY: &str = "anarchon-node";
/// The metadata key of a refusing runtime's store identity (`store_mismatch`).
pub const STORE_IDENTITY_KEY: &str = "anarchon-store-identity";
/// The `anarchon-reason` of a link refused because it reached the dialer itself.
const SELF_REASON: &str = "self";
/// The `anarchon-reason` of a link refused because the peers claim in different stores.
const STORE_MISMATCH_REASON: &str = "store_mismatch";

/// Why the mesh refuses a link or a watcher.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeshError {
    /// The first frame of a link was not a hello.
    #[error("the first sync frame must be a hello")]
    NoHello,
    /// The hello does not verify (mesh secret, proof of key, sizes).
    #[error("peer refused: {}", .0.as_str())]
    Refused(Refusal),
    /// The hello is this runtime's own: the dialer dialed its own address.
    /// The message keeps the `self:` word older dialers look for.
    #[error("self: this address is my own")]
    IsSelf,
    /// The peer claims in another store than this runtime (`node`, `ours`).
    #[error(
        "store_mismatch: this sidecar claims in store {ours}, you claim in store {theirs}; \
         sidecars of one mesh must share one store"
    )]
    StoreMismatch {
        node: String,
        ours: String,
        theirs: String,
    },
    /// That runtime has `max_links_per_peer` inbound links already.
    #[error("{links} links from this runtime already (max_links_per_peer)")]
    TooManyLinks { links: usize },
    /// A `WatchPeers` stream fell behind the mesh's events.
    #[error("watcher fell behind the mesh; reconnect to get a fresh snapshot")]
    WatcherBehind,
}

impl From<MeshError> for Status {
    fn from(err: MeshError) -> Status {
        let code = match &err {
            MeshError::NoHello => Code::InvalidArgument,
            MeshError::Refused(Refusal::BadSecret) => Code::Unauthenticated,
            MeshError::Refused(_) => Code::PermissionDenied,
            MeshError::IsSelf | MeshError::StoreMismatch { .. } => Code::FailedPrecondition,
            MeshError::TooManyLinks { .. } | MeshError::WatcherBehind => Code::ResourceExhausted,
        };
        let mut status = Status::new(code, err.to_string());
        let metadata: &[(&str, &str)] = match &err {
            MeshError::IsSelf => &[(REASON_KEY, SELF_REASON)],
            MeshError::StoreMismatch { node, ours, .. } => &[
                (REASON_KEY, STORE_MISMATCH_REASON),
                (NODE_KEY, node),
                (STORE_IDENTITY_KEY, ours),
            ],
            _ => &[],
        };
        for (k, v) in metadata {
            if let Ok(v) = MetadataValue::try_from(*v) {
                status.metadata_mut().insert(*k, v);
            }
        }
        status
    }
}

/// How a peer refused our dial, read from its status (the dial side of
/// [`MeshError`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DialRefusal {
    /// The address is our own ([`MeshError::IsSelf`]).
    IsSelf,
    /// The peer claims in another store ([`MeshError::StoreMismatch`]): its
    /// node and store identity (empty when it did not send them).
    StoreMismatch {
        node: String,
        store_identity: String,
    },
    /// It refused our mesh secret or proof of key ([`MeshError::Refused`]).
    Credentials,
    /// Anything else: overloaded, unreachable, not a sidecar, ….
    Other,
}

/// Reads how a peer refused our dial: from the `anarchon-reason` metadata,
/// else from the text an older peer sends ([`legacy_dial_refusal`]).
pub fn dial_refusal(st: &Status) -> DialRefusal {
    let meta = |k: &str| {
        st.metadata()
            .get(k)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let reason = meta(REASON_KEY);
    let reason = match reason.as_str() {
        SELF_REASON | STORE_MISMATCH_REASON => reason.as_str(),
        _ => legacy_dial_refusal(st.message()).unwrap_or_default(),
    };
    match reason {
        SELF_REASON => DialRefusal::IsSelf,
        STORE_MISMATCH_REASON => DialRefusal::StoreMismatch {
            node: meta(NODE_KEY),
            store_identity: meta(STORE_IDENTITY_KEY),
        },
        _ if matches!(st.code(), Code::Unauthenticated | Code::PermissionDenied) => {
            DialRefusal::Credentials
        }
        _ => DialRefusal::Other,
    }
}

/// **Legacy**: the reason an older peer's refusal carries only as the first
/// word of its message (`self: this address is my own`), before the reason
/// travelled in metadata. Kept so a mixed-version mesh still stops dialing
/// itself.
fn legacy_dial_refusal(message: &str) -> Option<&'static str> {
    [SELF_REASON, STORE_MISMATCH_REASON]
        .into_iter()
        .find(|r| message.starts_with(r))
}

/// Whether a link broke on a frame larger than `max_frame_bytes`: tonic's
/// codec reports it as `OUT_OF_RANGE` (`decoded message length too large`),
/// other layers (h2, an older peer) only in the text.
pub fn is_frame_too_large(st: &Status) -> bool {
    st.code() == Code::OutOfRange || st.message().contains("too large")
}

// ---- tonic's own statuses ----------------------------------------------------

/// The error to answer instead of a status tonic's codec produced before a
/// handler ran, for a call of `path`; `None` to leave it alone.
///
/// tonic answers a body that is not valid protobuf with `INTERNAL "failed to
/// decode Protobuf message"`, and an oversized one with `OUT_OF_RANGE
/// "decoded message length too large"`: bad input is `INVALID_ARGUMENT`
/// naming the request, a limit names its config key.
pub fn codec_error(path: &str, st: &Status) -> Option<Error> {
    let msg = st.message();
    match st.code() {
        Code::Internal if msg.starts_with("failed to decode Protobuf message") => {
            let what = path.rsplit('/').next().unwrap_or("request");
            Some(Error::invalid(
                "request",
                format!("the {what} request is not a valid protobuf message ({msg})"),
            ))
        }
        Code::OutOfRange if msg.contains("message length too large") => Some(Error::TooLarge {
            // The limit that applies to the service the call went to.
            key: if path.starts_with("/anarchon.v1.Mesh/") {
                "max_frame_bytes"
            } else {
                "max_request_bytes"
            },
            detail: msg.to_owned(),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_travels_as_a_reason_and_as_legacy_text() {
        let st: Status = MeshError::IsSelf.into();
        assert_eq!(st.code(), Code::FailedPrecondition);
        assert_eq!(status_reason(&st).as_deref(), Some("self"));
        assert_eq!(dial_refusal(&st), DialRefusal::IsSelf);
        // An older peer: the text only.
        let old = Status::failed_precondition("self: this address is my own");
        assert_eq!(dial_refusal(&old), DialRefusal::IsSelf);
        // A reason wins over the text.
        let mut other = Status::failed_precondition("self-signed certificate");
        other
            .metadata_mut()
            .insert(REASON_KEY, MetadataValue::from_static("store_mismatch"));
        assert!(matches!(
            dial_refusal(&other),
            DialRefusal::StoreMismatch { .. }
        ));
    }

    #[test]
    fn store_mismatch_carries_node_and_store() {
        let st: Status = MeshError::StoreMismatch {
            node: "n1".into(),
            ours: "s1".into(),
            theirs: "s2".into(),
        }
        .into();
        assert_eq!(st.code(), Code::FailedPrecondition);
        assert!(st
            .message()
            .starts_with("store_mismatch: this sidecar claims in store s1, you claim in store s2"));
        assert_eq!(
            dial_refusal(&st),
            DialRefusal::StoreMismatch {
                node: "n1".into(),
                store_identity: "s1".into()
            }
        );
    }

    #[test]
    fn refusals_and_limits() {
        let st: Status = MeshError::Refused(Refusal::BadSecret).into();
        assert_eq!(st.code(), Code::Unauthenticated);
        assert_eq!(st.message(), "peer refused: bad_secret");
        assert_eq!(dial_refusal(&st), DialRefusal::Credentials);
        let st: Status = MeshError::Refused(Refusal::BadProof).into();
        assert_eq!(st.code(), Code::PermissionDenied);
        let st: Status = MeshError::TooManyLinks { links: 3 }.into();
        assert_eq!(st.code(), Code::ResourceExhausted);
        assert_eq!(dial_refusal(&st), DialRefusal::Other);
        assert!(is_frame_too_large(&Status::out_of_range("x")));
        assert!(is_frame_too_large(&Status::internal("frame too large")));
        assert!(!is_frame_too_large(&Status::internal("boom")));
    }

    #[test]
    fn http_statuses() {
        assert_eq!(
            Error::Unauthenticated.http_status(),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            Error::Unavailable("x".into()).http_status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            Error::ResourceExhausted("x".into()).http_status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
