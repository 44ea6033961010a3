//! Fuzz bodies, shared by the `cargo fuzz` targets in `fuzz/` (coverage
//! guided, long runs) and by `tests/fuzz_smoke.rs` (a bounded smoke run in
//! the ordinary test command). Each takes arbitrary bytes and must never
//! panic; invariants are asserted inside.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use prost::Message;

use crate::claim::{Holder, Job, Token};
use crate::mesh::marks::verify_hello;
use crate::mesh::table::{PeerTable, TableConfig};
use crate::proto as pb;
use crate::server::validate::{self, ClaimDefaults};

/// Decoding and validation of every application request: arbitrary bytes
/// decode to an error or to a request that validation either accepts (with
/// every field within bounds) or refuses naming a field.
pub fn requests(data: &[u8]) {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    let d = ClaimDefaults::default();
    let h = Holder {
        node: "n".into(),
        instance: 1,
    };
    match kind % 5 {
        0 => {
            if let Ok(r) = pb::ClaimRequest::decode(body) {
                if let Ok(v) = validate::claim(&r, &d, &h) {
                    assert!(v.spec.lease_ms > 0 && v.spec.lease_ms <= d.max_lease_ms);
                    assert!(v.spec.max_late_ms >= 0);
                    assert!(v.spec.slot_ms >= 0);
                    assert!(v.wait_ms >= 0 && v.wait_ms <= d.max_wait_ms);
                    assert!(v.spec.max_attempts >= 1);
                    assert!(!v.spec.job.as_str().is_empty() && v.spec.job.as_str().len() <= 200);
                }
            }
        }
        1 => {
            if let Ok(r) = pb::RenewRequest::decode(body) {
                let _ = validate::renew(&r, &d);
            }
        }
        2 => {
            if let Ok(r) = pb::ReleaseRequest::decode(body) {
                let _ = validate::release(&r);
            }
        }
        3 => {
            if let Ok(r) = pb::HistoryRequest::decode(body) {
                if let Ok((_, limit, _)) = validate::history(&r) {
                    assert!((1..=validate::MAX_HISTORY).contains(&limit));
                }
            }
        }
        _ => {
            let s = String::from_utf8_lossy(body);
            if let Ok(j) = Job::parse(&s) {
                assert!(j
                    .as_str()
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b)));
            }
            let _ = Token::parse(&s);
        }
    }
}

/// Sync frame handling, two ways. Even first byte: arbitrary bytes decoded as
/// a frame and fed through hello verification and the liveness table. Odd
/// first byte: a script of *validly signed* marks from four fixed keys with
/// chosen instances, beats, ages, leaves and arrival times, driving the
/// table's real transitions while its invariants are checked.
pub fn sync_frames(data: &[u8]) {
    if data.first().is_some_and(|b| b & 1 == 1) {
        return scripted(&data[1..]);
    }
    let Ok(frame) = pb::SyncFrame::decode(data) else {
        return;
    };
    let base = Instant::now() + Duration::from_secs(86_400);
    let mut table = PeerTable::new(
        TableConfig {
            expiry: Duration::from_millis(1500),
            max_runtimes: 8,
        },
        &"0".repeat(32),
        1,
    );
    match frame.frame {
        Some(pb::sync_frame::Frame::Hello(h)) => {
            let _ = verify_hello(&h, None);
            let _ = verify_hello(&h, Some("secret"));
        }
        Some(pb::sync_frame::Frame::Marks(m)) => {
            for (i, mark) in m.marks.iter().enumerate() {
                let now = base + Duration::from_millis((mark.beat % 10_000) + i as u64);
                let from = if i % 2 == 0 {
                    Some(mark.node.as_str())
                } else {
                    None
                };
                let _ = table.ingest(mark, from, now);
                let _ = table.tick(now);
                let _ = table.frame_marks(now);
                let _ = table.dead_holders(now);
            }
            assert!(table.peers(base).len() <= 8);
        }
        Some(pb::sync_frame::Frame::Nudge(_)) | None => {}
    }
}

fn scripted(data: &[u8]) {
    use crate::mesh::marks::sign_mark;
    use crate::mesh::Identity;
    let base = Instant::now() + Duration::from_secs(86_400);
    let me = Identity::from_seed([9; 32], 1);
    let mut table = PeerTable::new(
        TableConfig {
            expiry: Duration::from_millis(1500),
            max_runtimes: 3,
        },
        &me.node,
        1,
    );
    let mut now = base;
    let mut newest: std::collections::HashMap<String, (u64, u64)> = Default::default();
    for step in data.chunks_exact(8) {
        let who = step[0] % 5;
        let id = if who == 4 {
            Identity::from_seed([9; 32], 1 + u64::from(step[1] % 3)) // marks about ourselves
        } else {
            Identity::from_seed([who + 1; 32], 1 + u64::from(step[1] % 4))
        };
        let beat = u64::from(u16::from_le_bytes([step[2], step[3]]));
        let age = i64::from(i16::from_le_bytes([step[4], step[5]])) * 10;
        let left = step[6] & 1 == 1;
        now += Duration::from_millis(u64::from(step[7]) * 20);
        let mut m = sign_mark(&id, beat, left, "127.0.0.1:1", &Default::default());
        m.age_ms = age;
        // A full view evicts (and the forget time drops) entries: a runtime
        // the table no longer holds starts over, so only what it holds
        // before this mark is the bar the mark must pass.
        let held: std::collections::HashSet<String> =
            table.peers(now).into_iter().map(|p| p.node).collect();
        newest.retain(|node, _| held.contains(node));
        let res = table.ingest(
            &m,
            if step[6] & 2 == 2 {
                Some(m.node.as_str())
            } else {
                None
            },
            now,
        );
        if res.is_ok() {
            // Accepted marks are always newer than anything accepted before
            // about a runtime the table still held.
            let key = (m.instance, m.beat);
            if let Some(prev) = newest.insert(m.node.clone(), key) {
                assert!(key > prev, "accepted a mark that is not newer");
            }
            assert_ne!(m.node, me.node, "accepted a mark about ourselves");
        }
        let _ = table.tick(now);
        let dead = table.dead_holders(now);
        for p in table.peers(now) {
            let alive = p.state == pb::PeerState::Alive as i32
                || p.state == pb::PeerState::Unreachable as i32;
            let h = crate::claim::Holder {
                node: p.node.clone(),
                instance: p.instance,
            };
            assert_eq!(
                alive,
                !dead.is_dead(&h),
                "liveness and dead holders disagree"
            );
            assert!(
                p.beat_age_ms <= 1500
                    || p.state == pb::PeerState::Expired as i32
                    || p.state == pb::PeerState::Left as i32
            );
        }
        assert!(table.peers(now).len() <= 3);
    }
}
