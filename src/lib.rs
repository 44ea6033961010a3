//! # anarchon
//!
//! A gRPC sidecar that tells a fleet of application instances **which one of
//! them owns a piece of work** (a job and a time slot) and **which of their
//! peers are alive**. See `README.md` for the tour and `../shared/SPEC.md`
//! for the contract.
//!
//! # Layout
//!
//! | module | what lives there |
//! |---|---|
//! | [`proto`] | the generated `anarchon.v1` protocol (nothing else) |
//! | [`config`] | the one typed config: each key declared once (`config_keys!`: doc, type, default, flag); defaults → TOML → `ANARCHON_*` → flags, validated before binding |
//! | [`duration`] | the one duration syntax of every flag (`30s`, `2m`, `1500ms`, bare ms) |
//! | [`error`] | domain errors (`Error`, the mesh's `MeshError`) and **the** mapping to gRPC and HTTP status codes, and the reading of statuses back (tonic's codec errors, a peer's refusal) |
//! | [`claim`] | jobs, tokens, runs, outcomes, and the pure lease decision table |
//! | [`store`] | the `Store` trait and its `Leases` capability, `open(url)` (every store refuses slots beyond `max_future_ms`), backend URLs (`backend_url`: redaction, the query-option splitter), and one module per backend |
//! | [`mesh`] | who is alive: the node key and instance generation (one process per data dir), signed beats and hellos, the pure liveness table, gossip deltas, fan-out, redial backoff; the runtime's core (`node`: beats, events, views), the hello and `Sync` links (`links`), discovery and dialling (`discovery`), `WatchPeers` (`watch`), known peers on disk (`persist`) |
//! | [`liveness`] | store-confirmed liveness: this sidecar's self-fence, the observer of suspects' counters, the dead-holder sets for claims |
//! | [`server`] | `run(listeners, config, shutdown)`: the gRPC services (`claims`: one frame for every RPC's span, timing, counting and status), request validation (`validate`) and the protobuf ↔ domain mappings (`convert`), admin HTTP, metrics (with the mesh's counters), the mesh as JSON (`mesh_state`: `/api/v1/mesh/state`, a peer for the dashboard and the CLI) |
//! | [`cli`] | the subcommands: `serve` and `check` (the sidecar, and its config check), the clients (`claim`, `renew`, `release`, `history`, `hold`, `cron`, `peers`, `watch`), `bench`, and the supervisor that runs a held command as a process group |
//! | [`telemetry`] | tracing setup (plain or JSON logs) |
//! | `fuzzing` | fuzz bodies shared by `fuzz/` and the smoke test |

#![deny(unsafe_code)]
#![warn(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod claim;
pub mod cli;
pub mod config;
pub mod duration;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod liveness;
pub mod mesh;
pub mod proto;
pub mod server;
pub mod store;
pub mod telemetry;

pub use config::Config;
pub use error::{Error, Result};
