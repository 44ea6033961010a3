//! Decoding and validation of every application request: arbitrary bytes
//! must decode to an error or to a request that validation either accepts
//! (with every field within bounds) or refuses naming a field. Never a panic.
#![no_main]

use anarchon::claim::{Holder, Job, Token};
use anarchon::proto as pb;
use anarchon::server::validate::{self, ClaimDefaults};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, body)) = data.split_first() else { return };
    let d = ClaimDefaults::default();
    let h = Holder { node: "n".into(), instance: 1 };
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
                    assert!(limit >= 1 && limit <= validate::MAX_HISTORY);
                }
            }
        }
        _ => {
            let s = String::from_utf8_lossy(body);
            if let Ok(j) = Job::parse(&s) {
                assert!(j.as_str().bytes().all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b)));
            }
            let _ = Token::parse(&s);
        }
    }
});
