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
//! | [`config`] | the one typed config: defaults → TOML → `ANARCHON_*` → flags, validated before binding |
//! | [`duration`] | the one duration syntax of every flag (`30s`, `2m`, `1500ms`, bare ms) |
//! | [`error`] | domain errors and **the** mapping to gRPC status codes |
//! | [`claim`] | jobs, tokens, runs, outcomes, and the pure lease decision table |
//! | [`store`] | the `Store` trait, `open(url)`, and one module per backend |
//! | [`mesh`] | node identity (key + instance generation) |
//! | [`server`] | `run(listeners, config, shutdown)`: the gRPC services, admin HTTP, metrics |
//! | [`cli`] | the client subcommands (`claim`, `renew`, `release`, `history`, `hold`) and `bench` |
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
pub mod mesh;
pub mod proto;
pub mod server;
pub mod store;
pub mod telemetry;

pub use config::Config;
pub use error::{Error, Result};
