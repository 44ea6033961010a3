//! The `anarchon` binary: argument parsing and wiring only. All logic lives in
//! the library (`anarchon::server::run`, `anarchon::cli`).

// jemalloc: fewer instructions per claim than glibc's malloc, and no more
// than 2 MiB more memory (docs/BENCHMARKS.md, round 9).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    // The supervisor of a held command (see `anarchon::cli::group`): plain
    // blocking code, started by `hold` and `cron`, never by a user.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(anarchon::cli::group::SUPERVISE) {
        return anarchon::cli::group::supervise(&args[2..]);
    }
    let cli = anarchon::cli::parse();
    anarchon::cli::main(cli)
}
