//! Shared test support: store factories, the conformance suite, service
//! checks and real-process helpers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod brokers;
pub mod contest;
pub mod process;
pub mod services;
pub mod suite;

use anarchon::claim::*;

/// A job name unique to this test run.
pub fn job(prefix: &str) -> Job {
    let r: u32 = rand::random();
    Job::parse(&format!("{prefix}-{r:08x}")).unwrap()
}

pub fn holder(node: &str, instance: u64) -> Holder {
    Holder {
        node: node.into(),
        instance,
    }
}

pub fn spec(job: &Job, slot_ms: i64, h: &Holder) -> ClaimSpec {
    ClaimSpec {
        job: job.clone(),
        slot_ms,
        token: Token::generate(),
        holder: h.clone(),
        lease_ms: 30_000,
        max_late_ms: 60_000,
        overlap: Overlap::Allow,
        max_attempts: 3,
    }
}
