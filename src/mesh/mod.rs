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
//! * [`persist`]: `peers.json`, who was there before a restart.
//! * [`node`]: the I/O around it: beats, `Sync` links, dialing with backoff,
//!   discovery (static, DNS, gossip), persistence, events for `WatchPeers`.

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
