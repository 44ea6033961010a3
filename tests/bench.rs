//! `anarchon bench` as a user runs it: the real binary against a real SQLite
//! store in a temporary directory. Speed is never asserted here; only that
//! every figure is there and every path did claims.

use std::process::{Command, Output};

use serde_json::Value;

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_anarchon"))
        .arg("bench")
        .args(args)
        .output()
        .unwrap()
}

fn json_of(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

fn positive(v: &Value, key: &str) -> f64 {
    let x = v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing or not a number in {v}"));
    assert!(x > 0.0, "{key} = {x} in {v}");
    x
}

#[test]
fn sqlite_json_has_every_figure() {
    let v = json_of(&bench(&["--seconds", "0.5", "--clients", "2", "--json"]));
    assert_eq!(v["backend"], "sqlite");
    assert_eq!(v["clients"], 2);
    assert_eq!(v["sidecar_mode"], "process");
    for key in [
        "sidecar_claims_per_s",
        "raw_claims_per_s",
        "ratio",
        "p50_ms",
        "p99_ms",
        "ready_ms",
        "rss_idle_mib",
        "rss_load_mib",
    ] {
        positive(&v, key);
    }
    assert!(v["overhead_p99_ms"].is_number(), "{v}");
    assert_eq!(v["sidecar"]["errors"], 0, "{v}");
    assert_eq!(v["raw"]["errors"], 0, "{v}");
    assert!(
        v.get("etcd_claims_per_s").is_none(),
        "etcd was not asked for: {v}"
    );
    // Peak under load is never below the idle reading.
    assert!(positive(&v, "rss_load_mib") >= positive(&v, "rss_idle_mib") * 0.9);
}

#[test]
fn aging_finishes_every_run_and_measures_again() {
    let v = json_of(&bench(&[
        "--seconds",
        "0.3",
        "--clients",
        "2",
        "--age",
        "300",
        "--age-tasks",
        "8",
        "--age-retention-ms",
        "1",
        "--age-prune-every-ms",
        "50",
        "--json",
    ]));
    let aged = &v["aged"];
    assert_eq!(aged["runs"], 300, "{v}");
    assert_eq!(aged["errors"], 0, "{v}");
    positive(aged, "raw_claims_per_s");
    positive(aged, "sidecar_claims_per_s");
    positive(aged, "raw_aged_vs_fresh");
}

#[test]
fn in_process_sidecar_still_works() {
    let v = json_of(&bench(&[
        "--seconds",
        "0.3",
        "--clients",
        "1",
        "--sidecar",
        "in-process",
        "--against",
        "none",
        "--json",
    ]));
    positive(&v, "sidecar_claims_per_s");
    assert!(v["rss_idle_mib"].is_null(), "{v}");
    assert!(v.get("raw_claims_per_s").is_none(), "{v}");
}

#[cfg(not(feature = "etcd"))]
#[test]
fn etcd_without_the_feature_says_how_to_get_it() {
    let out = bench(&["--against", "etcd", "--seconds", "0.1", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--features etcd"), "{err}");
    assert!(out.stdout.is_empty(), "nothing measured, nothing printed");
}

/// Only in a build with the feature; `etcd` (Debian's etcd-server) must be
/// installed then, and scripts/test.sh installs it.
#[cfg(feature = "etcd")]
#[test]
fn etcd_path_claims() {
    let v = json_of(&bench(&[
        "--against",
        "etcd",
        "--seconds",
        "0.5",
        "--clients",
        "2",
        "--json",
    ]));
    positive(&v, "etcd_claims_per_s");
    positive(&v, "etcd_p99_ms");
    positive(&v, "raw_claims_per_s");
    assert_eq!(v["etcd"]["errors"], 0, "{v}");
}
