//! The multi-process contest: several real `anarchon serve` processes on one
//! backend, many concurrent gRPC claimers, exactly one `WON` per slot.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anarchon::proto as pb;
use tokio::sync::Mutex;

use super::process::Sidecar;

#[derive(Debug, Default)]
pub struct Report {
    pub slots: usize,
    pub claims: usize,
    pub double_wins: usize,
    pub missing_winners: usize,
    pub outcomes: HashMap<&'static str, usize>,
    pub elapsed: Duration,
}

/// A backend the contest runs on: its URL, the flags its sidecars need, and
/// what to clean up afterwards. The factories below return `None` when the
/// service is unreachable outside CI (the test is then SKIPPED).
pub struct Backend {
    pub url: String,
    pub flags: Vec<String>,
    cleanup: Cleanup,
}

enum Cleanup {
    None,
    /// The shared SQLite file lives here until the contest ends.
    Dir(#[allow(dead_code)] tempfile::TempDir),
    PgTables(String),
    AmqpQueues(String),
}

impl Cleanup {
    async fn run(self) {
        match self {
            Cleanup::None | Cleanup::Dir(_) => {}
            Cleanup::PgTables(prefix) => super::pg::drop_tables(&prefix).await,
            // Durable gates: gone now rather than when they expire.
            Cleanup::AmqpQueues(prefix) => super::brokers::sweep_queues(&prefix).await,
        }
    }
}

/// Contests test exclusivity, not lateness: on a loaded machine a contest
/// can outlive the default 60 s `max_late`, so the sidecars allow more.
fn max_late(ms: u64) -> Vec<String> {
    vec!["--max-late-ms".into(), ms.to_string()]
}

impl Backend {
    /// One SQLite file shared by every sidecar.
    pub async fn sqlite() -> Option<Backend> {
        let dir = tempfile::tempdir().unwrap();
        Some(Backend {
            url: format!("sqlite://{}", dir.path().join("shared.db").display()),
            flags: Vec::new(),
            cleanup: Cleanup::Dir(dir),
        })
    }

    /// A fresh table prefix (the sidecars also migrate it at the same moment).
    pub async fn postgres() -> Option<Backend> {
        if !super::pg::available() {
            return None;
        }
        let prefix = super::pg::prefix();
        Some(Backend {
            url: super::pg::backend(&prefix),
            flags: max_late(3_600_000),
            cleanup: Cleanup::PgTables(prefix),
        })
    }

    /// The single Redis with `strategy`, on a fresh key prefix.
    pub async fn redis(strategy: &str) -> Option<Backend> {
        Self::redis_if(super::redis::have_redis(), super::redis::url(strategy))
    }

    /// The Redis on a Unix socket (`redis+unix://`) with `strategy`.
    pub async fn redis_unix(strategy: &str) -> Option<Backend> {
        Self::redis_if(super::redis::have_unix(), super::redis::unix_url(strategy))
    }

    /// The local Redis Cluster with `strategy`, on a fresh key prefix.
    pub async fn redis_cluster(strategy: &str) -> Option<Backend> {
        Self::redis_if(
            super::redis::have_cluster(),
            super::redis::cluster_url(strategy),
        )
    }

    /// A Redis backend at `url` when its server is `up`.
    fn redis_if(up: bool, url: String) -> Option<Backend> {
        up.then(|| Backend {
            url,
            flags: max_late(3_600_000),
            cleanup: Cleanup::None,
        })
    }

    /// RabbitMQ: every claim declares a durable queue. The gates remember
    /// 11 min, longer than the 10 min of lateness the sidecars allow.
    pub async fn rabbitmq() -> Option<Backend> {
        if !super::brokers::rabbitmq_up() {
            return None;
        }
        let prefix = super::brokers::prefix();
        Some(Backend {
            url: super::brokers::amqp_url(&prefix, "&slot_ttl_ms=660000"),
            flags: max_late(600_000),
            cleanup: Cleanup::AmqpQueues(prefix),
        })
    }

    /// One JetStream stream whose window (11 min) outlasts the lateness.
    pub async fn nats() -> Option<Backend> {
        if !super::brokers::nats_up() {
            return None;
        }
        super::brokers::sweep_old_test_streams().await;
        Some(Backend {
            url: super::brokers::nats_url(&super::brokers::prefix(), "&duplicate_window_ms=660000"),
            flags: max_late(600_000),
            cleanup: Cleanup::None,
        })
    }
}

pub struct Contest {
    pub sidecars: usize,
    pub claimers: usize,
    pub slots: i64,
    /// Each slot is claimed by claimers/`spread` claimers.
    pub spread: usize,
    /// Slot `i` is of job `i % jobs` (1: every slot of one job).
    pub jobs: i64,
    pub extra_flags: Vec<String>,
}

impl Default for Contest {
    fn default() -> Self {
        Contest {
            sidecars: 3,
            claimers: 48,
            slots: 2000,
            spread: 4,
            jobs: 1,
            extra_flags: Vec::new(),
        }
    }
}

impl Contest {
    /// Runs the contest on `backend`, cleans up after it, and asserts: every
    /// claimer made all its claims, each slot has exactly one `WON`, zero
    /// double wins and zero missing winners.
    pub async fn run_on(self, backend: Backend) -> Report {
        let report = self.run(&backend.url, &backend.flags).await;
        backend.cleanup.run().await;
        assert_eq!(
            report.claims,
            self.expected_claims(),
            "claims made: {report:?}"
        );
        assert_eq!(
            report.outcomes.get("WON").copied(),
            Some(self.slots as usize),
            "one WON per slot: {report:?}"
        );
        report
    }

    /// Claimer `c` claims slot `i` when `(i + c) % spread == 0`.
    fn expected_claims(&self) -> usize {
        let spread = self.spread as i64;
        (0..self.claimers as i64)
            .map(|c| (0..self.slots).filter(|i| (i + c) % spread == 0).count())
            .sum()
    }

    /// Runs the contest on `backend` with `backend_flags` and asserts zero
    /// double wins and zero missing winners.
    pub async fn run(&self, backend: &str, backend_flags: &[String]) -> Report {
        let root = tempfile::tempdir().unwrap();
        let mut flags: Vec<&str> = vec!["--backend", backend];
        flags.extend(backend_flags.iter().map(String::as_str));
        flags.extend(self.extra_flags.iter().map(String::as_str));
        let sidecars: Vec<Sidecar> = (0..self.sidecars)
            .map(|i| Sidecar::start(&root.path().join(format!("s{i}")), &flags))
            .collect();
        let job = format!("contest-{:08x}", rand::random::<u32>());
        let base = anarchon::claim::host_now_ms();
        let wins: Arc<Mutex<HashMap<i64, usize>>> = Default::default();
        let outcomes: Arc<Mutex<HashMap<&'static str, usize>>> = Default::default();
        let started = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..self.claimers {
            let addr = sidecars[c % sidecars.len()].addr;
            let (job, wins, outcomes) = (job.clone(), wins.clone(), outcomes.clone());
            let (slots, spread, jobs) = (self.slots, self.spread as i64, self.jobs.max(1));
            tasks.push(tokio::spawn(async move {
                let mut cl = super::claims_client(addr).await;
                let mut n = 0usize;
                for i in 0..slots {
                    if (i + c as i64) % spread != 0 {
                        continue;
                    }
                    let r = cl
                        .claim(pb::ClaimRequest {
                            job: if jobs == 1 {
                                job.clone()
                            } else {
                                format!("{job}-{}", i % jobs)
                            },
                            slot_ms: base + i,
                            ..Default::default()
                        })
                        .await
                        .unwrap_or_else(|e| panic!("claim failed: {e:?}"))
                        .into_inner();
                    n += 1;
                    let name = anarchon::cli::outcome_name(r.outcome);
                    *outcomes.lock().await.entry(name).or_default() += 1;
                    match pb::Outcome::try_from(r.outcome) {
                        Ok(pb::Outcome::Won) => {
                            assert_eq!(r.token.len(), 32);
                            *wins.lock().await.entry(base + i).or_default() += 1;
                        }
                        Ok(pb::Outcome::Running) | Ok(pb::Outcome::Lost) => {
                            assert!(r.token.is_empty(), "a loser saw a token");
                        }
                        other => panic!("invalid outcome in a contest: {other:?} {r:?}"),
                    }
                }
                n
            }));
        }
        let mut claims = 0;
        for t in tasks {
            claims += t.await.unwrap();
        }
        let elapsed = started.elapsed();
        drop(sidecars);
        let wins = wins.lock().await;
        let double_wins = wins.values().filter(|&&n| n > 1).count();
        let missing_winners = (0..self.slots)
            .filter(|i| !wins.contains_key(&(base + i)))
            .count();
        let report = Report {
            slots: self.slots as usize,
            claims,
            double_wins,
            missing_winners,
            outcomes: outcomes.lock().await.clone(),
            elapsed,
        };
        eprintln!("contest on {backend}: {report:?}");
        assert_eq!(report.double_wins, 0, "double wins: {report:?}");
        assert_eq!(
            report.missing_winners, 0,
            "slots without a winner: {report:?}"
        );
        report
    }
}
