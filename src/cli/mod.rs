//! The command line: `serve`, the client subcommands and `bench`.
//!
//! Exit statuses: 0 success (or `WON`), 1 error, 2 usage, 3 not won,
//! 4 lease lost (`hold`), 64 invalid configuration; `hold` otherwise exits
//! with its command's status.

#[cfg(feature = "bench")]
pub mod bench;
pub mod client;
pub mod cron;
pub mod group;
mod hold;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

pub use client::{connect, outcome_name, print_status};

pub use crate::error::error_chain;

/// [`error_chain`] of an `anyhow` error (its contexts, then their causes).
pub fn anyhow_chain(e: &anyhow::Error) -> String {
    error_chain(e.as_ref())
}

/// Exit status when a claim was answered but not won.
pub const EXIT_NOT_WON: u8 = 3;
/// Exit status when `hold` lost its lease while the command ran.
pub const EXIT_LEASE_LOST: u8 = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn error_chains_show_each_cause_once() {
        let e = E(
            "transport error",
            Some(Box::new(E(
                "tcp connect error",
                Some(Box::new(E("Connection refused (os error 111)", None))),
            ))),
        );
        assert_eq!(
            error_chain(&e),
            "transport error: tcp connect error: Connection refused (os error 111)"
        );
        let io = E(
            "/d: Permission denied (os error 13)",
            Some(Box::new(E("Permission denied (os error 13)", None))),
        );
        assert_eq!(error_chain(&io), "/d: Permission denied (os error 13)");
        let a = anyhow::Error::new(io).context("cannot load the node identity");
        assert_eq!(
            anyhow_chain(&a),
            "cannot load the node identity: /d: Permission denied (os error 13)"
        );
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "anarchon",
    version,
    about = "Tells a fleet who owns a piece of work and who is alive.",
    after_help = "Run `anarchon serve` next to each application instance (SQLite, no setup), then e.g.\n  anarchon claim nightly-report --slot now/1d\n  anarchon hold nightly-report --slot now/1d -- ./report.sh\n  anarchon cron '*/5 * * * *' --job nightly-report --tz Europe/Prague --max-late 30s --lease 2m --overlap skip -- ./report.sh"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the sidecar.
    Serve(Box<serve::ServeArgs>),
    /// Claim a (job, slot); exits 0 when WON, 3 otherwise.
    Claim(client::ClaimArgs),
    /// Extend the lease of a run you hold.
    Renew(client::RenewArgs),
    /// Mark a run you hold finished.
    Release(client::ReleaseArgs),
    /// Show the runs of a job, newest first.
    History(client::HistoryArgs),
    /// Claim, run CMD while renewing, release with its exit status
    /// (alias: lock, as in `etcdctl lock` / `consul lock`).
    #[command(visible_alias = "lock")]
    Hold(hold::HoldArgs),
    /// Run CMD once per tick of a cron schedule across the whole fleet.
    Cron(cron::CronArgs),
    /// List this sidecar's view of the mesh.
    Peers(client::PeersArgs),
    /// Stream peer events (a snapshot, then every change).
    Watch(client::WatchArgs),
    /// Validate the config (as `serve` would) and check the store is reachable.
    Check(Box<serve::ServeArgs>),
    /// Measure claims/s and latency through the sidecar against the raw store step.
    #[cfg(feature = "bench")]
    Bench(bench::BenchArgs),
}

/// Options every client subcommand takes.
#[derive(Debug, Clone, Args)]
pub struct ClientOpts {
    /// The sidecar's gRPC address, or `unix:PATH` for its --listen-unix socket.
    #[arg(long, default_value = "127.0.0.1:50051", env = "ANARCHON_SERVER")]
    pub server: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// A file holding the bearer token the sidecar requires.
    #[arg(long, env = "ANARCHON_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Connect over TLS, trusting this CA (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for a sidecar that requires mTLS.
    #[arg(long, value_name = "FILE", requires = "tls_client_key")]
    pub tls_client_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-client-cert.
    #[arg(long, value_name = "FILE", requires = "tls_client_cert")]
    pub tls_client_key: Option<PathBuf>,
}

/// The command line, with each config flag's help showing its default
/// (from [`crate::Config::default`], where it is declared).
pub fn command() -> clap::Command {
    Cli::command()
        .mut_subcommand("serve", crate::config::ConfigFlags::show_defaults)
        .mut_subcommand("check", crate::config::ConfigFlags::show_defaults)
}

/// Parses the process's arguments with [`command`]; exits on a usage error.
pub fn parse() -> Cli {
    Cli::from_arg_matches(&command().get_matches()).unwrap_or_else(|e| e.exit())
}

pub fn main(cli: Cli) -> ExitCode {
    match cli.command {
        // These two build their runtime after loading the config, which says
        // how many worker threads it has.
        Command::Serve(args) => serve::serve(*args),
        Command::Check(args) => serve::check(*args),
        Command::Claim(a) => block_on(client::claim(a)),
        Command::Renew(a) => block_on(client::renew(a)),
        Command::Release(a) => block_on(client::release(a)),
        Command::History(a) => block_on(client::history(a)),
        Command::Hold(a) => block_on(hold::hold(a)),
        Command::Cron(a) => block_on(cron::cron(a)),
        Command::Peers(a) => block_on(client::peers(a)),
        Command::Watch(a) => block_on(client::watch(a)),
        #[cfg(feature = "bench")]
        Command::Bench(a) => block_on(bench::bench(a)),
    }
}

/// Runs a client subcommand on a runtime of Tokio's default size.
fn block_on(command: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    match runtime(0) {
        Ok(rt) => rt.block_on(command),
        Err(status) => status,
    }
}

/// The Tokio runtime: `workers` worker threads, or with 0 Tokio's default
/// (`TOKIO_WORKER_THREADS`, else one per core this process may use).
fn runtime(workers: usize) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if workers > 0 {
        b.worker_threads(workers);
    }
    b.enable_all().build().map_err(|e| {
        eprintln!("anarchon: cannot start the runtime: {e}");
        ExitCode::FAILURE
    })
}
