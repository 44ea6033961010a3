//! Claims follow liveness (SPEC §5), per lease store, with real processes.
//! Each store adds one `liveness!` line.

mod common;

use common::liveness;

/// These tests measure time: they take turns.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

macro_rules! liveness {
    ($name:ident, $backend:expr) => {
        mod $name {
            use super::*;

            macro_rules! case {
                ($case:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $case() {
                        let _turn = TURN.lock().await;
                        if let Some(url) = $backend {
                            liveness::$case(&url).await;
                        }
                    }
                };
            }

            case!(takeover_after_sigkill);
            case!(restart_never_revives_old_runs);
            case!(graceful_leave_hands_over_at_once);
            case!(waiters_wake_on_release_and_death);
        }
    };
}

fn sqlite() -> Option<String> {
    let dir = tempfile::tempdir().unwrap().keep();
    Some(format!("sqlite://{}", dir.join("shared.db").display()))
}

liveness!(sqlite, sqlite());

/// `cargo test --release --test liveness -- --ignored --nocapture takeover_latency`
/// prints the takeover latency distribution over 20 SIGKILLs (docs/BENCHMARKS.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run explicitly"]
async fn takeover_latency_over_20_sigkills() {
    let _turn = TURN.lock().await;
    let mut lat = liveness::takeover_latency_distribution(&sqlite().unwrap(), 20).await;
    lat.sort();
    let ms = |d: std::time::Duration| d.as_millis();
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p).round() as usize];
    println!(
        "takeover after SIGKILL, heartbeat {} ms, expiry {} ms, {} rounds: min {} p50 {} p99 {} max {} ms",
        liveness::HB,
        liveness::EXPIRY,
        lat.len(),
        ms(lat[0]),
        ms(q(0.5)),
        ms(q(0.99)),
        ms(lat[lat.len() - 1])
    );
}

fn redis_lease() -> Option<String> {
    common::redis::have_redis().then(|| common::redis::url("lease"))
}

liveness!(redis_lease, redis_lease());

fn postgres() -> Option<String> {
    common::pg::available().then(|| common::pg::backend(&common::pg::prefix()))
}

liveness!(postgres, postgres());
