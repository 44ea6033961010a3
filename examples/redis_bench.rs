//! Claims per second at N concurrent clients on Redis, in one run:
//!
//! * `raw-small`: EVALSHA of a minimal HGET/HSET script (the floor a
//!   claim script can reach);
//! * `raw`: the strategy's own step sent by hand — EVALSHA of `lease.lua`
//!   with the arguments the store sends, or the plain `XADD <slot>-0`;
//! * `store`: `Store::claim` (the redis crate's multiplexed connection
//!   pipelines concurrent claims on one socket);
//! * `sidecar`: a gRPC `Claim` through an in-process `anarchon` server
//!   (one channel per client).
//!
//! Every claim is a fresh slot of the client's own job, so every claim
//! writes and wins. Modes are interleaved over several rounds and the median
//! is reported, because the machine is shared.
//!
//! ```text
//! cargo run --release --example redis_bench -- --clients 16 --seconds 5 --rounds 3
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anarchon::claim::*;
use anarchon::proto as pb;
use anarchon::store::{self, DynStore, StoreOptions};
use anyhow::Context;
use redis::aio::MultiplexedConnection;

const LEASE_LUA: &str = include_str!("../src/store/redis/lease.lua");
const SMALL_LUA: &str = "local v = redis.call('HGET', KEYS[1], ARGV[1]) \
    if not v then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) return 1 end return 0";

struct Args {
    redis: String,
    clients: usize,
    seconds: u64,
    rounds: usize,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        redis: "127.0.0.1:6379".into(),
        clients: 16,
        seconds: 5,
        rounds: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().with_context(|| format!("{k} needs a value"))?;
        match k.as_str() {
            "--redis" => a.redis = v,
            "--clients" => a.clients = v.parse()?,
            "--seconds" => a.seconds = v.parse()?,
            "--rounds" => a.rounds = v.parse()?,
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    Ok(a)
}

/// Runs `clients` loops of `op(client, i)` for `secs`; returns claims/s.
async fn drive<F, Fut>(clients: usize, secs: u64, op: F) -> anyhow::Result<f64>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (op, stop, done) = (op.clone(), stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                op(c, i).await?;
                i += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

fn spec(job: &Job, slot: i64, node: &str) -> ClaimSpec {
    ClaimSpec {
        job: job.clone(),
        slot_ms: slot,
        token: Token::generate(),
        holder: Holder {
            node: node.into(),
            instance: 1,
        },
        lease_ms: 30_000,
        max_late_ms: 60_000,
        overlap: Overlap::Allow,
        max_attempts: 3,
    }
}

fn jobs(mode: &str, round: usize, clients: usize) -> Arc<Vec<Job>> {
    Arc::new(
        (0..clients)
            .map(|c| {
                Job::parse(&format!("bench-{mode}-{round}-{c}")).unwrap_or_else(|e| panic!("{e}"))
            })
            .collect(),
    )
}

async fn raw_small(
    conn: MultiplexedConnection,
    a: &Args,
    prefix: &str,
    round: usize,
) -> anyhow::Result<f64> {
    let script = Arc::new(redis::Script::new(SMALL_LUA));
    let prefix = prefix.to_owned();
    drive(a.clients, a.seconds, move |c, i| {
        let (script, mut conn) = (script.clone(), conn.clone());
        let key = format!("{prefix}:{{small-{round}-{c}}}:runs");
        async move {
            let _: i64 = script
                .key(key)
                .arg(i)
                .arg("RUNNING 1 1 0 0 0 00000000000000000000000000000000 1 bench")
                .invoke_async(&mut conn)
                .await?;
            Ok(())
        }
    })
    .await
}

async fn raw_lease(
    conn: MultiplexedConnection,
    a: &Args,
    prefix: &str,
    round: usize,
) -> anyhow::Result<f64> {
    let script = Arc::new(redis::Script::new(LEASE_LUA));
    let jobs = jobs("raw", round, a.clients);
    let prefix = prefix.to_owned();
    let base = host_now_ms();
    drive(a.clients, a.seconds, move |c, i| {
        let (script, mut conn, jobs) = (script.clone(), conn.clone(), jobs.clone());
        let k = |s: &str| format!("{prefix}:{{{}}}:{s}", jobs[c]);
        let sp = spec(&jobs[c], base + i as i64, "bench-raw");
        let keys = [
            k("runs"),
            k("slots"),
            k("running"),
            k("fence"),
            k("history"),
        ];
        let prefix = prefix.clone();
        async move {
            let mut inv = script.prepare_invoke();
            inv.key(&keys[..])
                .key(format!("{prefix}:jobs"))
                .key(format!("{prefix}:holder:bench-raw:1"))
                .arg("claim")
                .arg(sp.slot_ms)
                .arg(sp.token.as_str())
                .arg("bench")
                .arg(1)
                .arg(sp.lease_ms)
                .arg(sp.max_late_ms)
                .arg(0)
                .arg(3)
                .arg(1000)
                .arg(format!("{}\0{}", sp.job, sp.slot_ms))
                .arg(604_800_000u64)
                .arg(sp.job.as_str())
                .arg(0)
                .arg(0);
            let v: redis::Value = inv.invoke_async(&mut conn).await?;
            anyhow::ensure!(
                matches!(&v, redis::Value::Array(a) if a.first() == Some(&redis::Value::Int(1))),
                "not won: {v:?}"
            );
            Ok(())
        }
    })
    .await
}

async fn raw_xadd(
    conn: MultiplexedConnection,
    a: &Args,
    prefix: &str,
    round: usize,
) -> anyhow::Result<f64> {
    let jobs = jobs("raw", round, a.clients);
    let prefix = prefix.to_owned();
    let base = host_now_ms();
    drive(a.clients, a.seconds, move |c, i| {
        let mut conn = conn.clone();
        let key = format!("{prefix}:{{{}}}:stream-id", jobs[c]);
        let slot = base + i as i64;
        let token = Token::generate();
        async move {
            let _: String = redis::cmd("XADD")
                .arg(key)
                .arg(format!("{slot}-0"))
                .arg("slot")
                .arg(slot)
                .arg("token")
                .arg(token.as_str())
                .arg("node")
                .arg("bench")
                .arg("instance")
                .arg(1)
                .arg("at")
                .arg(slot)
                .query_async(&mut conn)
                .await?;
            Ok(())
        }
    })
    .await
}

async fn via_store(s: DynStore, a: &Args, round: usize) -> anyhow::Result<f64> {
    let jobs = jobs("store", round, a.clients);
    let base = host_now_ms();
    drive(a.clients, a.seconds, move |c, i| {
        let (s, jobs) = (s.clone(), jobs.clone());
        async move {
            let r = s
                .claim(
                    &spec(&jobs[c], base + i as i64, "bench-store"),
                    &DeadHolders::none(),
                )
                .await?;
            anyhow::ensure!(r.outcome == Outcome::Won, "not won: {r:?}");
            Ok(())
        }
    })
    .await
}

async fn via_sidecar(addr: std::net::SocketAddr, a: &Args, round: usize) -> anyhow::Result<f64> {
    let mut clients = Vec::new();
    for _ in 0..a.clients {
        clients.push(pb::claims_client::ClaimsClient::connect(format!("http://{addr}")).await?);
    }
    let clients = Arc::new(clients);
    let jobs = jobs("sidecar", round, a.clients);
    let base = host_now_ms();
    drive(a.clients, a.seconds, move |c, i| {
        let mut cl = clients[c].clone();
        let job = jobs[c].to_string();
        async move {
            let r = cl
                .claim(pb::ClaimRequest {
                    job,
                    slot_ms: base + i as i64,
                    ..Default::default()
                })
                .await?
                .into_inner();
            anyhow::ensure!(r.outcome == pb::Outcome::Won as i32, "not won: {r:?}");
            Ok(())
        }
    })
    .await
}

/// Starts an in-process sidecar on `url`; returns its gRPC address.
async fn sidecar(url: &str, dir: &std::path::Path) -> anyhow::Result<std::net::SocketAddr> {
    let cfg = anarchon::Config {
        backend: url.to_owned(),
        data_dir: dir.to_owned(),
        max_late_ms: 3_600_000,
        ..Default::default()
    };
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = grpc.local_addr()?;
    let listeners = anarchon::server::Listeners {
        grpc,
        admin: None,
        unix: None,
    };
    tokio::spawn(async move {
        if let Err(e) = anarchon::server::run(cfg, listeners, std::future::pending()).await {
            eprintln!("sidecar failed: {e:#}");
        }
    });
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(addr);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    anyhow::bail!("the sidecar did not start")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

async fn cleanup(conn: &mut MultiplexedConnection, prefix: &str) -> anyhow::Result<()> {
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        if !keys.is_empty() {
            let _: i64 = redis::cmd("UNLINK").arg(&keys).query_async(conn).await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = args()?;
    let prefix = format!("anarchon-bench-{:08x}", rand::random::<u32>());
    let client = redis::Client::open(format!("redis://{}/0", a.redis))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let dir = tempfile_dir()?;
    println!(
        "# {} clients, {} s per mode, median of {} rounds, Redis {}",
        a.clients, a.seconds, a.rounds, a.redis
    );
    println!("| strategy | mode | claims/s | vs raw |");
    println!("|---|---|---:|---:|");
    for strategy in ["lease", "stream-id"] {
        let url = format!("redis://{}/0?strategy={strategy}&prefix={prefix}", a.redis);
        let s = store::open(&url, &StoreOptions::default()).await?;
        let addr = sidecar(&url, &dir.join(strategy)).await?;
        let (mut small, mut raw, mut st, mut sc) = (vec![], vec![], vec![], vec![]);
        for round in 0..a.rounds {
            // Alternate the order, so neither side always runs first.
            for m in if round % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] } {
                match (m, strategy) {
                    (0, "lease") => {
                        small.push(raw_small(conn.clone(), &a, &prefix, round).await?);
                        raw.push(raw_lease(conn.clone(), &a, &prefix, round).await?);
                    }
                    (0, _) => raw.push(raw_xadd(conn.clone(), &a, &prefix, round).await?),
                    (1, _) => st.push(via_store(s.clone(), &a, round).await?),
                    _ => sc.push(via_sidecar(addr, &a, round).await?),
                }
            }
        }
        let raw = median(raw);
        if !small.is_empty() {
            println!(
                "| {strategy} | raw EVALSHA, minimal HGET/HSET script | {:.0} | |",
                median(small)
            );
        }
        let what = if strategy == "lease" {
            "raw EVALSHA of lease.lua"
        } else {
            "raw XADD <slot>-0"
        };
        println!("| {strategy} | {what} | {raw:.0} | 1.00 |");
        let st = median(st);
        println!("| {strategy} | Store::claim | {st:.0} | {:.2} |", st / raw);
        let sc = median(sc);
        println!(
            "| {strategy} | sidecar (gRPC Claim) | {sc:.0} | {:.2} |",
            sc / raw
        );
    }
    cleanup(&mut conn, &prefix).await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("anarchon-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
