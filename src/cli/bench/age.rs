//! `--age N`: ages a store with N finished runs (claim, then release, from
//! many concurrent tasks through the raw store step) while the store's
//! retention pruning runs as the sidecar runs it (`store::prune_loop`), so
//! the claims measured afterwards meet a store that has done N runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::claim::*;
use crate::store::{self, DynStore};

/// How many distinct jobs the aged runs are spread over.
const JOBS: u64 = 1000;

/// What aging did.
#[derive(Debug, Clone)]
pub struct Aged {
    pub runs: u64,
    pub errors: u64,
    pub seconds: f64,
    pub retention_ms: u64,
    pub prune_every_ms: u64,
}

impl Aged {
    pub fn json(&self) -> serde_json::Value {
        json!({
            "runs": self.runs,
            "errors": self.errors,
            "seconds": super::round(self.seconds),
            "runs_per_s": super::round(self.runs as f64 / self.seconds.max(1e-9)),
            "retention_ms": self.retention_ms,
            "prune_every_ms": self.prune_every_ms,
        })
    }
}

/// Runs `prune_loop` for the store until the returned guard is dropped.
pub struct Pruner(tokio::task::JoinHandle<()>);

impl Pruner {
    pub fn start(store: DynStore, retention: Duration, every: Duration) -> Pruner {
        Pruner(tokio::spawn(store::prune_loop(store, retention, every)))
    }
}

impl Drop for Pruner {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Creates `n` finished runs from `tasks` concurrent tasks; prints progress
/// on stderr every 10 %.
pub async fn age(
    store: &DynStore,
    n: u64,
    tasks: usize,
    quiet: bool,
) -> anyhow::Result<(u64, u64, f64)> {
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let run = format!("{:x}", rand::random::<u32>());
    let base = host_now_ms();
    let holder = Holder {
        node: "bench-age".into(),
        instance: 1,
    };
    // Aging that mostly fails would measure nothing: stop early.
    let give_up = (n / 100).max(1000);
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..tasks.max(1) {
        let (store, next, done, errors) =
            (store.clone(), next.clone(), done.clone(), errors.clone());
        let (run, holder) = (run.clone(), holder.clone());
        handles.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n || errors.load(Ordering::Relaxed) > give_up {
                    break;
                }
                let Ok(job) = Job::parse(&format!("age-{run}-{}", i % JOBS)) else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                // Unique per run and 10 ms apart, so the slots stay ahead
                // of the clock (a slot more than max-late behind it would be
                // answered LATE) at any rate above 100/s.
                let spec = super::bench_spec(job.clone(), base + 10 * i as i64, &holder);
                let finished = match store.claim(&spec, &DeadHolders::none()).await {
                    Ok(a) if a.outcome == Outcome::Won => store
                        .release(
                            &ReleaseSpec {
                                job,
                                slot_ms: spec.slot_ms,
                                token: spec.token.clone(),
                                result: ReleaseResult::Succeeded,
                            },
                            &DeadHolders::none(),
                        )
                        .await
                        .is_ok(),
                    _ => false,
                };
                if finished {
                    done.fetch_add(1, Ordering::Relaxed);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let progress = {
        let (done, errors) = (done.clone(), errors.clone());
        tokio::spawn(async move {
            let mut shown = 0;
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let d = done.load(Ordering::Relaxed);
                if !quiet && n >= 10 && d * 10 / n > shown {
                    shown = d * 10 / n;
                    eprintln!(
                        "anarchon bench: aged {d} of {n} runs in {:.0} s ({} failed)",
                        started.elapsed().as_secs_f64(),
                        errors.load(Ordering::Relaxed)
                    );
                }
            }
        })
    };
    for h in handles {
        h.await?;
    }
    progress.abort();
    let failed = errors.load(Ordering::Relaxed);
    if failed > give_up {
        anyhow::bail!(
            "aging gave up: {failed} of {} claims or releases did not finish a run",
            done.load(Ordering::Relaxed) + failed
        );
    }
    Ok((
        done.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64(),
    ))
}
