//! The `anarchon` binary: argument parsing and wiring only. All logic lives in
//! the library (`anarchon::server::run`, `anarchon::cli`).

use clap::Parser;

/// Every RPC allocates its request, its answer and its spans: mimalloc does
/// that in fewer CPU µs per claim than glibc's allocator (measured in
/// docs/BENCHMARKS.md). `--no-default-features` builds without it.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // The supervisor of a held command (see `anarchon::cli::group`): plain
    // blocking code, started by `hold` and `cron`, never by a user.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(anarchon::cli::group::SUPERVISE) {
        return anarchon::cli::group::supervise(&args[2..]);
    }
    let cli = anarchon::cli::Cli::parse();
    anarchon::cli::main(cli)
}
