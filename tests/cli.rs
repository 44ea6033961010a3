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

    let out = anarchon(&["check", "--worker-threads", "5000"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("worker_threads"));

    let out = Command::new(BIN)
        .args(["serve"])
        .env("ANARCHON_LEASE_MS", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("lease_ms"));

    let out = Command::new(BIN)
        .args(["check"])
        .env("ANARCHON_LISTEN_UNIX_GROUP", "maybe")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("listen_unix_group"));
    let out = anarchon(&["check", "--listen-unix-group", "maybe"]);
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--listen-unix-group"));

    // A misspelt PostgreSQL option is refused before anything connects: the
    // driver would only log it (`sslmod=require` would not require TLS).
    for (url, name) in [
        ("postgres://u@127.0.0.1:1/db?sslmod=require", "\"sslmod\""),
        ("postgres://u@127.0.0.1:1/db?max_bach=4", "\"max_bach\""),
    ] {
        let out = anarchon(&["check", "--backend", url]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{url}: {err}");
        assert!(
            err.contains("backend") && err.contains(name),
            "{url}: {err}"
        );
    }
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
    // Wait until they have linked, so the first snapshot has B in it.
    common::mesh::linked_blocking(&[a, b]);
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

/// `serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --ready-file F`:
/// the kernel picks both ports, the ready file (written atomically once
/// bound: no `F.tmp` is left) says which, and both answer there.
#[test]
fn ready_file_reports_ports_that_answer() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let mut child = common::process::serve_on_any_port()
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--ready-file")
        .arg(&ready)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let bound = loop {
        if let Some(b) = common::process::read_ready_file(&ready) {
            break b;
        }
        assert!(child.try_wait().unwrap().is_none(), "serve exited");
        assert!(
            std::time::Instant::now() < deadline,
            "no ready file written"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let (grpc, admin) = (bound["grpc"], bound["admin"]);
    assert_eq!(bound.len(), 2, "{bound:?}");
    assert!(grpc.port() != 0 && admin.port() != 0, "{bound:?}");
    assert!(grpc.ip().is_loopback() && admin.ip().is_loopback());
    assert!(!dir.path().join("ready.tmp").exists());
    let out = anarchon(&[
        "claim",
        "ready-file",
        "--slot",
        "now/1m",
        "--json",
        "--server",
        &grpc.to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["outcome"], "WON");
    assert_eq!(
        common::process::http_get_blocking(admin, "/healthz"),
        "ok\n"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// `serve --listen-unix PATH`: the ready file names the socket, which
/// `--listen-unix-group=true` makes mode 0660, the command line's
/// `--server unix:PATH` claims through it, and SIGTERM removes it.
#[test]
fn serve_listens_on_a_unix_socket_for_applications() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("app.sock");
    let mut serve = Sidecar::start(
        &dir.path().join("data"),
        &[
            "--listen-unix",
            sock.to_str().unwrap(),
            "--listen-unix-group=true",
        ],
    );
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o660, "{mode:o}");
    let text = std::fs::read_to_string(&serve.ready_file).unwrap();
    assert!(
        text.lines()
            .any(|l| l == format!("unix={}", sock.display())),
        "{text}"
    );
    let server = format!("unix:{}", sock.display());
    let out = anarchon(&[
        "claim", "uds-cli", "--slot", "now/1m", "--json", "--server", &server,
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["outcome"], "WON");
    // TLS is refused on a Unix socket, naming the flag.
    let out = anarchon(&[
        "claim",
        "uds-cli",
        "--slot",
        "now/1m",
        "--server",
        &server,
        "--tls-ca",
        "/nonexistent",
    ]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--tls-ca"),
        "{out:?}"
    );
    let status = serve.terminate();
    assert!(status.success(), "{status:?}");
    assert!(!sock.exists(), "the socket file outlived serve");
}

/// `worker_threads` sizes the runtime `serve` runs on: `/metrics` reports the
/// workers the runtime has, by default (one) and with the flag.
#[test]
fn serve_runs_on_the_configured_worker_threads() {
    for (flags, n) in [(&[][..], 1), (&["--worker-threads", "3"][..], 3)] {
        let dir = tempfile::tempdir().unwrap();
        let sidecar = Sidecar::start(dir.path(), flags);
        let metrics = common::process::http_get_blocking(sidecar.admin, "/metrics");
        let line = metrics
            .lines()
            .find(|l| l.starts_with("anarchon_runtime_workers "))
            .unwrap_or_else(|| panic!("no anarchon_runtime_workers in {metrics}"));
        assert_eq!(line, format!("anarchon_runtime_workers {n}"), "{flags:?}");
    }
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
    // Nobody dials these: the kernel picks the ports.
    let (l, a) = ("127.0.0.1:0".to_string(), "127.0.0.1:0".to_string());
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

/// Runs `anarchon serve` against a backend URL and returns its output and how
/// long it took, killing it after `limit`.
fn serve_until_exit(
    backend: &str,
    limit: std::time::Duration,
) -> (Option<i32>, String, std::time::Duration) {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let t = std::time::Instant::now();
    let mut child = common::process::serve_on_any_port()
        .args([
            "--data-dir",
            dir.path().to_str().unwrap(),
            "--backend",
            backend,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            return (
                st.code(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
                t.elapsed(),
            );
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            return (
                None,
                String::from_utf8_lossy(&out.stderr).into_owned(),
                t.elapsed(),
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Issue 21 (1): a server that accepts TCP and never answers (a wrong port,
/// a stuck proxy) must not hold `serve` at "starting": every backend gives
/// up within its connect timeout and says why.
#[test]
fn every_backend_gives_up_on_a_silent_server() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    // Accept every connection and keep it open without a byte.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in silent.incoming().flatten() {
            held.push(s);
        }
    });
    for url in [
        format!("nats://{addr}"),
        format!("amqp://guest:guest@{addr}/%2f"),
        format!("redis://{addr}/0?strategy=lease"),
        format!("postgres://postgres@{addr}/test"),
    ] {
        let (code, stderr, took) = serve_until_exit(&url, std::time::Duration::from_secs(30));
        assert!(
            code.is_some_and(|c| c != 0),
            "{url}: still running after {took:?} (exit {code:?}):\n{stderr}"
        );
        assert!(
            took < std::time::Duration::from_secs(15),
            "{url}: gave up only after {took:?}"
        );
        assert!(
            stderr.contains("cannot open backend"),
            "{url}: the error does not say why:\n{stderr}"
        );
        assert!(
            !stderr.contains('\u{1b}'),
            "colour codes in logs written to a pipe: {stderr:?}"
        );
        eprintln!("{url}: gave up after {took:.1?}");
    }
}

/// Issue 21 (11): Ctrl-C (SIGINT) to `hold` stops the command, releases the
/// run as FAILED and exits 130 as a shell expects (SIGTERM: 143).
#[test]
fn sigint_to_hold_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let s = Sidecar::start(dir.path(), &[]);
    let server = s.addr.to_string();
    for (sig, want) in [
        (nix::sys::signal::Signal::SIGINT, 130),
        (nix::sys::signal::Signal::SIGTERM, 143),
    ] {
        let job = format!("sig-{}", want);
        let mut child = Command::new(BIN)
            .args(["hold", &job, "--server", &server, "--", "sleep", "30"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // The signal goes to a hold that runs its command.
        wait_for_a_child_of(child.id());
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(want), "{sig:?}");
        let out = anarchon(&["history", &job, "--server", &server, "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["runs"][0]["state"], "FAILED", "{v}");
    }
}

/// Polls (up to 10 s) until process `pid` has a child: `hold` won its
/// claim and started its command.
fn wait_for_a_child_of(pid: u32) {
    let parent_of = |stat: String| -> Option<u32> {
        // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let has_child = std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read_to_string(e.path().join("stat"))
                .ok()
                .and_then(parent_of)
                == Some(pid)
        });
        if has_child {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} never started its command"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Issue 21 (10): a client error shows its cause, not a bare "transport error".
#[test]
fn client_errors_show_the_cause() {
    let closed = common::process::free_addr().to_string();
    let out = anarchon(&["claim", "x", "--server", &closed]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("transport error: ") && err.contains("Connection refused"),
        "{err}"
    );
    let out = anarchon(&["history", "x", "--server", &closed, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Connection refused"),
        "{v}"
    );
}

/// Issue 21 (--help): every flag and argument of every subcommand has a
/// description, no default is printed twice, and the duration flags take
/// one syntax.
#[test]
fn help_describes_every_flag() {
    let subcommands = [
        "serve", "claim", "renew", "release", "history", "hold", "lock", "cron", "peers", "watch",
        "check", "bench",
    ];
    for sub in subcommands {
        let out = anarchon(&[sub, "-h"]);
        assert_eq!(out.status.code(), Some(0), "{sub}");
        let help = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut section = "";
        let lines: Vec<&str> = help.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let line = *line;
            if line.ends_with(':') && !line.starts_with(' ') {
                section = line;
                continue;
            }
            if !matches!(section, "Options:" | "Arguments:") || !line.starts_with("  ") {
                continue;
            }
            assert!(
                line.matches("[default:").count() <= 1,
                "`anarchon {sub}`: default printed twice: {line:?}"
            );
            let t = line.trim_start();
            if !(t.starts_with('-') || t.starts_with('<') || t.starts_with('[')) {
                continue; // a description line
            }
            let indent = line.len() - t.len();
            // The flag (and its value name) end at the first double space;
            // in clap's long layout the description is on the next line,
            // indented deeper.
            let inline = t
                .split_once("  ")
                .is_some_and(|(_, d)| !d.trim().is_empty());
            let below = lines.get(i + 1).is_some_and(|n| {
                let nt = n.trim_start();
                !nt.is_empty() && n.len() - nt.len() > indent
            });
            let described = inline || below;
            assert!(
                described,
                "`anarchon {sub}`: no description: {line:?}\n{help}"
            );
        }
    }
    // Client subcommands show their defaults, too.
    let help = String::from_utf8_lossy(&anarchon(&["claim", "-h"]).stdout).into_owned();
    for want in ["[default: the sidecar's lease_ms", "--ttl", "--lease"] {
        assert!(help.contains(want), "claim -h lacks {want:?}:\n{help}");
    }
    let help = String::from_utf8_lossy(&anarchon(&["cron", "-h"]).stdout).into_owned();
    assert!(help.contains("7 with a year"), "{help}");
    // One duration syntax: units or bare milliseconds, everywhere. (A long
    // expiry, so that the self-fence never caps these short leases' valid_for.)
    let dir = tempfile::tempdir().unwrap();
    let s = Sidecar::start(dir.path(), &["--expiry-ms", "30000"]);
    let server = s.addr.to_string();
    let out = anarchon(&[
        "claim",
        "dur-job",
        "--ttl",
        "5s",
        "--max-late",
        "2m",
        "--server",
        &server,
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["valid_for_ms"], 5000);
    let token = v["token"].as_str().unwrap().to_owned();
    let out = anarchon(&[
        "renew", "dur-job", "--slot", "0", "--token", &token, "--server", &server, "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["valid_for_ms"], 5000, "renew keeps the claimed lease");
    let out = anarchon(&[
        "renew",
        "dur-job",
        "--slot",
        "0",
        "--token",
        &token,
        "--lease-ms",
        "7000",
        "--server",
        &server,
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["valid_for_ms"], 7000, "a bare number is milliseconds");
    // `--lease-ms 0` and a lease below the floor are refused, naming the field.
    let out = anarchon(&["claim", "dur-job2", "--lease-ms", "0", "--server", &server]);
    assert_eq!(out.status.code(), Some(2));
    let out = anarchon(&["claim", "dur-job2", "--lease", "1ms", "--server", &server]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("lease_ms"),
        "{out:?}"
    );
    // `lock` is `hold`.
    let out = anarchon(&["lock", "dur-lock", "--server", &server, "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// Issue 21 (11): `history` text shows RFC 3339 times (`-` while running),
/// `fencing`, and a readable retention (`7 days`); `--json` keeps
/// milliseconds. Once backends print no `valid_for` (they have no lease).
#[test]
fn history_text_and_once_backend_claims_read_well() {
    let dir = tempfile::tempdir().unwrap();
    let s = Sidecar::start(dir.path(), &[]);
    let server = s.addr.to_string();
    let out = anarchon(&["claim", "hist-job", "--slot", "now/1m", "--server", &server]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = anarchon(&["history", "hist-job", "--server", &server]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let row = text.lines().nth(1).unwrap_or_default();
    assert!(text.starts_with("SLOT"), "{text}");
    assert!(text.contains("FENCING"), "{text}");
    assert!(
        row.contains("RUNNING") && row.contains('T') && row.contains('Z') && row.ends_with('-'),
        "claimed at in RFC 3339, finished at `-`: {row:?}"
    );
    assert!(text.contains("kept 7 days"), "{text}");
    let out = anarchon(&["history", "hist-job", "--server", &server, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["runs"][0]["claimed_at_ms"].as_i64().unwrap() > 1_700_000_000_000);

    if !common::services::reachable("127.0.0.1:6379") {
        assert!(!common::services::in_ci(), "redis is down under CI");
        eprintln!("SKIPPED once-backend part: no redis on 6379");
        return;
    }
    let once_dir = tempfile::tempdir().unwrap();
    let url = format!(
        "redis://127.0.0.1:6379/0?strategy=stream-id&prefix=cli{:08x}",
        rand::random::<u32>()
    );
    let o = Sidecar::start(once_dir.path(), &["--backend", &url]);
    let out = anarchon(&["claim", "once-job", "--server", &o.addr.to_string()]);
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(line.starts_with("WON"), "{line}");
    assert!(
        !line.contains("valid_for"),
        "a once backend has no lease: {line}"
    );
}

/// Issue 21 (6): a lone sidecar's `watch` starts with itself; a configured
/// `--peer` that never answers is listed by `peers` (address, last error),
/// counted in `anarchon_links{state="UNREACHABLE"}` and logged.
#[test]
fn watch_shows_self_and_peers_shows_an_unreachable_peer() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let nobody = common::process::free_addr().to_string();
    let s = Sidecar::start(
        dir.path(),
        &[
            "--peer",
            &nobody,
            "--heartbeat-ms",
            "100",
            "--expiry-ms",
            "1000",
        ],
    );
    let server = s.addr.to_string();
    let mut w = Command::new(BIN)
        .args(["watch", "--json", "--server", &server])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(w.stdout.take().unwrap()).lines();
    let first: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let _ = w.kill();
    let _ = w.wait();
    assert_eq!(first["event"], "SNAPSHOT", "{first}");
    assert_eq!(
        first["peer"]["address"],
        server.as_str(),
        "self first: {first}"
    );

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let peer = loop {
        let out = anarchon(&["peers", "--json", "--server", &server]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let found = v["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["address"] == nobody.as_str())
            .cloned();
        if let Some(p) = found {
            break p;
        }
        assert!(std::time::Instant::now() < deadline, "never listed: {v}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(peer["state"], "UNREACHABLE", "{peer}");
    assert!(
        peer["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("Connection refused")),
        "{peer}"
    );
    let text =
        String::from_utf8_lossy(&anarchon(&["peers", "--server", &server]).stdout).into_owned();
    assert!(
        text.contains(&nobody) && text.contains("UNREACHABLE"),
        "{text}"
    );
    let metrics = common::process::http_get_blocking(s.admin, "/metrics");
    assert!(
        metrics.contains("anarchon_links{state=\"UNREACHABLE\"} 1"),
        "{metrics}"
    );
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert!(
        log.contains("configured peer is unreachable") && log.contains(&nobody),
        "{log}"
    );
}
