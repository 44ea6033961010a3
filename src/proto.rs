//! The generated `anarchon.v1` protocol. Nothing else lives here.
#![allow(clippy::all, missing_docs, unreachable_pub)]

tonic::include_proto!("anarchon.v1");

/// Encoded descriptor set of every anarchon proto, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/anarchon_descriptor.bin"));
