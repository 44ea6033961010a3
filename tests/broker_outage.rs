//! A broker restart in the middle of a run of claims: every answer is
//! `UNAVAILABLE` (or `LOST` with reason `unknown`) or correct, never a wrong
//! `WON`, and what was won before the restart is still won afterwards.
//!
//! These tests stop and start the machine's RabbitMQ and NATS servers, so
//! they run one at a time (a process-wide lock) and always leave the broker
//! running: a guard restarts it when it is dropped, even on panic.

mod common;

use std::collections::HashMap;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anarchon::claim::*;
use anarchon::error::Error;
use anarchon::store::{self, DynStore, StoreOptions};
use common::brokers::{self, amqp_url, nats_url, prefix};
use common::{holder, job, spec};

/// One outage at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn port_up(addr: &str) -> bool {
    TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_millis(300)).is_ok()
}

fn wait_port(addr: &str, up: bool, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if port_up(addr) == up {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Runs a command this test starts, killing it (by its pid) if it takes
/// longer than `within`.
fn run(cmd: &str, args: &[&str], within: Duration) -> bool {
    let mut child = match Command::new(cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{cmd} {args:?}: {e}");
            return false;
        }
    };
    let end = Instant::now() + within;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => {
                if !st.success() {
                    eprintln!("{cmd} {args:?}: {st}");
                }
                return st.success();
            }
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(100)),
            _ => {
                eprintln!("{cmd} {args:?}: no answer within {within:?}; killed");
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
        }
    }
}

// --- RabbitMQ -----------------------------------------------------------------

fn rabbitmq_stop() {
    assert!(
        run("rabbitmqctl", &["stop_app"], Duration::from_secs(60)),
        "rabbitmqctl stop_app"
    );
    assert!(
        wait_port(brokers::AMQP_ADDR, false, Duration::from_secs(30)),
        "RabbitMQ still listens after stop_app"
    );
}

fn rabbitmq_start() {
    if port_up(brokers::AMQP_ADDR) {
        return;
    }
    run("rabbitmqctl", &["start_app"], Duration::from_secs(90));
    if !wait_port(brokers::AMQP_ADDR, true, Duration::from_secs(60)) {
        // The whole node is down: start it.
        run("rabbitmq-server", &["-detached"], Duration::from_secs(30));
        wait_port(brokers::AMQP_ADDR, true, Duration::from_secs(120));
    }
}

/// Leaves RabbitMQ running, whatever happened.
struct RabbitGuard;

impl Drop for RabbitGuard {
    fn drop(&mut self) {
        rabbitmq_start();
    }
}

// --- NATS ---------------------------------------------------------------------

/// The pid of the nats-server listening on 4222, found by its executable.
fn nats_pid() -> Option<i32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        if exe.to_string_lossy() != "/usr/sbin/nats-server" {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        if args.windows(2).any(|w| w[0] == b"-p" && w[1] == b"4222") {
            return Some(pid);
        }
    }
    None
}

fn nats_stop() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let pid = nats_pid().expect("no nats-server on port 4222 to stop");
    kill(Pid::from_raw(pid), Signal::SIGTERM).expect("signal nats-server");
    let end = Instant::now() + Duration::from_secs(30);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        wait_port(brokers::NATS_ADDR, false, Duration::from_secs(10)),
        "NATS still listens after it was stopped"
    );
}

fn nats_start() {
    if port_up(brokers::NATS_ADDR) {
        return;
    }
    run(
        "start-stop-daemon",
        &[
            "--start",
            "--oknodo",
            "--background",
            "--exec",
            "/usr/sbin/nats-server",
            "--",
            "-a",
            "127.0.0.1",
            "-p",
            "4222",
            "-js",
            "-sd",
            "/var/lib/nats-server",
            "-l",
            "/var/log/nats-server.log",
        ],
        Duration::from_secs(30),
    );
    wait_port(brokers::NATS_ADDR, true, Duration::from_secs(60));
}

/// Leaves NATS running, whatever happened.
struct NatsGuard;

impl Drop for NatsGuard {
    fn drop(&mut self) {
        nats_start();
    }
}

// --- the run of claims ----------------------------------------------------------

/// Every answer of the run, by slot.
#[derive(Default)]
struct Tally {
    wins: HashMap<i64, usize>,
    answers: usize,
    unavailable: usize,
    unknown: usize,
    /// Answers given after the broker was back.
    answered_after: usize,
}

fn record(
    tally: &Mutex<Tally>,
    back: &AtomicBool,
    slot: i64,
    res: anarchon::error::Result<ClaimAnswer>,
) {
    let mut t = tally.lock().unwrap();
    t.answers += 1;
    if back.load(Ordering::SeqCst) {
        t.answered_after += 1;
    }
    match res {
        Ok(a) if a.outcome == Outcome::Won => {
            *t.wins.entry(slot).or_default() += 1;
        }
        Ok(a) if a.outcome == Outcome::Lost => {
            if a.reason == Some("unknown") {
                t.unknown += 1;
            }
        }
        Ok(a) => panic!("unexpected answer {a:?}"),
        Err(Error::Unavailable(_)) => t.unavailable += 1,
        Err(e) => panic!("an outage must answer UNAVAILABLE, got {e:?}"),
    }
}

/// Two claimers (own stores, own connections) claim fresh slots and
/// re-claim slots won before the outage, until `stop`.
async fn claimers(
    stores: [DynStore; 2],
    j: Job,
    first: i64,
    won_before: Vec<i64>,
    tally: Arc<Mutex<Tally>>,
    back: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) {
    let mut tasks = Vec::new();
    for (c, s) in stores.into_iter().enumerate() {
        let (j, tally, back, stop, won_before) = (
            j.clone(),
            tally.clone(),
            back.clone(),
            stop.clone(),
            won_before.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut i = 0i64;
            while !stop.load(Ordering::SeqCst) {
                // A fresh slot both claimers contend for, then an old one.
                for slot in [first + i, won_before[i as usize % won_before.len()]] {
                    let sp = spec(&j, slot, &holder(&format!("c{c}"), 1));
                    let res = s.claim(&sp, &DeadHolders::none()).await;
                    let unavailable = matches!(res, Err(Error::Unavailable(_)));
                    record(&tally, &back, slot, res);
                    if unavailable {
                        // What a client does: back off before retrying.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                i += 1;
                // A paced client, not a tight loop: every fresh slot is a
                // durable queue the restart has to recover.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Wins `n` slots, runs claimers through `stop_broker`/`start_broker`, then
/// checks that no slot was won twice and that every slot won before or
/// during the run is still refused to a newcomer.
async fn outage(url: &str, stop_broker: fn(), start_broker: fn()) {
    let opts = StoreOptions::default();
    let open = || store::open(url, &opts);
    let s = open().await.unwrap();
    let j = job("outage");
    let base = host_now_ms();
    let mut before = Vec::new();
    for i in 0..20 {
        let sp = spec(&j, base + i, &holder("early", 1));
        assert_eq!(
            s.claim(&sp, &DeadHolders::none()).await.unwrap().outcome,
            Outcome::Won
        );
        before.push((base + i, sp));
    }
    let won_before: Vec<i64> = before.iter().map(|(slot, _)| *slot).collect();
    let tally = Arc::new(Mutex::new(Tally::default()));
    for slot in &won_before {
        tally.lock().unwrap().wins.insert(*slot, 1);
    }
    let (back, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let run = tokio::spawn(claimers(
        [open().await.unwrap(), open().await.unwrap()],
        j.clone(),
        base + 1000,
        won_before.clone(),
        tally.clone(),
        back.clone(),
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::spawn_blocking(stop_broker).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    tokio::task::spawn_blocking(start_broker).await.unwrap();
    back.store(true, Ordering::SeqCst);
    // Run until the claimers have been answered for a while after the restart.
    let end = Instant::now() + Duration::from_secs(90);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t = tally.lock().unwrap();
        let recovered = t.answered_after >= 200;
        assert!(
            recovered || Instant::now() < end,
            "the store did not recover: {} answers after the restart",
            t.answered_after
        );
        if recovered {
            break;
        }
    }
    stop.store(true, Ordering::SeqCst);
    run.await.unwrap();

    let t = std::mem::take(&mut *tally.lock().unwrap());
    eprintln!(
        "outage on {url}: {} answers, {} unavailable, {} lost/unknown, {} after the restart, {} slots won",
        t.answers,
        t.unavailable,
        t.unknown,
        t.answered_after,
        t.wins.len()
    );
    assert!(
        t.unavailable + t.unknown > 0,
        "the outage was never seen: the test proves nothing"
    );
    let doubles: Vec<_> = t.wins.iter().filter(|(_, &n)| n > 1).collect();
    assert!(doubles.is_empty(), "slots won twice: {doubles:?}");
    let mut won: Vec<i64> = t.wins.keys().copied().collect();
    won.sort_unstable();
    // Everything won is still remembered after the restart.
    let fresh = open().await.unwrap();
    for slot in &won {
        let a = fresh
            .claim(&spec(&j, *slot, &holder("late", 1)), &DeadHolders::none())
            .await
            .unwrap();
        assert_eq!(a.outcome, Outcome::Lost, "slot {slot} forgotten: {a:?}");
    }
    assert!(
        won.len() > won_before.len(),
        "no slot was won during the run"
    );
    // What a resend answers after the restart is the backend's own rule.
    if fresh.info().backend == "nats" {
        for (_, sp) in &before {
            let a = fresh.claim(sp, &DeadHolders::none()).await.unwrap();
            assert_eq!(a.outcome, Outcome::Won, "a resend after the restart: {a:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rabbitmq_restart_mid_run() {
    let _one = SERIAL.lock().await;
    if !brokers::rabbitmq_up() {
        return;
    }
    let _guard = RabbitGuard;
    // Few durable queues to recover makes a fast, reliable restart.
    brokers::sweep_test_queues().await;
    let url = amqp_url(&prefix(), "&slot_ttl_ms=90000&timeout_ms=2000");
    outage(&url, rabbitmq_stop, rabbitmq_start).await;
    brokers::sweep_test_queues().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nats_restart_mid_run() {
    let _one = SERIAL.lock().await;
    if !brokers::nats_up() {
        return;
    }
    let _guard = NatsGuard;
    brokers::sweep_old_test_streams().await;
    let url = nats_url(&prefix(), "&timeout_ms=1000");
    outage(&url, nats_stop, nats_start).await;
}
