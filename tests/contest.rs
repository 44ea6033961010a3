//! Multi-process contests: 3 real `anarchon serve` processes, 48 concurrent
//! gRPC claimers, ≥ 2,000 slots, exactly one WON per slot.

mod common;

use common::contest::Contest;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_three_processes_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    let report = Contest {
        backend: format!("sqlite://{}", db.display()),
        ..Contest::default()
    }
    .run()
    .await;
    assert!(report.claims >= 2000 * 48 / 4);
    assert_eq!(report.outcomes.get("WON").copied(), Some(2000));
}
