//! The `anarchon` binary: argument parsing and wiring only. All logic lives in
//! the library (`anarchon::server::run`, `anarchon::cli`).

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
