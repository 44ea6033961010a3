//! The binary: config errors exit 64 naming the key, client subcommands and
//! `hold -- CMD` exit codes, SIGTERM drains and hands held runs over.

mod common;

use std::process::Command;

use common::process::{Sidecar, BIN};

fn anarchon(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).output().unwrap()
}

#[test]
fn bad_config_exits_64_naming_the_key() {
    let out = anarchon(&["serve", "--heartbeat-ms", "10"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("heartbeat_ms"));

    let out = anarchon(&["serve", "--heartbeat-ms", "1000", "--expiry-ms", "2000"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expiry_ms"));

    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("anarchon.toml");
    std::fs::write(&f, "listen = \"127.0.0.1:1\"\nbogus_key = 1\n").unwrap();
    let out = anarchon(&["serve", "--config", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bogus_key"));

    let out = Command::new(BIN)
        .args(["serve"])
        .env("ANARCHON_LEASE_MS", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("lease_ms"));
}

#[test]
fn claim_hold_release_history_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let s = Sidecar::start(dir.path(), &[]);
    let server = s.addr.to_string();
    let sv = ["--server", server.as_str()];

    let out = anarchon(
        &[
            &["claim", "cli-job", "--slot", "now/1m", "--json"][..],
            &sv[..],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["outcome"], "WON");
    let token = v["token"].as_str().unwrap().to_owned();

    // Not won: exit 3.
    let out = anarchon(&[&["claim", "lock-a"][..], &sv[..]].concat());
    assert_eq!(out.status.code(), Some(0));
    let out = anarchon(&[&["claim", "lock-a"][..], &sv[..]].concat());
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("RUNNING"));

    // hold: the command sees the run in its environment and its exit status
    // becomes ours and the run's result.
    let marker = dir.path().join("env.txt");
    let script = format!(
        "echo \"$ANARCHON_JOB $ANARCHON_SLOT_MS $ANARCHON_ATTEMPT ${{#ANARCHON_TOKEN}}\" > {}; exit 7",
        marker.display()
    );
    // A slot a little ahead (slots more than max_future_ms ahead are refused).
    let held_slot = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        + 60_000)
        .to_string();
    let out = anarchon(
        &[
            &["hold", "held-job", "--slot", &held_slot][..],
            &sv[..],
            &["--", "sh", "-c", &script][..],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap().trim(),
        format!("held-job {held_slot} 1 32")
    );
    let out = anarchon(&[&["history", "held-job", "--json"][..], &sv[..]].concat());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["runs"][0]["state"], "FAILED");

    // hold on a run that is held elsewhere does not run the command: exit 3.
    let out = anarchon(
        &[
            &["hold", "lock-a"][..],
            &sv[..],
            &[
                "--",
                "sh",
                "-c",
                &format!("touch {}", dir.path().join("ran").display()),
            ][..],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(3));
    assert!(!dir.path().join("ran").exists());

    // release with a wrong token is fenced: exit 1, reason in JSON.
    let slot = v["runs"][0]["slot_ms"].to_string();
    let out = anarchon(
        &[
            &[
                "release",
                "held-job",
                "--slot",
                &slot,
                "--token",
                &"b".repeat(32),
                "--json",
            ][..],
            &sv[..],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(1));
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["error"]["reason"], "fenced");
    drop(token);
}

#[test]
fn sigterm_drains_and_hands_held_runs_over() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("shared.db").display());
    let mut a = Sidecar::start(&dir.path().join("a"), &["--backend", &db]);
    let b = Sidecar::start(&dir.path().join("b"), &["--backend", &db]);
    let (sa, sb) = (a.addr.to_string(), b.addr.to_string());
    let out = anarchon(&[
        "claim",
        "leaver",
        "--slot",
        "0",
        "--lease-ms",
        "60000",
        "--server",
        &sa,
    ]);
    assert_eq!(out.status.code(), Some(0));
    let out = anarchon(&["claim", "leaver", "--slot", "0", "--server", &sb]);
    assert_eq!(out.status.code(), Some(3), "held by A");
    let status = a.terminate();
    assert!(status.success(), "SIGTERM is a clean exit: {status}");
    let out = anarchon(&["claim", "leaver", "--slot", "0", "--server", &sb, "--json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["attempt"], 2);
}

#[test]
fn check_validates_config_and_store() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let out = anarchon(&["check", "--data-dir", &d]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("store ok: sqlite"));
    let out = anarchon(&["check", "--backend", "ftp://nowhere"]);
    assert_eq!(out.status.code(), Some(64));
    let out = anarchon(&["check", "--backend", "sqlite:///proc/anarchon/cannot.db"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

#[test]
fn watch_streams_a_snapshot_then_changes() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (common::process::free_addr(), common::process::free_addr());
    // One store for the mesh (sidecars on different stores refuse to link).
    let db = format!("sqlite://{}", dir.path().join("shared.db").display());
    let t = [
        "--heartbeat-ms",
        "100",
        "--expiry-ms",
        "600",
        "--backend",
        db.as_str(),
    ];
    let _sa = Sidecar::start_at(
        &dir.path().join("a"),
        a,
        &[&["--peer", &b.to_string()][..], &t[..]].concat(),
    );
    let mut sb = Sidecar::start_at(
        &dir.path().join("b"),
        b,
        &[&["--peer", &a.to_string()][..], &t[..]].concat(),
    );
    // Let them link, so the first snapshot has B in it.
    std::thread::sleep(std::time::Duration::from_millis(800));
    let mut w = Command::new(BIN)
        .args(["watch", "--json", "--server", &a.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(w.stdout.take().unwrap()).lines();
    let first: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["event"], "SNAPSHOT");
    assert_eq!(first["peer"]["state"], "ALIVE");
    sb.kill();
    let expired = lines.find_map(|l| {
        let v: serde_json::Value = serde_json::from_str(&l.ok()?).ok()?;
        (v["event"] == "EXPIRED").then_some(v)
    });
    let _ = w.kill();
    let _ = w.wait();
    assert!(expired.is_some(), "no EXPIRED event streamed");
}

/// Two `serve` processes on one data dir would be two processes of one node
/// key: the second would bump the instance and the peers would take the live
/// first one for superseded. The second exits at once with status 1 naming
/// the first one's pid, and leaves the instance counter alone.
#[test]
fn a_second_serve_on_one_data_dir_exits_1_and_leaves_the_instance() {
    let dir = tempfile::tempdir().unwrap();
    let first = Sidecar::start(dir.path(), &[]);
    // The port listens before the instance is bumped: wait for the file.
    let instance_file = dir.path().join("instance");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !instance_file.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let instance = std::fs::read_to_string(&instance_file).unwrap();
    let (l, a) = (
        common::process::free_addr().to_string(),
        common::process::free_addr().to_string(),
    );
    let data_dir = dir.path().display().to_string();
    let mut second = Command::new(BIN)
        .args(["serve", "--listen", &l, "--admin-listen", &a])
        .args(["--data-dir", &data_dir])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let status = loop {
        if let Some(st) = second.try_wait().unwrap() {
            break Some(st);
        }
        if std::time::Instant::now() > deadline {
            let _ = second.kill();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let out = second.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let status = status.expect("the second serve kept running on the same data dir");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "data dir {data_dir} is in use by pid {}",
            first.pid()
        )),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("instance")).unwrap(),
        instance,
        "a failed start must not bump the instance"
    );

    // Neither does a start whose store cannot be opened.
    drop(first);
    let out = Command::new(BIN)
        .args(["serve", "--listen", &l, "--admin-listen", &a])
        .args(["--data-dir", &data_dir])
        .args(["--backend", "sqlite:///proc/no-such-dir/a.db"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("instance")).unwrap(),
        instance,
        "a start that failed on its store must not bump the instance"
    );
}

/// `--slot now` was a different slot every millisecond, so two instances
/// claiming "now" at once both won. `now/PERIOD` names one slot per period;
/// a bare `now` is refused (usage, status 2) naming the forms.
#[test]
fn slot_now_is_a_period_and_a_bare_now_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Sidecar::start(dir.path(), &[]);
    let server = s.addr.to_string();
    let claimers: Vec<_> = (0..2)
        .map(|_| {
            Command::new(BIN)
                .args(["claim", "dup-test", "--slot", "now/1m"])
                .args(["--server", &server])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // `OUTCOME job=dup-test slot=N …`
    let answers: Vec<(String, i64)> = claimers
        .into_iter()
        .map(|c| {
            let out = String::from_utf8(c.wait_with_output().unwrap().stdout).unwrap();
            let outcome = out.split_whitespace().next().unwrap_or_default().to_owned();
            let slot = out
                .split_whitespace()
                .find_map(|w| w.strip_prefix("slot=")?.parse().ok())
                .unwrap_or_else(|| panic!("no slot in {out:?}"));
            (outcome, slot)
        })
        .collect();
    for (_, slot) in &answers {
        assert_eq!(slot % 60_000, 0, "{answers:?}");
    }
    // Both name the same slot (unless a minute boundary fell between them),
    // so exactly one wins.
    if answers[0].1 == answers[1].1 {
        let won = answers.iter().filter(|(o, _)| o == "WON").count();
        assert_eq!(won, 1, "{answers:?}");
    }

    let out = anarchon(&["claim", "dup-test", "--slot", "now", "--server", &server]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    for form in ["now/1m", "now/5m", "now/1h", "now/1d"] {
        assert!(err.contains(form), "{err}");
    }
}

/// A slot far in the future (a typo, `i64::MAX`) is refused before the
/// store writes anything: INVALID_ARGUMENT naming `slot_ms`.
#[test]
fn a_slot_far_in_the_future_is_refused_naming_slot_ms() {
    let dir = tempfile::tempdir().unwrap();
    let s = Sidecar::start(dir.path(), &["--max-future-ms", "3600000"]);
    let server = s.addr.to_string();
    for slot in [i64::MAX.to_string(), "9999999999999".to_string()] {
        let out = anarchon(&[
            "claim", "far", "--slot", &slot, "--json", "--server", &server,
        ]);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("InvalidArgument"), "{text}");
        assert!(text.contains("slot_ms"), "{text}");
    }
    let out = anarchon(&["history", "far", "--json", "--server", &server]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["runs"].as_array().map(Vec::len), Some(0), "{v}");
}
