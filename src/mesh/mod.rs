//! The mesh: identity now; heartbeats, liveness and links plug in here.

pub mod identity;

pub use identity::Identity;
