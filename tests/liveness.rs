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
