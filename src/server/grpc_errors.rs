//! Statuses tonic produces before a handler runs, made to follow
//! [`crate::error`]'s rules ([`crate::error::codec_error`] says which and
//! into what): bad input is `INVALID_ARGUMENT` naming what is wrong, a limit
//! names its config key, and both are counted in `anarchon_errors_total`.
//!
//! tonic answers them from inside its codec as trailers-only responses (the
//! status sits in the response headers), so a layer around the gRPC server
//! can rewrite them without touching a body.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tonic::codegen::http;
use tonic::Status;
use tower_layer::Layer;
use tower_service::Service;

use super::metrics::{KindLabels, Metrics};

/// The layer: rewrites decode failures and size-limit refusals.
#[derive(Clone)]
pub struct DecodeErrors {
    metrics: Arc<Metrics>,
}

impl DecodeErrors {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        DecodeErrors { metrics }
    }
}

impl<S> Layer<S> for DecodeErrors {
    type Service = DecodeErrorsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DecodeErrorsService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Clone)]
pub struct DecodeErrorsService<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, ReqB, ResB> Service<http::Request<ReqB>> for DecodeErrorsService<S>
where
    S: Service<http::Request<ReqB>, Response = http::Response<ResB>> + Send,
    S::Future: Send + 'static,
    ReqB: Send + 'static,
{
    type Response = http::Response<ResB>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        let path = req.uri().path().to_owned();
        let metrics = self.metrics.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let mut resp = fut.await?;
            if let Some(st) = Status::from_header_map(resp.headers()) {
                if let Some((fixed, kind)) = rewrite(&path, &st) {
                    metrics.errors.get_or_create(&KindLabels { kind }).inc();
                    let headers = resp.headers_mut();
                    headers.remove("grpc-status");
                    headers.remove("grpc-message");
                    headers.remove("grpc-status-details-bin");
                    let _ = fixed.add_header(headers);
                }
            }
            Ok(resp)
        })
    }
}

/// The status to answer instead of `st` for a call of `path`, and its metric
/// kind; `None` to leave it alone.
pub fn rewrite(path: &str, st: &Status) -> Option<(Status, &'static str)> {
    let err = crate::error::codec_error(path, st)?;
    let kind = err.kind();
    Some((err.into(), kind))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn decode_failures_become_invalid_argument() {
        let st = Status::internal("failed to decode Protobuf message: invalid varint");
        let (out, kind) = rewrite("/anarchon.v1.Claims/Claim", &st).unwrap();
        assert_eq!(out.code(), Code::InvalidArgument);
        assert_eq!(kind, "invalid_argument");
        assert!(out.message().contains("Claim request"), "{out:?}");
        assert!(out.message().contains("invalid varint"), "{out:?}");
    }

    #[test]
    fn size_refusals_name_the_key() {
        let st = Status::out_of_range(
            "Error, decoded message length too large: found 1048590 bytes, the limit is: 65536 bytes",
        );
        let (out, _) = rewrite("/anarchon.v1.Claims/Claim", &st).unwrap();
        assert!(out.message().starts_with("max_request_bytes"), "{out:?}");
        let (out, _) = rewrite("/anarchon.v1.Mesh/Sync", &st).unwrap();
        assert!(out.message().starts_with("max_frame_bytes"), "{out:?}");
    }

    #[test]
    fn other_statuses_are_left_alone() {
        assert!(rewrite("/x/y", &Status::internal("store error: boom")).is_none());
        assert!(rewrite("/x/y", &Status::out_of_range("slot")).is_none());
    }
}
