//! Other people's tools against a real `anarchon serve` (issue 21, 9): the
//! Python `prometheus_client` parsers (text 0.0.4 and OpenMetrics) and
//! `grpcio-reflection`'s v1alpha client, run by `tests/tools/check_tools.py`.
//! `scripts/test.sh` installs them (scripts/services/extra-python-tools.sh);
//! outside CI a machine without them skips with a message, under `CI=true`
//! their absence is a failure.

mod common;

use std::process::Command;

use common::process::{Sidecar, BIN};

fn python_tools() -> Result<(), String> {
    let out = Command::new("python3")
        .args(["-c", "import prometheus_client, grpc, grpc_reflection"])
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn prometheus_parsers_and_python_reflection_accept_the_sidecar() {
    if let Err(e) = python_tools() {
        assert!(
            !common::services::in_ci(),
            "the Python tools are missing under CI (scripts/services/extra-python-tools.sh): {e}"
        );
        eprintln!("SKIPPED tools suite: prometheus_client/grpcio-reflection missing: {e}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Sidecar::start(dir.path(), &[]);
    let server = s.addr.to_string();
    // One claim, so the counters have samples.
    let out = Command::new(BIN)
        .args(["claim", "tools-job", "--server", &server])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/tools/check_tools.py"
        ))
        .args([&server, &s.admin.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
