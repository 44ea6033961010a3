//! The chaos soak (issue 11): three real `anarchon serve` sidecars in a mesh
//! on one lease store, many gRPC claimers contending for a sequence of slots
//! and for a lock, while a sidecar is SIGKILLed and restarted (same node key,
//! same data dir, same address) every few seconds and the store server is
//! restarted once. Every answer a claimer gets is recorded; [`Report`] judges
//! the record afterwards.
//!
//! Timing: heartbeat [`HB`] and expiry [`EXPIRY`] of the liveness tests.
//!
//! * **Slots.** Job `soak-slots-…`, one slot every [`SLOT_EVERY_MS`]. Each
//!   slot claimer asks for the next slot at its time (plus up to 20 ms of
//!   jitter) with `lease_ms` [`SLOT_LEASE_MS`], `max_late_ms`
//!   [`SLOT_LATE_MS`] and `wait_ms` [`SLOT_WAIT_MS`]; the winner works
//!   10–50 ms and releases SUCCEEDED. A claim that fails (its sidecar is
//!   down, the store is down) is sent again every 100 ms until
//!   [`SLOT_MARGIN_MS`] before the slot's claim window closes.
//! * **The lock.** Job `soak-lock-…`, slot 0, `lease_ms` [`LOCK_LEASE_MS`]
//!   (far longer than the expiry, so a takeover after a SIGKILL comes from
//!   the mesh, not from the lease), `wait_ms` [`LOCK_WAIT_MS`]. The winner
//!   holds it 0.5–2 s, renewing every [`RENEW_EVERY_MS`], then releases.
//!   A renew or release that fails for want of its sidecar is retried until
//!   the holder's local deadline (sent time + `valid_for_ms`).
//! * **Chaos.** A sidecar is SIGKILLed, stays down [`DOWN_MS`] (longer than
//!   the slowest takeover bound, so every takeover is the mesh's work, not the
//!   restart's), and is started again with the same flags.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anarchon::claim::host_now_ms;
use anarchon::cli::outcome_name;
use anarchon::error::status_reason;
use anarchon::proto as pb;
use anarchon::proto::claims_client::ClaimsClient;
use rand::Rng;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::liveness::{EXPIRY, HB};
use super::process::Sidecar;
use super::restart::Server;

pub const SIDECARS: usize = 3;
pub const SLOT_EVERY_MS: i64 = 200;
pub const SLOT_LATE_MS: i64 = 1000;
/// A claimer starts no claim for a slot later than this before its claim
/// window closes: a claim sent in time is one the store can still decide
/// within the window.
pub const SLOT_MARGIN_MS: i64 = 300;
pub const SLOT_LEASE_MS: i64 = 3000;
pub const SLOT_WAIT_MS: i64 = 5000;
pub const LOCK_LEASE_MS: i64 = 10_000;
pub const LOCK_WAIT_MS: i64 = 5000;
pub const RENEW_EVERY_MS: u64 = 300;
/// How long a killed sidecar stays down.
pub const DOWN_MS: u64 = EXPIRY + 1000;
/// A takeover after the holder's SIGKILL is due no earlier than this...
pub const TAKEOVER_LO_MS: u64 = EXPIRY - HB;
/// ...and no later than this (the bound of `tests/liveness.rs`).
pub const TAKEOVER_HI_MS: u64 = EXPIRY + 2 * HB + 700;

/// Which sidecar a kill hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aim {
    /// Any of the three, at random.
    Random,
    /// The one whose claimer holds the lock (waits for one to hold it), so
    /// that the kill is sure to cause a takeover.
    LockHolder,
}

/// What one store run does.
#[derive(Debug, Clone)]
pub struct Plan {
    /// "sqlite", "postgres", "redis-lease".
    pub store: &'static str,
    pub backend: String,
    /// The server restarted once during the run (`None`: SQLite has none).
    pub server: Option<Server>,
    pub duration: Duration,
    /// Slot claimers per sidecar.
    pub claimers: usize,
    /// Lock claimers per sidecar.
    pub lockers: usize,
    /// The first kill, this long after the start.
    pub first_kill: Duration,
    /// After a restarted sidecar is back, the next kill comes after a random
    /// pause in this range; `None`: one kill only.
    pub kill_every: Option<(Duration, Duration)>,
    pub aim: Aim,
    /// The store restart, this long after the start.
    pub store_restart_at: Duration,
    /// How long the store server stays stopped.
    pub store_down: Duration,
    /// The run goes on at least this long after the store answers again.
    pub tail_after_recovery: Duration,
}

// --- the record -----------------------------------------------------------------

/// Why an RPC failed, as the client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fail {
    /// No answer from the sidecar: it is down, or the connection broke.
    Sidecar,
    /// The sidecar answered UNAVAILABLE: it cannot reach its store.
    StoreUnavailable,
    /// FAILED_PRECONDITION, reason `fenced`.
    Fenced,
    NotFound,
    /// Any other status code (counted by code).
    Other(i32),
}

/// Splits a failed RPC into "the sidecar never answered" and what it said.
pub fn classify(s: &Status) -> Fail {
    let from_server = std::error::Error::source(s).is_none();
    match s.code() {
        Code::Unavailable if s.message().starts_with("store unavailable") => Fail::StoreUnavailable,
        Code::FailedPrecondition if status_reason(s).as_deref() == Some("fenced") => Fail::Fenced,
        Code::NotFound => Fail::NotFound,
        Code::Unavailable | Code::Unknown | Code::Cancelled => Fail::Sidecar,
        _ if !from_server => Fail::Sidecar,
        c => Fail::Other(c as i32),
    }
}

impl Fail {
    fn retry(self) -> bool {
        matches!(self, Fail::Sidecar | Fail::StoreUnavailable)
            || self == Fail::Other(Code::Internal as i32)
    }
}

/// A Claim answer with an outcome.
#[derive(Debug, Clone)]
pub struct Answer {
    pub outcome: pb::Outcome,
    pub token: String,
    pub attempt: u32,
    pub fencing: u64,
    pub lease_until_ms: i64,
    pub valid_for_ms: i64,
    pub now_ms: i64,
}

/// One Claim RPC.
#[derive(Debug, Clone)]
pub struct ClaimEv {
    pub lock: bool,
    pub side: usize,
    pub slot: i64,
    pub sent: Instant,
    pub sent_ms: i64,
    pub answered: Instant,
    pub res: Result<Answer, Fail>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Renew,
    Release,
}

/// One Renew or Release RPC.
#[derive(Debug, Clone)]
pub struct FollowEv {
    pub op: Op,
    pub lock: bool,
    pub side: usize,
    pub slot: i64,
    pub token: String,
    pub sent: Instant,
    pub sent_ms: i64,
    pub answered: Instant,
    /// Renew: the new `lease_until_ms`; Release: 0.
    pub res: Result<i64, Fail>,
}

#[derive(Debug, Clone)]
pub struct Kill {
    pub side: usize,
    /// Just before the SIGKILL was sent.
    pub at: Instant,
    pub at_ms: i64,
    pub up: Option<Instant>,
    /// Just before the new process was spawned (host epoch ms).
    pub respawn_ms: i64,
    pub up_ms: i64,
    /// The lock's fencing number when its holder sat on the victim.
    pub lock_fencing: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct StoreRestart {
    pub stop: Instant,
    pub stop_ms: i64,
    pub stopped: Instant,
    pub started: Instant,
}

#[derive(Default)]
pub struct Record {
    /// When the claimers started.
    pub start: Option<Instant>,
    pub start_ms: i64,
    pub claims: Vec<ClaimEv>,
    pub follows: Vec<FollowEv>,
    pub kills: Vec<Kill>,
    pub restart: Option<StoreRestart>,
    /// When every sidecar had answered a Claim sent after the store came back.
    pub recovered: Option<Instant>,
    pub recovered_side: [Option<Instant>; SIDECARS],
    /// Holders that stopped retrying a renew or release because their local
    /// deadline passed.
    pub gave_up: usize,
    /// One example text per failure kind, for the log.
    pub examples: BTreeMap<Fail, String>,
}

/// The lock's holder as its claimers know it (the chaos side aims with it).
#[derive(Debug, Clone, Copy)]
struct LockHeld {
    side: usize,
    fencing: u64,
    releasing: bool,
}

struct Ctx {
    addrs: Vec<SocketAddr>,
    slot_job: String,
    lock_job: String,
    rec: Mutex<Record>,
    held: Mutex<Option<LockHeld>>,
    stop: AtomicBool,
}

impl Ctx {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn claim_ev(&self, ev: ClaimEv) {
        let mut r = self.rec.lock().unwrap();
        let started = r.restart.as_ref().map(|s| s.started);
        if let (Ok(_), Some(started)) = (&ev.res, started) {
            if ev.sent >= started && r.recovered.is_none() {
                let side = &mut r.recovered_side[ev.side];
                side.get_or_insert(ev.answered);
                if r.recovered_side.iter().all(Option::is_some) {
                    r.recovered = Some(ev.answered);
                }
            }
        }
        r.claims.push(ev);
    }

    fn fail(&self, f: Fail, s: &Status) {
        self.rec
            .lock()
            .unwrap()
            .examples
            .entry(f)
            .or_insert_with(|| format!("{:?}: {}", s.code(), s.message()));
    }
}

fn client(addr: SocketAddr) -> ClaimsClient<Channel> {
    ClaimsClient::new(
        Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_timeout(Duration::from_millis(500))
            .timeout(Duration::from_secs(15))
            .connect_lazy(),
    )
}

fn answer(r: pb::ClaimResponse) -> Answer {
    Answer {
        outcome: pb::Outcome::try_from(r.outcome).unwrap_or(pb::Outcome::Unspecified),
        token: r.token,
        attempt: r.attempt,
        fencing: r.fencing,
        lease_until_ms: r.lease_until_ms,
        valid_for_ms: r.valid_for_ms,
        now_ms: r.now_ms,
    }
}

// --- the claimers ---------------------------------------------------------------

/// Sends one Claim and records what came back; also returns when it was sent.
async fn ask(
    ctx: &Ctx,
    c: &mut ClaimsClient<Channel>,
    side: usize,
    req: pb::ClaimRequest,
) -> (Result<Answer, Fail>, Instant) {
    let (lock, slot) = (req.slot_ms == 0, req.slot_ms);
    let (sent, sent_ms) = (Instant::now(), host_now_ms());
    let res = c.claim(req).await;
    let answered = Instant::now();
    let res = match res {
        Ok(r) => Ok(answer(r.into_inner())),
        Err(s) => {
            let f = classify(&s);
            ctx.fail(f, &s);
            Err(f)
        }
    };
    if let Ok(a) = &res {
        if lock && a.outcome == pb::Outcome::Won {
            *ctx.held.lock().unwrap() = Some(LockHeld {
                side,
                fencing: a.fencing,
                releasing: false,
            });
        }
    }
    ctx.claim_ev(ClaimEv {
        lock,
        side,
        slot,
        sent,
        sent_ms,
        answered,
        res: res.clone(),
    });
    (res, sent)
}

/// Asks for every slot it can, one after the other.
async fn slot_claimer(ctx: Arc<Ctx>, side: usize) {
    let mut c = client(ctx.addrs[side]);
    while !ctx.stopped() {
        let slot = (host_now_ms() / SLOT_EVERY_MS + 1) * SLOT_EVERY_MS;
        let jitter = rand::thread_rng().gen_range(0..20);
        let wait = slot + jitter - host_now_ms();
        tokio::time::sleep(Duration::from_millis(wait.max(0) as u64)).await;
        if ctx.stopped() {
            break;
        }
        // Ask until answered, while the slot's claim window is open.
        while host_now_ms() - slot <= SLOT_LATE_MS - SLOT_MARGIN_MS {
            let req = pb::ClaimRequest {
                job: ctx.slot_job.clone(),
                slot_ms: slot,
                lease_ms: SLOT_LEASE_MS,
                max_late_ms: SLOT_LATE_MS,
                wait_ms: SLOT_WAIT_MS,
                ..Default::default()
            };
            match ask(&ctx, &mut c, side, req).await {
                (Ok(a), sent) => {
                    if a.outcome == pb::Outcome::Won {
                        let work = rand::thread_rng().gen_range(10..50);
                        tokio::time::sleep(Duration::from_millis(work)).await;
                        let deadline = sent + Duration::from_millis(a.valid_for_ms.max(0) as u64);
                        release(&ctx, &mut c, false, side, slot, &a.token, deadline).await;
                    }
                    break;
                }
                (Err(f), _) if f.retry() => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                (Err(_), _) => break,
            }
        }
    }
}

/// Releases SUCCEEDED, sending again while the sidecar or store does not
/// answer and the holder's local deadline has not passed.
async fn release(
    ctx: &Ctx,
    c: &mut ClaimsClient<Channel>,
    lock: bool,
    side: usize,
    slot: i64,
    token: &str,
    deadline: Instant,
) {
    loop {
        let (sent, sent_ms) = (Instant::now(), host_now_ms());
        let res = c
            .release(pb::ReleaseRequest {
                job: if lock { &ctx.lock_job } else { &ctx.slot_job }.clone(),
                slot_ms: slot,
                token: token.into(),
                result: pb::ReleaseResult::Succeeded as i32,
            })
            .await;
        let answered = Instant::now();
        let res = res.map(|_| 0).map_err(|s| {
            let f = classify(&s);
            ctx.fail(f, &s);
            f
        });
        let again = matches!(res, Err(f) if f.retry());
        ctx.rec.lock().unwrap().follows.push(FollowEv {
            op: Op::Release,
            lock,
            side,
            slot,
            token: token.into(),
            sent,
            sent_ms,
            answered,
            res,
        });
        if !again {
            return;
        }
        if Instant::now() >= deadline || ctx.stopped() {
            ctx.rec.lock().unwrap().gave_up += 1;
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Claims the lock (waiting for it), holds it a while, releases it.
async fn lock_claimer(ctx: Arc<Ctx>, side: usize) {
    let mut c = client(ctx.addrs[side]);
    while !ctx.stopped() {
        let req = pb::ClaimRequest {
            job: ctx.lock_job.clone(),
            slot_ms: 0,
            lease_ms: LOCK_LEASE_MS,
            wait_ms: LOCK_WAIT_MS,
            ..Default::default()
        };
        match ask(&ctx, &mut c, side, req).await {
            (Ok(a), sent) if a.outcome == pb::Outcome::Won => {
                hold(&ctx, &mut c, side, &a, sent).await;
            }
            (Ok(_), _) => {}
            (Err(_), _) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn hold(ctx: &Ctx, c: &mut ClaimsClient<Channel>, side: usize, won: &Answer, sent: Instant) {
    let ms = |v: i64| Duration::from_millis(v.max(0) as u64);
    let hold_until =
        Instant::now() + Duration::from_millis(rand::thread_rng().gen_range(500..2000));
    let mut deadline = sent + ms(won.valid_for_ms);
    let forget = |ctx: &Ctx| {
        let mut h = ctx.held.lock().unwrap();
        if h.is_some_and(|h| h.fencing == won.fencing) {
            *h = None;
        }
    };
    loop {
        let now = Instant::now();
        if now >= hold_until || ctx.stopped() {
            if let Some(h) = ctx.held.lock().unwrap().as_mut() {
                if h.fencing == won.fencing {
                    h.releasing = true;
                }
            }
            release(ctx, c, true, side, 0, &won.token, deadline).await;
            forget(ctx);
            return;
        }
        tokio::time::sleep((hold_until - now).min(Duration::from_millis(RENEW_EVERY_MS))).await;
        if Instant::now() >= hold_until {
            continue;
        }
        let (sent, sent_ms) = (Instant::now(), host_now_ms());
        let res = c
            .renew(pb::RenewRequest {
                job: ctx.lock_job.clone(),
                slot_ms: 0,
                token: won.token.clone(),
                lease_ms: LOCK_LEASE_MS,
            })
            .await;
        let answered = Instant::now();
        let res = match res {
            Ok(r) => {
                let r = r.into_inner();
                deadline = sent + ms(r.valid_for_ms);
                Ok(r.lease_until_ms)
            }
            Err(s) => {
                let f = classify(&s);
                ctx.fail(f, &s);
                Err(f)
            }
        };
        let keep = match res {
            Ok(_) => true,
            Err(f) => f.retry(),
        };
        ctx.rec.lock().unwrap().follows.push(FollowEv {
            op: Op::Renew,
            lock: true,
            side,
            slot: 0,
            token: won.token.clone(),
            sent,
            sent_ms,
            answered,
            res,
        });
        if !keep {
            forget(ctx);
            return;
        }
        if Instant::now() >= deadline {
            ctx.rec.lock().unwrap().gave_up += 1;
            forget(ctx);
            return;
        }
    }
}

// --- the mesh and the chaos -------------------------------------------------------

fn pause_in(range: (Duration, Duration)) -> Duration {
    let (lo, hi) = (range.0.as_millis() as u64, range.1.as_millis() as u64);
    Duration::from_millis(rand::thread_rng().gen_range(lo..=hi.max(lo)))
}

/// The chaos side, on its own thread (starting a sidecar blocks): kills and
/// restarts sidecars and restarts the store once, until the run is over.
fn chaos(ctx: &Ctx, plan: &Plan, sidecars: &mut [Sidecar], start: Instant) {
    let mut next_kill = Some(start + plan.first_kill);
    let mut restart_due = plan.server.map(|s| (s, start + plan.store_restart_at));
    let mut end = start + plan.duration;
    let cap = start + plan.duration + Duration::from_secs(120);
    loop {
        let now = Instant::now();
        // A store that came back late stretches the run, so that claims are
        // answered for a while after it recovered.
        let (recovered, restarted) = {
            let r = ctx.rec.lock().unwrap();
            (r.recovered, r.restart.is_some())
        };
        if let Some(rec) = recovered {
            end = end.max(rec + plan.tail_after_recovery);
        } else if restarted {
            end = end.max(now + Duration::from_millis(100));
        }
        if now >= end.min(cap) {
            return;
        }
        if let Some((server, at)) = restart_due {
            if now >= at {
                restart_due = None;
                let (stop, stop_ms) = (Instant::now(), host_now_ms());
                server.stop();
                let stopped = Instant::now();
                std::thread::sleep(plan.store_down);
                server.start();
                let started = Instant::now();
                ctx.rec.lock().unwrap().restart = Some(StoreRestart {
                    stop,
                    stop_ms,
                    stopped,
                    started,
                });
                continue;
            }
        }
        if let Some(at) = next_kill.filter(|at| now >= *at) {
            let victim = match plan.aim {
                Aim::Random => Some(rand::thread_rng().gen_range(0..sidecars.len())),
                Aim::LockHolder => ctx
                    .held
                    .lock()
                    .unwrap()
                    .filter(|h| !h.releasing)
                    .map(|h| h.side),
            };
            if let Some(v) = victim {
                let (at_kill, at_ms) = (Instant::now(), host_now_ms());
                let lock_fencing = ctx
                    .held
                    .lock()
                    .unwrap()
                    .filter(|h| h.side == v && !h.releasing)
                    .map(|h| h.fencing);
                sidecars[v].kill();
                ctx.rec.lock().unwrap().kills.push(Kill {
                    side: v,
                    at: at_kill,
                    at_ms,
                    up: None,
                    respawn_ms: i64::MAX,
                    up_ms: i64::MAX,
                    lock_fencing,
                });
                std::thread::sleep(Duration::from_millis(DOWN_MS));
                if let Some(k) = ctx.rec.lock().unwrap().kills.last_mut() {
                    k.respawn_ms = host_now_ms();
                }
                sidecars[v].restart();
                let up = Instant::now();
                if let Some(k) = ctx.rec.lock().unwrap().kills.last_mut() {
                    k.up = Some(up);
                    k.up_ms = host_now_ms();
                }
                next_kill = plan.kill_every.map(|r| up + pause_in(r));
            } else if now > at + Duration::from_secs(10) {
                // Nobody held the lock for 10 s: the report shows no kill.
                next_kill = None;
            } else {
                std::thread::sleep(Duration::from_millis(5));
            }
            continue;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs one store: starts the mesh, the claimers and the chaos, then judges.
pub async fn run(plan: Plan) -> Report {
    let root = tempfile::tempdir().unwrap();
    let load_before = loadavg();
    let mut sidecars = super::liveness::mesh(root.path(), SIDECARS, &plan.backend);
    let addrs: Vec<SocketAddr> = sidecars.iter().map(|s| s.addr).collect();
    super::mesh::linked(&addrs).await;
    let tag = format!("{:08x}", rand::random::<u32>());
    let ctx = Arc::new(Ctx {
        addrs: addrs.clone(),
        slot_job: format!("soak-slots-{tag}"),
        lock_job: format!("soak-lock-{tag}"),
        rec: Mutex::new(Record::default()),
        held: Mutex::new(None),
        stop: AtomicBool::new(false),
    });
    let start = Instant::now();
    {
        let mut r = ctx.rec.lock().unwrap();
        r.start = Some(start);
        r.start_ms = host_now_ms();
    }
    let mut tasks = Vec::new();
    for side in 0..SIDECARS {
        for _ in 0..plan.claimers {
            tasks.push(tokio::spawn(slot_claimer(ctx.clone(), side)));
        }
        for _ in 0..plan.lockers {
            tasks.push(tokio::spawn(lock_claimer(ctx.clone(), side)));
        }
    }
    let (c2, p2) = (ctx.clone(), plan.clone());
    let sidecars_back = tokio::task::spawn_blocking(move || {
        chaos(&c2, &p2, &mut sidecars, start);
        sidecars
    })
    .await;
    ctx.stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = start.elapsed();
    let mut sidecars = sidecars_back.unwrap();
    for s in &mut sidecars {
        s.kill();
    }
    let rec = std::mem::take(&mut *ctx.rec.lock().unwrap());
    let mut report = Report::judge(&plan, &rec, elapsed);
    report.load_before = load_before;
    report.load_after = loadavg();
    for (f, e) in &rec.examples {
        eprintln!("soak {}: first {f:?}: {e}", plan.store);
    }
    report
}

/// The 1, 5 and 15 minute load averages.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

// --- the judgement --------------------------------------------------------------

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Report {
    pub store: String,
    pub seconds: f64,
    pub sidecars: usize,
    pub claimers: usize,
    pub sidecar_kills: usize,
    pub store_restarts: usize,
    /// Claim RPCs sent (slots and lock), and how many got an outcome.
    pub claims: usize,
    pub answered: usize,
    pub outcomes: BTreeMap<String, usize>,
    /// Distinct tokens told WON (slots + lock), and takeovers among them.
    pub wins: usize,
    pub slot_wins: usize,
    pub lock_wins: usize,
    pub takeovers: usize,
    /// Slots *asked in time*: at least one claimer sent a Claim for the slot
    /// no later than `max_late_ms - SLOT_MARGIN_MS` after the slot time and
    /// got an outcome back (its sidecar was alive and the store answered).
    pub slots_asked_in_time: usize,
    pub slots_won: usize,
    /// Slots asked in time for which no claimer was ever told WON.
    pub missing_winners: usize,
    /// Claims sent in time but answered LATE (the store decided too slowly).
    pub late_in_window: usize,
    /// Claimers told WON for a run that someone else still held: an earlier
    /// winner whose lease (store clock, after its renewals) was current at
    /// this decision, which had not released and whose sidecar had not been
    /// killed since it claimed; or, for a slot, one told WON after an earlier
    /// winner had released (finished) the slot.
    pub double_wins: usize,
    /// The double wins by what preceded them.
    pub double_wins_by_cause: BTreeMap<String, usize>,
    /// Fencing numbers told WON to more than one token of a job.
    pub fencing_reused: usize,
    /// Renews/releases that succeeded although sent after the store had
    /// decided for the next winner of the run.
    pub stale_successes: usize,
    pub takeover_samples: usize,
    pub takeover_p50_ms: u64,
    pub takeover_p99_ms: u64,
    pub takeover_max_ms: u64,
    pub takeover_min_ms: u64,
    pub takeover_bound_ms: (u64, u64),
    pub takeovers_early: usize,
    pub takeovers_late: usize,
    pub expiry_ms: u64,
    pub heartbeat_ms: u64,
    pub renewals: usize,
    pub fenced_refusals: usize,
    pub fenced_renew: usize,
    pub fenced_release: usize,
    /// Fenced although the holder's sidecar was never killed after its win.
    pub fenced_unexplained: usize,
    pub gave_up: usize,
    pub store_restart_s: f64,
    pub unavailable_during_restart: usize,
    pub unavailable_outside_restart: usize,
    pub store_recovered_after_s: f64,
    pub sidecar_unreachable: usize,
    pub other_errors: BTreeMap<String, usize>,
    /// Incidents, one line each (double wins, reuses, missing winners…).
    pub incidents: Vec<String>,
    /// What the chaos did and when, one line each.
    #[serde(skip)]
    pub chaos: Vec<String>,
    pub load_before: String,
    pub load_after: String,
}

/// The nearest-rank quantile of sorted values.
fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() as f64) * q).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

impl Report {
    pub fn judge(plan: &Plan, rec: &Record, elapsed: Duration) -> Report {
        let mut r = Report {
            store: plan.store.into(),
            seconds: elapsed.as_secs_f64(),
            sidecars: SIDECARS,
            claimers: SIDECARS * (plan.claimers + plan.lockers),
            sidecar_kills: rec.kills.len(),
            store_restarts: usize::from(rec.restart.is_some()),
            expiry_ms: EXPIRY,
            heartbeat_ms: HB,
            takeover_bound_ms: (TAKEOVER_LO_MS, TAKEOVER_HI_MS),
            gave_up: rec.gave_up,
            ..Default::default()
        };
        let killed_between = |side: usize, from: Instant, to: Instant| {
            rec.kills
                .iter()
                .any(|k| k.side == side && k.at >= from && k.at <= to)
        };
        let base = rec.start.unwrap_or_else(Instant::now);
        let t = |i: Instant| format!("+{:.1}s", i.saturating_duration_since(base).as_secs_f64());
        for k in &rec.kills {
            r.chaos.push(format!(
                "SIGKILL sidecar {} at {}, back at {}{}",
                k.side,
                t(k.at),
                k.up.map_or("-".into(), t),
                if k.lock_fencing.is_some() {
                    " (it held the lock)"
                } else {
                    ""
                }
            ));
        }
        if let Some(s) = &rec.restart {
            r.chaos.push(format!(
                "store stopped at {} (down at {}), started at {}, every sidecar answering at {}",
                t(s.stop),
                t(s.stopped),
                t(s.started),
                rec.recovered.map_or("never".into(), t)
            ));
        }
        // Store restart window: from the stop to the first answer after it.
        let window = rec.restart.as_ref().map(|s| {
            let end = rec.recovered.unwrap_or(Instant::now());
            r.store_restart_s = (s.started - s.stop).as_secs_f64();
            r.store_recovered_after_s = rec
                .recovered
                .map_or(f64::NAN, |t| (t - s.stop).as_secs_f64());
            (s.stop, end)
        });
        let in_window = |t: Instant| window.is_some_and(|(a, b)| t >= a && t <= b);
        let count_fail = |r: &mut Report, f: Fail, answered: Instant| match f {
            Fail::Sidecar => r.sidecar_unreachable += 1,
            Fail::StoreUnavailable if in_window(answered) => r.unavailable_during_restart += 1,
            Fail::StoreUnavailable => r.unavailable_outside_restart += 1,
            Fail::Fenced | Fail::NotFound | Fail::Other(_) => {
                *r.other_errors.entry(format!("{f:?}")).or_default() += 1
            }
        };

        // Every WON, by (lock, slot).
        let mut wins: BTreeMap<(bool, i64), Vec<&ClaimEv>> = BTreeMap::new();
        let mut asked: HashSet<i64> = HashSet::new();
        for ev in &rec.claims {
            r.claims += 1;
            match &ev.res {
                Ok(a) => {
                    r.answered += 1;
                    *r.outcomes
                        .entry(outcome_name(a.outcome as i32).into())
                        .or_default() += 1;
                    if a.outcome == pb::Outcome::Won {
                        wins.entry((ev.lock, ev.slot)).or_default().push(ev);
                    }
                    if !ev.lock && ev.sent_ms - ev.slot <= SLOT_LATE_MS - SLOT_MARGIN_MS {
                        asked.insert(ev.slot);
                        if a.outcome == pb::Outcome::Late {
                            r.late_in_window += 1;
                        }
                    }
                }
                Err(f) => count_fail(&mut r, *f, ev.answered),
            }
        }
        for f in &rec.follows {
            match f.res {
                Ok(_) if f.op == Op::Renew => r.renewals += 1,
                Ok(_) => {}
                Err(Fail::Fenced) => {
                    r.fenced_refusals += 1;
                    match f.op {
                        Op::Renew => r.fenced_renew += 1,
                        Op::Release => r.fenced_release += 1,
                    }
                }
                Err(e) => count_fail(&mut r, e, f.answered),
            }
        }

        // Distinct winning tokens (a resend of the same token is one win).
        let mut by_token: HashMap<&str, &ClaimEv> = HashMap::new();
        for evs in wins.values() {
            for ev in evs {
                let a = ev.res.as_ref().unwrap();
                by_token.entry(a.token.as_str()).or_insert(ev);
            }
        }
        let won = |ev: &ClaimEv| ev.res.as_ref().unwrap().clone();
        r.wins = by_token.len();
        r.slot_wins = by_token.values().filter(|e| !e.lock).count();
        r.lock_wins = r.wins - r.slot_wins;
        r.takeovers = by_token
            .values()
            .filter(|e| !e.lock && won(e).attempt > 1)
            .count();
        r.slots_won = wins.keys().filter(|(lock, _)| !lock).count();

        // Missing winners: asked in time, and nobody was told WON.
        let mut missing: Vec<i64> = asked
            .iter()
            .copied()
            .filter(|s| !wins.contains_key(&(false, *s)))
            .collect();
        missing.sort_unstable();
        r.slots_asked_in_time = asked.len();
        r.missing_winners = missing.len();
        for s in missing.iter().take(20) {
            let outs: Vec<String> = rec
                .claims
                .iter()
                .filter(|e| !e.lock && e.slot == *s)
                .map(|e| match &e.res {
                    Ok(a) => format!("{}@+{}ms", outcome_name(a.outcome as i32), e.sent_ms - s),
                    Err(f) => format!("{f:?}@+{}ms", e.sent_ms - s),
                })
                .collect();
            r.incidents
                .push(format!("missing winner: slot {s}: answers {outs:?}"));
        }

        // Successful renews/releases by token.
        let mut ok_follow: HashMap<&str, Vec<&FollowEv>> = HashMap::new();
        for f in &rec.follows {
            if f.res.is_ok() {
                ok_follow.entry(f.token.as_str()).or_default().push(f);
            }
        }

        let at = |ms: i64| format!("+{:.1}s", (ms - rec.start_ms) as f64 / 1000.0);
        for ((lock, slot), evs) in &wins {
            let what = if *lock {
                "lock".to_string()
            } else {
                format!("slot {slot}")
            };
            // One entry per winning token, in the order the store decided.
            let mut firsts: Vec<&ClaimEv> = Vec::new();
            let mut seen = HashSet::new();
            for ev in evs {
                if seen.insert(ev.res.as_ref().unwrap().token.as_str()) {
                    firsts.push(ev);
                }
            }
            firsts.sort_by_key(|e| (won(e).now_ms, won(e).fencing));
            for (i, w) in firsts.iter().enumerate() {
                let a = won(w);
                // A stale success: the token renewed or released the run
                // after the store had decided for the next winner.
                if let Some(next) = firsts.get(i + 1) {
                    let n = won(next);
                    for f in ok_follow.get(a.token.as_str()).into_iter().flatten() {
                        if f.sent_ms > n.now_ms + 1 {
                            r.stale_successes += 1;
                            r.incidents.push(format!(
                                "stale success at {}: {what}: a {:?} of fencing {} succeeded, sent {} ms after fencing {} was told WON",
                                at(f.sent_ms),
                                f.op,
                                a.fencing,
                                f.sent_ms - n.now_ms,
                                n.fencing
                            ));
                        }
                    }
                }
                // A double win: `w` was told WON while the winner before it
                // still held the run, or (slots) after it had finished it.
                if let Some(p) = i.checked_sub(1).map(|j| firsts[j]) {
                    let pa = won(p);
                    let pf = ok_follow.get(pa.token.as_str());
                    if pf.is_some_and(|v| v.iter().any(|f| f.op == Op::Release)) {
                        // A released lock is free again; a released slot is done.
                        if !lock {
                            r.double_wins += 1;
                            *r.double_wins_by_cause
                                .entry("won_after_release".into())
                                .or_default() += 1;
                            r.incidents.push(format!(
                                "double win at {}: {what}: fencing {} told WON after fencing {} had released the run",
                                at(a.now_ms),
                                a.fencing,
                                pa.fencing
                            ));
                        }
                        continue;
                    }
                    let lease_until = pf
                        .into_iter()
                        .flatten()
                        .filter(|f| f.op == Op::Renew && f.sent_ms <= a.now_ms)
                        .filter_map(|f| f.res.ok())
                        .fold(pa.lease_until_ms, i64::max);
                    let dead = rec
                        .kills
                        .iter()
                        .any(|k| k.side == p.side && k.at_ms >= p.sent_ms && k.at_ms <= a.now_ms);
                    if a.now_ms < lease_until && !dead {
                        // What happened just before: a restart of the
                        // winner's sidecar, of any sidecar, or of the store.
                        let since = |side: Option<usize>| {
                            rec.kills
                                .iter()
                                .filter(|k| {
                                    side.is_none_or(|s| k.side == s) && k.respawn_ms <= a.now_ms
                                })
                                .map(|k| a.now_ms - k.respawn_ms)
                                .min()
                        };
                        let store = rec
                            .restart
                            .as_ref()
                            .is_some_and(|s| pa.now_ms < s.stop_ms && s.stop_ms <= a.now_ms);
                        let (kind, cause) = match (store, since(Some(w.side))) {
                            (true, _) => ("store_restart", "the store restarted in between".to_string()),
                            (false, Some(ms)) if ms < EXPIRY as i64 => (
                                "winner_sidecar_restarted_within_expiry",
                                format!("{ms} ms after the winner's sidecar was started again"),
                            ),
                            (false, w_ms) => (
                                "other",
                                format!(
                                    "the winner's sidecar restarted {} ms before, the holder's {} ms before, any sidecar {} ms before",
                                    w_ms.map_or("never".into(), |v| v.to_string()),
                                    since(Some(p.side)).map_or("never".into(), |v| v.to_string()),
                                    since(None).map_or("never".into(), |v| v.to_string()),
                                ),
                            ),
                        };
                        *r.double_wins_by_cause.entry(kind.into()).or_default() += 1;
                        r.double_wins += 1;
                        r.incidents.push(format!(
                            "double win at {}: {what}: fencing {} attempt {} (sidecar {}) told WON while fencing {} attempt {} (sidecar {}, never killed) held it with {} ms of lease left ({cause})",
                            at(a.now_ms),
                            a.fencing,
                            a.attempt,
                            w.side,
                            pa.fencing,
                            pa.attempt,
                            p.side,
                            lease_until - a.now_ms
                        ));
                    }
                }
            }
        }
        // (b) a fencing number told WON to two tokens of one job.
        for lock in [false, true] {
            let mut by_fencing: HashMap<u64, HashSet<&str>> = HashMap::new();
            for ev in by_token.values().filter(|e| e.lock == lock) {
                let a = ev.res.as_ref().unwrap();
                by_fencing.entry(a.fencing).or_default().insert(&a.token);
            }
            let reused: usize = by_fencing.values().map(|t| t.len() - 1).sum();
            if reused > 0 {
                r.fencing_reused += reused;
                r.incidents.push(format!(
                    "fencing reused: {} numbers of the {} job told WON to more than one token",
                    by_fencing.values().filter(|t| t.len() > 1).count(),
                    if lock { "lock" } else { "slots" }
                ));
            }
        }

        // Fenced refusals whose holder's sidecar was never killed after its win.
        for f in &rec.follows {
            if f.res != Err(Fail::Fenced) {
                continue;
            }
            let Some(w) = by_token.get(f.token.as_str()) else {
                continue;
            };
            // A store outage can let a lease lapse without a kill.
            let explained = killed_between(w.side, w.sent, f.sent)
                || in_window(w.answered)
                || in_window(f.sent);
            if !explained {
                r.fenced_unexplained += 1;
                r.incidents.push(format!(
                    "fenced without a kill at {}: {:?} of the {} (sidecar {}), {} ms after its win",
                    at(f.sent_ms),
                    f.op,
                    if f.lock {
                        "lock".into()
                    } else {
                        format!("slot {}", f.slot)
                    },
                    f.side,
                    (f.sent - w.answered).as_millis()
                ));
            }
        }

        // Takeover latency: from the SIGKILL of the lock holder's sidecar to
        // the next WON of the lock.
        let mut lat: Vec<u64> = Vec::new();
        let lock_wins: Vec<&ClaimEv> = by_token.values().filter(|e| e.lock).copied().collect();
        for k in &rec.kills {
            let Some(f) = k.lock_fencing else { continue };
            let next = lock_wins
                .iter()
                .filter(|e| won(e).fencing > f && e.answered > k.at)
                .min_by_key(|e| e.answered);
            match next {
                Some(e) => {
                    let ms = (e.answered - k.at).as_millis() as u64;
                    if e.side == k.side {
                        r.incidents.push(format!(
                            "takeover after a kill came from the restarted victim itself after {ms} ms"
                        ));
                    }
                    lat.push(ms);
                }
                None => r.incidents.push(format!(
                    "no takeover after the lock holder's sidecar {} was killed",
                    k.side
                )),
            }
        }
        lat.sort_unstable();
        r.takeover_samples = lat.len();
        r.takeover_p50_ms = quantile(&lat, 0.5);
        r.takeover_p99_ms = quantile(&lat, 0.99);
        r.takeover_max_ms = lat.last().copied().unwrap_or(0);
        r.takeover_min_ms = lat.first().copied().unwrap_or(0);
        r.takeovers_early = lat.iter().filter(|&&l| l < TAKEOVER_LO_MS).count();
        r.takeovers_late = lat.iter().filter(|&&l| l > TAKEOVER_HI_MS).count();
        r
    }

    /// The human-readable table.
    pub fn table(&self) -> String {
        let mut t = String::new();
        let mut row = |k: &str, v: String| t.push_str(&format!("  {k:<44} {v}\n"));
        row("store", self.store.clone());
        row("run (s)", format!("{:.0}", self.seconds));
        row(
            "sidecars / claimers",
            format!("{} / {}", self.sidecars, self.claimers),
        );
        row(
            "sidecar SIGKILLs (each restarted)",
            self.sidecar_kills.to_string(),
        );
        row(
            "store restarts",
            if self.store == "sqlite" {
                "n/a (SQLite has no server)".into()
            } else {
                format!(
                    "{} ({:.1} s stop..start, answering again after {:.1} s)",
                    self.store_restarts, self.store_restart_s, self.store_recovered_after_s
                )
            },
        );
        row(
            "claims sent / answered",
            format!("{} / {}", self.claims, self.answered),
        );
        row("outcomes", format!("{:?}", self.outcomes));
        row(
            "wins (slots + lock) / slot takeovers",
            format!(
                "{} ({} + {}) / {}",
                self.wins, self.slot_wins, self.lock_wins, self.takeovers
            ),
        );
        row(
            "slots asked in time / won",
            format!("{} / {}", self.slots_asked_in_time, self.slots_won),
        );
        row("missing winners", self.missing_winners.to_string());
        row("LATE to in-window claims", self.late_in_window.to_string());
        row(
            "double wins",
            format!("{} {:?}", self.double_wins, self.double_wins_by_cause),
        );
        row("fencing numbers reused", self.fencing_reused.to_string());
        row(
            "stale renew/release successes",
            self.stale_successes.to_string(),
        );
        row(
            "lock takeover after SIGKILL p50/p99/max",
            format!(
                "{}/{}/{} ms (n={}, min {} ms; expiry {} ms, heartbeat {} ms; bound [{}, {}]: {} early, {} late)",
                self.takeover_p50_ms,
                self.takeover_p99_ms,
                self.takeover_max_ms,
                self.takeover_samples,
                self.takeover_min_ms,
                self.expiry_ms,
                self.heartbeat_ms,
                self.takeover_bound_ms.0,
                self.takeover_bound_ms.1,
                self.takeovers_early,
                self.takeovers_late
            ),
        );
        row("lock renewals", self.renewals.to_string());
        row(
            "fenced refusals (renew + release)",
            format!(
                "{} ({} + {}), {} without a kill",
                self.fenced_refusals,
                self.fenced_renew,
                self.fenced_release,
                self.fenced_unexplained
            ),
        );
        row(
            "UNAVAILABLE during / outside store restart",
            format!(
                "{} / {}",
                self.unavailable_during_restart, self.unavailable_outside_restart
            ),
        );
        row(
            "no answer (sidecar down)",
            self.sidecar_unreachable.to_string(),
        );
        row("other errors", format!("{:?}", self.other_errors));
        row("holders that gave up (deadline)", self.gave_up.to_string());
        row(
            "load average before / after",
            format!("{} / {}", self.load_before, self.load_after),
        );
        for c in &self.chaos {
            t.push_str(&format!("  - {c}\n"));
        }
        for i in &self.incidents {
            t.push_str(&format!("  ! {i}\n"));
        }
        t
    }

    pub fn json(&self) -> String {
        serde_json::to_string(self).unwrap()
    }
}
