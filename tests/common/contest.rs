//! The multi-process contest: several real `anarchon serve` processes on one
//! backend, many concurrent gRPC claimers, exactly one `WON` per slot.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anarchon::proto as pb;
use anarchon::proto::claims_client::ClaimsClient;
use tokio::sync::Mutex;
use tonic::transport::Channel;

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

pub struct Contest {
    /// Backend URL every sidecar uses (`None` = each uses its own default, which
    /// is wrong for a contest; give the shared SQLite file explicitly).
    pub backend: String,
    pub sidecars: usize,
    pub claimers: usize,
    pub slots: i64,
    /// Each slot is claimed by claimers/`spread` claimers.
    pub spread: usize,
    pub extra_flags: Vec<String>,
}

impl Default for Contest {
    fn default() -> Self {
        Contest {
            backend: String::new(),
            sidecars: 3,
            claimers: 48,
            slots: 2000,
            spread: 4,
            extra_flags: Vec::new(),
        }
    }
}

async fn client(addr: std::net::SocketAddr) -> ClaimsClient<Channel> {
    let ch = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    ClaimsClient::new(ch)
}

impl Contest {
    /// Runs the contest and asserts zero double wins and zero missing winners.
    pub async fn run(&self) -> Report {
        let root = tempfile::tempdir().unwrap();
        let mut flags: Vec<&str> = vec!["--backend", &self.backend];
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
            let (slots, spread) = (self.slots, self.spread as i64);
            tasks.push(tokio::spawn(async move {
                let mut cl = client(addr).await;
                let mut n = 0usize;
                for i in 0..slots {
                    if (i + c as i64) % spread != 0 {
                        continue;
                    }
                    let r = cl
                        .claim(pb::ClaimRequest {
                            job: job.clone(),
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
        eprintln!("contest on {}: {report:?}", self.backend);
        assert_eq!(report.double_wins, 0, "double wins: {report:?}");
        assert_eq!(
            report.missing_winners, 0,
            "slots without a winner: {report:?}"
        );
        report
    }
}
