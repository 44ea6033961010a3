//! Claims follow liveness: process tests written once, run per lease store.
//! Heartbeat 200 ms, expiry 1,500 ms. Every timing assertion has both bounds.

use std::time::{Duration, Instant};

use anarchon::error::status_reason;
use anarchon::proto as pb;
use anarchon::proto::claims_client::ClaimsClient;
use tonic::transport::Channel;

use super::claims_client as claims;
use super::process::{free_addr, Sidecar};

pub const HB: u64 = 200;
pub const EXPIRY: u64 = 1500;

/// A renew of `token`'s run that must fail; its status.
async fn renew_fails(
    c: &mut ClaimsClient<Channel>,
    job: &str,
    slot: i64,
    token: &str,
) -> tonic::Status {
    c.renew(pb::RenewRequest {
        job: job.to_owned(),
        slot_ms: slot,
        token: token.to_owned(),
        lease_ms: 0,
    })
    .await
    .unwrap_err()
}

fn won(r: &pb::ClaimResponse) -> bool {
    r.outcome == pb::Outcome::Won as i32
}

/// The flags of sidecar `i` of a full mesh of `addrs` on `backend`, with
/// these timings.
pub fn mesh_flags(backend: &str, addrs: &[std::net::SocketAddr], i: usize) -> Vec<String> {
    let mut flags = vec![
        "--backend".to_string(),
        backend.to_string(),
        "--heartbeat-ms".into(),
        HB.to_string(),
        "--expiry-ms".into(),
        EXPIRY.to_string(),
    ];
    flags.extend(super::mesh::peer_flags(addrs, i));
    flags
}

/// `n` sidecars on `backend` with these timings, each linked to every
/// other, in `root/n0`, `root/n1`, …
pub fn mesh(root: &std::path::Path, n: usize, backend: &str) -> Vec<Sidecar> {
    let addrs: Vec<std::net::SocketAddr> = (0..n).map(|_| free_addr()).collect();
    (0..n)
        .map(|i| {
            let flags = mesh_flags(backend, &addrs, i);
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            Sidecar::start_at(&root.join(format!("n{i}")), addrs[i], &flags)
        })
        .collect()
}

/// Two sidecars on `backend`, linked to each other.
pub struct Pair {
    pub root: tempfile::TempDir,
    pub a: Sidecar,
    pub b: Sidecar,
}

impl Pair {
    pub async fn start(backend: &str) -> Pair {
        let root = tempfile::tempdir().unwrap();
        let (aa, ab) = (free_addr(), free_addr());
        let flags = |peer: std::net::SocketAddr| -> Vec<String> {
            vec![
                "--backend".into(),
                backend.into(),
                "--heartbeat-ms".into(),
                HB.to_string(),
                "--expiry-ms".into(),
                EXPIRY.to_string(),
                "--peer".into(),
                peer.to_string(),
            ]
        };
        let fa = flags(ab);
        let fb = flags(aa);
        let a = Sidecar::start_at(
            &root.path().join("a"),
            aa,
            &fa.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        let b = Sidecar::start_at(
            &root.path().join("b"),
            ab,
            &fb.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        let p = Pair { root, a, b };
        p.linked().await;
        p
    }

    /// Waits until each sees the other ALIVE.
    pub async fn linked(&self) {
        super::mesh::linked(&[self.a.addr, self.b.addr]).await;
    }
}

fn req(job: &str, slot: i64, lease_ms: i64) -> pb::ClaimRequest {
    pb::ClaimRequest {
        job: job.into(),
        slot_ms: slot,
        lease_ms,
        ..Default::default()
    }
}

/// A holds a 60 s lease; SIGKILL A; B wins attempt 2 once the mesh expires A
/// (not earlier than expiry − 1 heartbeat, not later than expiry + 2
/// heartbeats + 0.7 s). Restart A: a Renew with A's old token is fenced.
pub async fn takeover_after_sigkill(backend: &str) {
    let mut p = Pair::start(backend).await;
    let job = format!("kill-{:08x}", rand::random::<u32>());
    let slot = anarchon::claim::host_now_ms();
    let mut ca = claims(p.a.addr).await;
    let mut cb = claims(p.b.addr).await;
    let held = ca
        .claim(req(&job, slot, 60_000))
        .await
        .unwrap()
        .into_inner();
    assert!(won(&held), "{held:?}");
    let r = cb
        .claim(req(&job, slot, 60_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.outcome, pb::Outcome::Running as i32);

    super::mesh::mid_beat(p.a.addr, Duration::from_millis(HB)).await;
    let killed = Instant::now();
    p.a.kill();
    let taken = loop {
        let r = cb
            .claim(req(&job, slot, 60_000))
            .await
            .unwrap()
            .into_inner();
        if won(&r) {
            break (r, killed.elapsed());
        }
        assert_eq!(r.outcome, pb::Outcome::Running as i32, "{r:?}");
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "never taken over"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (r, after) = taken;
    assert_eq!(r.attempt, 2);
    assert!(r.fencing > held.fencing);
    let lo = Duration::from_millis(EXPIRY - HB);
    let hi = Duration::from_millis(EXPIRY + 2 * HB + 700);
    assert!(
        after >= lo && after <= hi,
        "taken over after {after:?}, want [{lo:?}, {hi:?}]"
    );

    // The old holder restarts: its old token is fenced through the new instance.
    p.a.restart();
    let mut ca = claims(p.a.addr).await;
    let st = renew_fails(&mut ca, &job, slot, &held.token).await;
    assert_eq!(st.code(), tonic::Code::FailedPrecondition);
    assert_eq!(status_reason(&st).as_deref(), Some("fenced"));
}

/// A restarted runtime's runs stay dead even when nobody took them over.
pub async fn restart_never_revives_old_runs(backend: &str) {
    let mut p = Pair::start(backend).await;
    let job = format!("revive-{:08x}", rand::random::<u32>());
    let slot = anarchon::claim::host_now_ms();
    let mut ca = claims(p.a.addr).await;
    let held = ca
        .claim(req(&job, slot, 60_000))
        .await
        .unwrap()
        .into_inner();
    assert!(won(&held));
    p.a.restart();
    let mut ca = claims(p.a.addr).await;
    for _ in 0..2 {
        let st = renew_fails(&mut ca, &job, slot, &held.token).await;
        assert_eq!(status_reason(&st).as_deref(), Some("fenced"), "{st:?}");
        let st = ca
            .release(pb::ReleaseRequest {
                job: job.clone(),
                slot_ms: slot,
                token: held.token.clone(),
                result: pb::ReleaseResult::Succeeded as i32,
            })
            .await
            .unwrap_err();
        assert_eq!(status_reason(&st).as_deref(), Some("fenced"), "{st:?}");
    }
    // A resend of the old claim through the new instance is a takeover, not a revival.
    let mut again = req(&job, slot, 60_000);
    again.token = held.token.clone();
    let r = ca.claim(again).await.unwrap().into_inner();
    assert!(won(&r));
    assert_eq!(r.attempt, 2, "the old attempt must not come back");
    drop(p.root);
}

/// SIGTERM the holder: another sidecar wins within one heartbeat of its exit.
pub async fn graceful_leave_hands_over_at_once(backend: &str) {
    let mut p = Pair::start(backend).await;
    let job = format!("leave-{:08x}", rand::random::<u32>());
    let slot = anarchon::claim::host_now_ms();
    let mut ca = claims(p.a.addr).await;
    let mut cb = claims(p.b.addr).await;
    assert!(won(&ca
        .claim(req(&job, slot, 60_000))
        .await
        .unwrap()
        .into_inner()));
    let status = p.a.terminate();
    let exited = Instant::now();
    assert!(status.success());
    let r = cb
        .claim(req(&job, slot, 60_000))
        .await
        .unwrap()
        .into_inner();
    let after = exited.elapsed();
    assert!(won(&r), "{r:?}");
    assert_eq!(r.attempt, 2);
    assert!(
        after <= Duration::from_millis(HB),
        "won {after:?} after the exit"
    );
}

/// A waiter on B wins within 100 ms of the holder's release on A (a mesh
/// nudge, not a poll), and within the expiry bound of the holder's SIGKILL.
pub async fn waiters_wake_on_release_and_death(backend: &str) {
    let mut p = Pair::start(backend).await;
    let job = format!("wait-{:08x}", rand::random::<u32>());
    let mut ca = claims(p.a.addr).await;
    let held = ca.claim(req(&job, 0, 60_000)).await.unwrap().into_inner();
    assert!(won(&held));
    let mut cb = claims(p.b.addr).await;
    let job_w = job.clone();
    let waiter = tokio::spawn(async move {
        let job = job_w;
        let mut r = req(&job, 0, 60_000);
        r.wait_ms = 20_000;
        let out = cb.claim(r).await.unwrap().into_inner();
        (out, Instant::now(), cb, job)
    });
    tokio::time::sleep(Duration::from_millis(3 * HB)).await;
    let released = Instant::now();
    ca.release(pb::ReleaseRequest {
        job: job.clone(),
        slot_ms: 0,
        token: held.token.clone(),
        result: pb::ReleaseResult::Succeeded as i32,
    })
    .await
    .unwrap();
    let (out, at, cb, _) = waiter.await.unwrap();
    assert!(won(&out), "{out:?}");
    let delay = at.duration_since(released);
    assert!(
        delay < Duration::from_millis(100),
        "the waiter won {delay:?} after the release"
    );

    // Now B holds it; a waiter on A wins when B is SIGKILLed and expires.
    let mut ca = claims(p.a.addr).await;
    let job2 = job.clone();
    let waiter = tokio::spawn(async move {
        let mut r = req(&job2, 0, 60_000);
        r.wait_ms = 20_000;
        let out = ca.claim(r).await.unwrap().into_inner();
        (out, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(2 * HB)).await;
    drop(cb);
    super::mesh::mid_beat(p.b.addr, Duration::from_millis(HB)).await;
    let killed = Instant::now();
    p.b.kill();
    let (out, at) = waiter.await.unwrap();
    assert!(won(&out), "{out:?}");
    let after = at.duration_since(killed);
    let lo = Duration::from_millis(EXPIRY - HB);
    let hi = Duration::from_millis(EXPIRY + 2 * HB + 700);
    assert!(
        after >= lo && after <= hi,
        "waiter won {after:?} after the kill, want [{lo:?}, {hi:?}]"
    );
}

/// Benchmark (not a timed test): over `rounds` SIGKILLs of the holder, the
/// distribution of takeover latency against the declared expiry.
pub async fn takeover_latency_distribution(backend: &str, rounds: usize) -> Vec<Duration> {
    let mut p = Pair::start(backend).await;
    let mut out = Vec::new();
    for round in 0..rounds {
        let job = format!("dist-{round}-{:08x}", rand::random::<u32>());
        let slot = anarchon::claim::host_now_ms();
        let mut ca = claims(p.a.addr).await;
        let mut cb = claims(p.b.addr).await;
        assert!(won(&ca
            .claim(req(&job, slot, 60_000))
            .await
            .unwrap()
            .into_inner()));
        // Kill at a random phase of the heartbeat.
        tokio::time::sleep(Duration::from_millis(rand::random::<u64>() % HB)).await;
        let killed = Instant::now();
        p.a.kill();
        loop {
            let r = cb
                .claim(req(&job, slot, 60_000))
                .await
                .unwrap()
                .into_inner();
            if won(&r) {
                assert_eq!(r.attempt, 2);
                out.push(killed.elapsed());
                break;
            }
            assert!(killed.elapsed() < Duration::from_secs(10));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        p.a.restart();
        p.linked().await;
    }
    out
}
