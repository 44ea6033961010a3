//! The dashboard: its page and event stream over plain HTTP (always run), and
//! the browser suite: three real sidecars linked with `--peer` (heartbeat
//! 200 ms, expiry 1,500 ms) and their dashboard in Debian's headless
//! Chromium driven by `tests/dashboard/browser.mjs` (playwright-core).
//!
//! `tests/dashboard/setup.sh` installs chromium (apt-get) and playwright-core
//! (`npm ci`) when missing. If that fails the browser suite prints
//! `SKIPPED dashboard suite: …`, or fails under `CI=true`.
//!
//! The screenshot goes to `$CARGO_TARGET_TMPDIR/dashboard.png`; with
//! `ANARCHON_UPDATE_SCREENSHOT=1` also to `docs/dashboard.png`.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anarchon::mesh::Identity;
use anarchon::proto as pb;
use common::claims_client;
use common::inproc::InProc;
use common::process::{free_addr, Sidecar};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// The browser suite measures time: the tests of this file take turns.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const HB: u64 = 200;
const EXPIRY: u64 = 1500;
const TOKEN: &str = "dash-s3cret";
const HOSTILE_LABEL: &str =
    r#"<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">"#;

fn authed<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    r
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

// ---- plain HTTP -------------------------------------------------------------

/// One raw HTTP/1.1 response: status line, headers, and the body as it
/// streams in (chunked framing left in place; every SSE frame is one chunk).
struct Raw {
    stream: tokio::net::TcpStream,
    text: String,
}

impl Raw {
    async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> Raw {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        stream
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n").as_bytes())
            .await
            .unwrap();
        Raw {
            stream,
            text: String::new(),
        }
    }

    /// Reads until `needle` appears after `from`; returns where it starts.
    async fn until(&mut self, from: usize, needle: &str, within: Duration) -> usize {
        let end = tokio::time::Instant::now() + within;
        loop {
            if let Some(i) = self.text[from.min(self.text.len())..].find(needle) {
                return from + i;
            }
            let mut buf = [0u8; 8192];
            let n = tokio::time::timeout_at(end, self.stream.read(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("no {needle:?} within {within:?} in:\n{}", self.text))
                .unwrap();
            assert!(n > 0, "connection closed before {needle:?}:\n{}", self.text);
            self.text.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }

    fn status(&self) -> &str {
        self.text.split(' ').nth(1).unwrap_or("")
    }

    fn header(&self, name: &str) -> Option<String> {
        let head = self.text.split("\r\n\r\n").next()?;
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }

    /// The JSON of the first `event` frame at or after `from`, and where
    /// that frame ends.
    async fn event(&mut self, from: usize, event: &str) -> (serde_json::Value, usize) {
        let at = self
            .until(
                from,
                &format!("event: {event}\ndata: "),
                Duration::from_secs(5),
            )
            .await;
        let start = at + event.len() + 14;
        let end = self.until(start, "\n\n", Duration::from_secs(5)).await;
        let v = serde_json::from_str(&self.text[start..end])
            .unwrap_or_else(|e| panic!("bad {event} data: {e}: {}", &self.text[start..end]));
        (v, end)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_embedded_and_the_stream_sits_behind_the_token() {
    let _turn = TURN.lock().await;
    let secrets = tempfile::tempdir().unwrap();
    let token_file = secrets.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let tf = token_file.clone();
    let s = InProc::start(move |c| c.auth_token_file = Some(tf)).await;

    // The page and its assets: open (they hold no data), strict CSP.
    for (path, kind, needle) in [
        ("/", "text/html", "ui/app.js"),
        ("/ui", "text/html", "ui/app.css"),
        ("/ui/app.js", "text/javascript", "api/v1/events"),
        ("/ui/app.css", "text/css", ".state-EXPIRED"),
    ] {
        let mut r = Raw::get(s.admin, path, None).await;
        r.until(0, needle, Duration::from_secs(5)).await;
        assert_eq!(r.status(), "200", "{path}");
        assert!(
            r.header("content-type").unwrap().starts_with(kind),
            "{path}"
        );
        let csp = r.header("content-security-policy").unwrap();
        assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"));
    }
    let js = common::http_get(s.admin, "/ui/app.js", None).await;
    assert!(
        !js.contains("innerHTML") && !js.contains("insertAdjacentHTML"),
        "the page renders with textContent only"
    );

    // The stream: 401 without the token or with a wrong one.
    for token in [None, Some("wrong")] {
        let mut r = Raw::get(s.admin, "/api/v1/events", token).await;
        r.until(0, "\r\n\r\n", Duration::from_secs(5)).await;
        assert_eq!(r.status(), "401", "{token:?}");
    }
    let mut r = Raw::get(s.admin, "/api/v1/events", Some(TOKEN)).await;
    let (snap, mut at) = r.event(0, "snapshot").await;
    assert_eq!(r.status(), "200");
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("text/event-stream")
    );
    let node = snap["node"].as_str().unwrap().to_owned();
    assert_eq!(snap["self"]["node"], node.as_str());
    assert_eq!(snap["self"]["state"], "ALIVE");
    assert_eq!(snap["heartbeat_ms"], 100);
    assert_eq!(snap["expiry_ms"], 1000);
    assert!(snap["peers"].as_array().unwrap().is_empty());
    assert!(snap["runs"].as_array().unwrap().is_empty());
    assert_eq!(snap["stats"]["claims"].as_array().unwrap().len(), 6);

    // Runs: a win, a takeover, a fenced renewal and a release, as they happen.
    let mut c = claims_client(s.addr).await;
    let claim = |lease_ms| pb::ClaimRequest {
        job: "dash/lock".into(),
        slot_ms: 0,
        lease_ms,
        ..Default::default()
    };
    let first = c.claim(authed(claim(300))).await.unwrap().into_inner();
    assert_eq!(first.outcome, pb::Outcome::Won as i32);
    let (ev, next) = r.event(at, "run").await;
    at = next;
    assert_eq!(ev["kind"], "won");
    assert_eq!(ev["op"], "claim");
    assert_eq!(ev["run"]["job"], "dash/lock");
    assert_eq!(ev["run"]["attempt"], 1);
    assert_eq!(ev["run"]["holder"], format!("{node}/1"));
    common::until_lapsed(first.lease_until_ms).await;
    let second = c.claim(authed(claim(60_000))).await.unwrap().into_inner();
    assert_eq!(
        (second.outcome, second.attempt),
        (pb::Outcome::Won as i32, 2)
    );
    let (ev, next) = r.event(at, "run").await;
    at = next;
    assert_eq!(
        (ev["kind"].as_str(), ev["run"]["attempt"].as_u64()),
        (Some("won"), Some(2))
    );
    let st = c
        .renew(authed(pb::RenewRequest {
            job: "dash/lock".into(),
            slot_ms: 0,
            token: first.token.clone(),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(st.code(), tonic::Code::FailedPrecondition);
    let (ev, next) = r.event(at, "run").await;
    at = next;
    assert_eq!(ev["kind"], "fenced");
    assert_eq!(ev["op"], "renew");
    assert_eq!(ev["reason"], "taken_over");
    assert_eq!(ev["run"]["fenced"], 1);
    c.release(authed(pb::ReleaseRequest {
        job: "dash/lock".into(),
        slot_ms: 0,
        token: second.token.clone(),
        result: pb::ReleaseResult::Succeeded as i32,
    }))
    .await
    .unwrap();
    let (ev, next) = r.event(at, "run").await;
    at = next;
    assert_eq!(ev["kind"], "released");
    assert_eq!(ev["run"]["state"], "SUCCEEDED");
    assert!(ev["run"]["finished_at_ms"].as_i64().unwrap() > 0);
    // Counters follow within a second; tokens never travel.
    let (stats, _) = r.event(at, "stats").await;
    assert!(stats["claims"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["outcome"] == "WON" && c["backend"] == "sqlite" && c["n"] == 2));
    assert_eq!(stats["takeovers"], 1);
    assert_eq!(stats["fenced"], 1);
    for t in [&first.token, &second.token] {
        assert!(!r.text.contains(t.as_str()), "a token reached the stream");
    }
    // A keepalive comment arrives within its period.
    r.until(at, ": keepalive\n\n", Duration::from_secs(5)).await;
    // A new stream starts from a snapshot that already holds the run.
    let mut r2 = Raw::get(s.admin, "/api/v1/events", Some(TOKEN)).await;
    let (snap, _) = r2.event(0, "snapshot").await;
    let runs = snap["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (runs[0]["attempt"].as_u64(), runs[0]["state"].as_str()),
        (Some(2), Some("SUCCEEDED"))
    );
}

// ---- the browser suite ----------------------------------------------------------

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Chromium and playwright-core, or why not.
fn browser_setup() -> Result<String, String> {
    let out = std::process::Command::new("bash")
        .arg(manifest_dir().join("tests/dashboard/setup.sh"))
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run tests/dashboard/setup.sh: {e}"))?;
    let err = String::from_utf8_lossy(&out.stderr);
    eprint!("{err}");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(err
            .lines()
            .last()
            .unwrap_or("tests/dashboard/setup.sh failed")
            .to_owned())
    }
}

fn node_of(dir: &Path) -> String {
    // Creating the identity first tells the test the node id in advance.
    Identity::load_or_create(dir).unwrap().node
}

/// The runs the page must then show, claimed through sidecar 0.
async fn make_runs(addr: SocketAddr) -> serde_json::Value {
    let mut c = claims_client(addr).await;
    // A minute's slot, never near the end of the lateness the claims below
    // are allowed (60 s by default): the minute that starts within the next
    // 10 s, else the current one. Taken as the current minute alone, a test
    // that started in a minute's last second or two (these claims take that
    // long, a lease lapses between them) was told LATE.
    let minute = ((epoch_ms() as i64 + 10_000) / 60_000) * 60_000;
    let won = |r: &pb::ClaimResponse, attempt| {
        assert_eq!(
            (pb::Outcome::try_from(r.outcome).unwrap(), r.attempt),
            (pb::Outcome::Won, attempt),
            "{r:?}"
        );
    };
    // A run that is still running.
    let running = c
        .claim(authed(pb::ClaimRequest {
            job: "nightly-report".into(),
            slot_ms: minute,
            lease_ms: 120_000,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    won(&running, 1);
    // Someone else asks for it too: RUNNING.
    let again = c
        .claim(authed(pb::ClaimRequest {
            job: "nightly-report".into(),
            slot_ms: minute,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.outcome, pb::Outcome::Running as i32);
    // A lock whose holder stops renewing: taken over, the old token fenced,
    // the new holder succeeds.
    let lock = |lease_ms| pb::ClaimRequest {
        job: "db-migrate".into(),
        slot_ms: 0,
        lease_ms,
        ..Default::default()
    };
    let first = c.claim(authed(lock(600))).await.unwrap().into_inner();
    won(&first, 1);
    common::until_lapsed(first.lease_until_ms).await;
    let second = c.claim(authed(lock(60_000))).await.unwrap().into_inner();
    won(&second, 2);
    let st = c
        .renew(authed(pb::RenewRequest {
            job: "db-migrate".into(),
            slot_ms: 0,
            token: first.token,
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(st.code(), tonic::Code::FailedPrecondition);
    c.release(authed(pb::ReleaseRequest {
        job: "db-migrate".into(),
        slot_ms: 0,
        token: second.token,
        result: pb::ReleaseResult::Succeeded as i32,
    }))
    .await
    .unwrap();
    // A run that failed.
    let failed = c
        .claim(authed(pb::ClaimRequest {
            job: "billing/export".into(),
            slot_ms: minute,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    won(&failed, 1);
    c.release(authed(pb::ReleaseRequest {
        job: "billing/export".into(),
        slot_ms: minute,
        token: failed.token,
        result: pb::ReleaseResult::Failed as i32,
    }))
    .await
    .unwrap();
    serde_json::json!({
        "instance": running.holder.as_ref().map(|h| h.instance).unwrap_or_default(),
        "running": { "job": "nightly-report", "slot_ms": minute },
        "takeover": { "job": "db-migrate", "slot_ms": 0 },
        "failed": { "job": "billing/export", "slot_ms": minute },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dashboard_in_headless_chromium() {
    let _turn = TURN.lock().await;
    let chromium = match browser_setup() {
        Ok(path) => path,
        Err(why) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("dashboard suite cannot run under CI: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED dashboard suite: {why}");
            return;
        }
    };

    let root = tempfile::tempdir().unwrap();
    let token_file = root.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let addrs: Vec<_> = (0..3).map(|_| free_addr()).collect();
    let dirs: Vec<_> = (0..3).map(|i| root.path().join(format!("n{i}"))).collect();
    let nodes: Vec<String> = dirs.iter().map(|d| node_of(d)).collect();
    let names = ["alpha", "bravo", "charlie"];
    const HOSTILE: usize = 1;
    const KILL: usize = 2;
    let mut sidecars: Vec<Sidecar> = (0..3)
        .map(|i| {
            let mut flags: Vec<String> = vec![
                // One store for the mesh (sidecars on different stores refuse to link).
                "--backend".into(),
                format!("sqlite://{}", root.path().join("shared.db").display()),
                "--heartbeat-ms".into(),
                HB.to_string(),
                "--expiry-ms".into(),
                EXPIRY.to_string(),
                "--auth-token-file".into(),
                token_file.display().to_string(),
                "--label".into(),
                format!("node_name={}", names[i]),
                "--label".into(),
                format!("zone=zone-{}", i + 1),
            ];
            if i == HOSTILE {
                flags.extend(["--label".into(), format!("note={HOSTILE_LABEL}")]);
            }
            common::mesh::start_in_mesh(&dirs[i], &addrs, i, flags)
        })
        .collect();

    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let mut shots = vec![tmp.join("dashboard.png")];
    if std::env::var("ANARCHON_UPDATE_SCREENSHOT").as_deref() == Ok("1") {
        shots.push(manifest_dir().join("docs/dashboard.png"));
    }
    let shots = std::env::join_paths(&shots).unwrap();
    let mut child = tokio::process::Command::new("node")
        .arg(manifest_dir().join("tests/dashboard/browser.mjs"))
        .current_dir(manifest_dir().join("tests/dashboard"))
        .env("CHROMIUM", &chromium)
        .env("DASH_ADMIN", format!("http://{}", sidecars[0].admin))
        .env("DASH_TOKEN", TOKEN)
        .env("DASH_NODES", serde_json::to_string(&nodes).unwrap())
        .env("DASH_KILL", KILL.to_string())
        .env("DASH_HOSTILE", HOSTILE.to_string())
        .env("DASH_HOSTILE_LABEL", HOSTILE_LABEL)
        .env("DASH_HEARTBEAT_MS", HB.to_string())
        .env("DASH_EXPIRY_MS", EXPIRY.to_string())
        .env(
            "DASH_KEEPALIVE_MS",
            anarchon::server::dashboard::KEEPALIVE
                .as_millis()
                .to_string(),
        )
        .env("DASH_SCREENSHOTS", &shots)
        .env("DASH_FAILSHOT", tmp.join("dashboard-failure"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("run node tests/dashboard/browser.mjs");
    let mut to_node = child.stdin.take().unwrap();
    let mut from_node = BufReader::new(child.stdout.take().unwrap()).lines();

    let started = Instant::now();
    let mut expired_ms = None;
    let mut done = false;
    while let Some(line) = tokio::time::timeout(Duration::from_secs(120), from_node.next_line())
        .await
        .expect("the browser suite stalled")
        .unwrap()
    {
        eprintln!("[browser {:>5.1}s] {line}", started.elapsed().as_secs_f64());
        if let Some(what) = line.strip_prefix("NEED ") {
            let detail = match what {
                "kill" => {
                    let at = epoch_ms();
                    sidecars[KILL].kill();
                    at.to_string()
                }
                "claims" => make_runs(addrs[0]).await.to_string(),
                "restart-killed" => {
                    sidecars[KILL].restart();
                    String::new()
                }
                "freeze" | "thaw" => {
                    let sig = if what == "freeze" {
                        Signal::SIGSTOP
                    } else {
                        Signal::SIGCONT
                    };
                    kill(Pid::from_raw(sidecars[0].pid() as i32), sig).unwrap();
                    String::new()
                }
                "restart-self" => {
                    sidecars[0].restart();
                    String::new()
                }
                other => panic!("the browser suite asked for {other:?}"),
            };
            to_node
                .write_all(format!("OK {what} {detail}\n").as_bytes())
                .await
                .unwrap();
        } else if line == "DONE" {
            done = true;
        } else if let Some(ms) = line.strip_prefix("RESULT expired_visible_ms=") {
            expired_ms = ms.parse::<u64>().ok();
        }
    }
    let status = child.wait().await.unwrap();
    assert!(
        status.success() && done,
        "the browser suite failed ({status}); see its output above"
    );
    let ms = expired_ms.expect("no EXPIRED latency reported");
    eprintln!(
        "dashboard: EXPIRED visible {ms} ms after SIGKILL (expiry {EXPIRY} ms, bound {} ms)",
        EXPIRY + 1000
    );
    assert!(ms <= EXPIRY + 1000);
}
