//! The mesh: who is alive, on local monotonic clocks only (SPEC §4).
//!
//! * [`identity`]: the Ed25519 node key, the instance generation, and the
//!   data dir lock (one `serve` per data dir).
//! * [`marks`]: signed beats and hellos; verification; refusal reasons.
//! * [`table`]: the pure liveness table (marks in, states out), forgetting
//!   the long dead.
//! * [`gossip`]: what one link sends: deltas, identities once (pure).
//! * [`fanout`]: which runtimes a runtime links with (pure).
//! * [`dial`]: the redial backoff (`backon`).
//! * [`persist`]: `peers.json`, who was there before a restart, and the
//!   loop that writes it.
//! * [`node`]: the runtime's core: [`Mesh`] and its config, the beat loop,
//!   peer events, `ListPeers`, plain views for the admin endpoints, and the
//!   suspects for [`crate::liveness`].
//! * [`links`]: the hello exchange, refusals, and one `Sync` link's life
//!   (frames each beat, the relay budget, expiry, closing a surplus link).
//! * [`discovery`]: the addresses to dial (static, DNS, gossip), the dial
//!   loops (with [`dial`]'s backoff) and the dialling side of the hello.
//! * [`watch`]: `WatchPeers` streams.
//!
//! How the mesh reads as JSON and as metrics is the server's
//! ([`crate::server::mesh_state`], [`crate::server::metrics`]).

pub mod dial;
pub mod discovery;
pub mod fanout;
pub mod gossip;
pub mod identity;
pub mod links;
pub mod marks;
pub mod node;
pub mod persist;
pub mod table;
pub mod watch;

pub use identity::Identity;
pub use node::{Mesh, MeshConfig};
