//! Protobuf ↔ domain mappings, with no checks: [`super::validate`] decides
//! what a request may ask for; this file only says how a value is spelled
//! on each side.

use crate::claim::*;
use crate::proto as pb;

// --- proto → domain -----------------------------------------------------------

/// A request's overlap policy; `None` when unspecified (the sidecar's
/// default applies).
pub fn overlap(o: pb::Overlap) -> Option<Overlap> {
    match o {
        pb::Overlap::Unspecified => None,
        pb::Overlap::Allow => Some(Overlap::Allow),
        pb::Overlap::Skip => Some(Overlap::Skip),
    }
}

/// A release's result; `None` when unspecified (refused by validation).
pub fn release_result(r: pb::ReleaseResult) -> Option<ReleaseResult> {
    match r {
        pb::ReleaseResult::Unspecified => None,
        pb::ReleaseResult::Succeeded => Some(ReleaseResult::Succeeded),
        pb::ReleaseResult::Failed => Some(ReleaseResult::Failed),
    }
}

// --- domain → proto -----------------------------------------------------------

pub fn overlap_pb(o: Overlap) -> pb::Overlap {
    match o {
        Overlap::Allow => pb::Overlap::Allow,
        Overlap::Skip => pb::Overlap::Skip,
    }
}

pub fn outcome_pb(o: Outcome) -> pb::Outcome {
    match o {
        Outcome::Won => pb::Outcome::Won,
        Outcome::Lost => pb::Outcome::Lost,
        Outcome::Running => pb::Outcome::Running,
        Outcome::Done => pb::Outcome::Done,
        Outcome::Late => pb::Outcome::Late,
        Outcome::Overlap => pb::Outcome::Overlap,
    }
}

pub fn state_pb(s: RunState) -> pb::RunState {
    match s {
        RunState::Running => pb::RunState::Running,
        RunState::Succeeded => pb::RunState::Succeeded,
        RunState::Failed => pb::RunState::Failed,
        RunState::Interrupted => pb::RunState::Interrupted,
        RunState::Claimed => pb::RunState::Claimed,
    }
}

pub fn holder_pb(h: &Holder) -> pb::Holder {
    pb::Holder {
        node: h.node.clone(),
        instance: h.instance,
    }
}

pub fn answer_pb(a: &ClaimAnswer, backend: &str) -> pb::ClaimResponse {
    pb::ClaimResponse {
        outcome: outcome_pb(a.outcome) as i32,
        token: a
            .token
            .as_ref()
            .map(|t| t.as_str().to_owned())
            .unwrap_or_default(),
        attempt: a.attempt,
        fencing: a.fencing,
        lease_until_ms: a.lease_until_ms,
        valid_for_ms: a.valid_for_ms(),
        holder: a.holder.as_ref().map(holder_pb),
        backend: backend.to_owned(),
        reason: a.reason.unwrap_or_default().to_owned(),
        now_ms: a.now_ms,
    }
}

pub fn run_pb(r: &RunRow) -> pb::Run {
    pb::Run {
        slot_ms: r.slot_ms,
        attempt: r.attempt,
        state: state_pb(r.state) as i32,
        holder: Some(holder_pb(&r.holder)),
        claimed_at_ms: r.claimed_at_ms,
        finished_at_ms: r.finished_at_ms,
        lease_until_ms: r.lease_until_ms,
        fencing: r.fencing,
    }
}
