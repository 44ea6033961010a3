//! The `anarchon` binary: argument parsing and wiring only. All logic lives in
//! the library (`anarchon::server::run`, `anarchon::cli`).

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = anarchon::cli::Cli::parse();
    anarchon::cli::main(cli)
}
