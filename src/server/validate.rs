//! Proto requests → validated domain specs. Pure: no I/O, fuzzable.
//! Every error is `INVALID_ARGUMENT` naming the field; nothing is written.
//! The plain protobuf ↔ domain mappings are in [`super::convert`].

use crate::claim::*;
use crate::error::{Error, Result};
use crate::proto as pb;

use super::convert;

/// The sidecar's defaults and bounds for claims.
#[derive(Debug, Clone)]
pub struct ClaimDefaults {
    pub lease_ms: i64,
    /// The shortest lease a request may ask for: 3 × `heartbeat_ms` (a
    /// holder renews every lease/3, so never more often than every beat).
    pub min_lease_ms: i64,
    pub max_lease_ms: i64,
    pub max_late_ms: i64,
    pub overlap: Overlap,
    pub max_attempts: u32,
    pub max_wait_ms: i64,
}

/// The defaults of [`Config::default`](crate::Config): they are declared
/// there, once.
impl Default for ClaimDefaults {
    fn default() -> Self {
        ClaimDefaults::from_config(&crate::Config::default())
    }
}

impl ClaimDefaults {
    pub fn from_config(c: &crate::Config) -> Self {
        ClaimDefaults {
            lease_ms: c.lease_ms as i64,
            min_lease_ms: c.min_lease_ms() as i64,
            max_lease_ms: c.max_lease_ms as i64,
            max_late_ms: c.max_late_ms as i64,
            overlap: c.overlap,
            max_attempts: c.max_attempts,
            max_wait_ms: c.max_wait_ms as i64,
        }
    }

    /// A lease asked for; 0 (not set) is the default.
    fn lease(&self, lease_ms: i64) -> Result<i64> {
        match lease_ms {
            0 => Ok(self.lease_ms),
            l => self.explicit_lease(l),
        }
    }

    /// A lease that was set: between the minimum (3 × heartbeat) and the
    /// configured maximum.
    fn explicit_lease(&self, lease_ms: i64) -> Result<i64> {
        match lease_ms {
            l if l < 0 => Err(Error::invalid("lease_ms", "must not be negative")),
            l if l < self.min_lease_ms => Err(Error::invalid(
                "lease_ms",
                format!(
                    "{l} ms is below the minimum lease of {} ms (3 × heartbeat_ms)",
                    self.min_lease_ms
                ),
            )),
            l if l > self.max_lease_ms => Err(Error::invalid(
                "lease_ms",
                format!("{l} exceeds the configured maximum {}", self.max_lease_ms),
            )),
            l => Ok(l),
        }
    }
}

fn slot(slot_ms: i64) -> Result<SlotMs> {
    if slot_ms < 0 {
        return Err(Error::invalid("slot_ms", "must not be negative"));
    }
    Ok(slot_ms)
}

fn token(s: &str) -> Result<Token> {
    if s.is_empty() {
        return Err(Error::invalid("token", "is required"));
    }
    Token::parse(s)
}

/// A validated `ClaimRequest` plus its wait.
#[derive(Debug, Clone)]
pub struct ValidClaim {
    pub spec: ClaimSpec,
    pub wait_ms: i64,
}

pub fn claim(req: &pb::ClaimRequest, d: &ClaimDefaults, holder: &Holder) -> Result<ValidClaim> {
    let job = Job::parse(&req.job)?;
    let slot_ms = slot(req.slot_ms)?;
    let token = if req.token.is_empty() {
        Token::generate()
    } else {
        Token::parse(&req.token)?
    };
    let lease_ms = d.lease(req.lease_ms)?;
    let max_late_ms = match req.max_late_ms {
        0 => d.max_late_ms,
        l if l < 0 => return Err(Error::invalid("max_late_ms", "must not be negative")),
        l => l,
    };
    let overlap = match pb::Overlap::try_from(req.overlap) {
        Ok(o) => convert::overlap(o).unwrap_or(d.overlap),
        Err(_) => {
            return Err(Error::invalid(
                "overlap",
                format!("unknown value {}", req.overlap),
            ))
        }
    };
    let max_attempts = match req.max_attempts {
        0 => d.max_attempts,
        n => n,
    };
    let wait_ms = match req.wait_ms {
        w if w < 0 => return Err(Error::invalid("wait_ms", "must not be negative")),
        w if w > d.max_wait_ms => {
            return Err(Error::invalid(
                "wait_ms",
                format!("{w} exceeds the configured maximum {}", d.max_wait_ms),
            ))
        }
        w => w,
    };
    Ok(ValidClaim {
        spec: ClaimSpec {
            job,
            slot_ms,
            token,
            holder: holder.clone(),
            lease_ms,
            max_late_ms,
            overlap,
            max_attempts,
        },
        wait_ms,
    })
}

pub fn renew(req: &pb::RenewRequest, d: &ClaimDefaults) -> Result<RenewSpec> {
    Ok(RenewSpec {
        job: Job::parse(&req.job)?,
        slot_ms: slot(req.slot_ms)?,
        token: token(&req.token)?,
        // 0: keep the lease the run was claimed with (the store knows it).
        lease_ms: match req.lease_ms {
            0 => 0,
            l => d.explicit_lease(l)?,
        },
    })
}

pub fn release(req: &pb::ReleaseRequest) -> Result<ReleaseSpec> {
    let result = match pb::ReleaseResult::try_from(req.result) {
        Ok(r) => convert::release_result(r)
            .ok_or_else(|| Error::invalid("result", "must be SUCCEEDED or FAILED"))?,
        Err(_) => {
            return Err(Error::invalid(
                "result",
                format!("unknown value {}", req.result),
            ))
        }
    };
    Ok(ReleaseSpec {
        job: Job::parse(&req.job)?,
        slot_ms: slot(req.slot_ms)?,
        token: token(&req.token)?,
        result,
    })
}

/// Largest `History` page.
pub const MAX_HISTORY: u32 = 1000;

pub fn history(req: &pb::HistoryRequest) -> Result<(Job, u32, Option<i64>)> {
    let limit = match req.limit {
        0 => 20,
        n if n > MAX_HISTORY => {
            return Err(Error::invalid("limit", format!("at most {MAX_HISTORY}")))
        }
        n => n,
    };
    Ok((Job::parse(&req.job)?, limit, req.before_slot_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h() -> Holder {
        Holder {
            node: "n".into(),
            instance: 1,
        }
    }

    fn req() -> pb::ClaimRequest {
        pb::ClaimRequest {
            job: "j".into(),
            slot_ms: 5,
            ..Default::default()
        }
    }

    fn field(r: Result<impl std::fmt::Debug>) -> &'static str {
        match r {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("expected invalid argument, got {other:?}"),
        }
    }

    #[test]
    fn defaults_fill_zero_fields() {
        let d = ClaimDefaults::default();
        let v = claim(&req(), &d, &h()).unwrap();
        assert_eq!(v.spec.lease_ms, d.lease_ms);
        assert_eq!(v.spec.max_attempts, 3);
        assert_eq!(v.spec.token.as_str().len(), 32);
    }

    #[test]
    fn bad_claims_name_the_field() {
        let d = ClaimDefaults::default();
        let bad = |f: fn(&mut pb::ClaimRequest)| {
            let mut r = req();
            f(&mut r);
            field(claim(&r, &d, &h()))
        };
        assert_eq!(bad(|r| r.job = String::new()), "job");
        assert_eq!(bad(|r| r.job = "x".repeat(201)), "job");
        assert_eq!(bad(|r| r.job = "a b".into()), "job");
        assert_eq!(bad(|r| r.slot_ms = -1), "slot_ms");
        assert_eq!(bad(|r| r.lease_ms = -1), "lease_ms");
        assert_eq!(bad(|r| r.lease_ms = i64::MAX), "lease_ms");
        assert_eq!(bad(|r| r.lease_ms = 1), "lease_ms");
        assert_eq!(bad(|r| r.lease_ms = 2_999), "lease_ms");
        assert!(claim(
            &pb::ClaimRequest {
                lease_ms: d.min_lease_ms,
                ..req()
            },
            &d,
            &h()
        )
        .is_ok());
        assert_eq!(bad(|r| r.token = "xyz".into()), "token");
        assert_eq!(bad(|r| r.overlap = 7), "overlap");
        assert_eq!(bad(|r| r.max_late_ms = -5), "max_late_ms");
        assert_eq!(bad(|r| r.wait_ms = -5), "wait_ms");
        assert_eq!(bad(|r| r.wait_ms = i64::MAX), "wait_ms");
    }

    #[test]
    fn bad_release_and_renew_name_the_field() {
        let ok = "a".repeat(32);
        let rel = |t: &str, result: i32| pb::ReleaseRequest {
            job: "j".into(),
            slot_ms: 1,
            token: t.into(),
            result,
        };
        assert_eq!(field(release(&rel(&ok, 0))), "result");
        assert_eq!(field(release(&rel(&ok, 9))), "result");
        assert_eq!(field(release(&rel("", 1))), "token");
        assert!(release(&rel(&ok, 1)).is_ok());
        let d = ClaimDefaults::default();
        let ren = pb::RenewRequest {
            job: "j".into(),
            slot_ms: 1,
            token: ok,
            lease_ms: -1,
        };
        assert_eq!(field(renew(&ren, &d)), "lease_ms");
        let below = pb::RenewRequest {
            lease_ms: 1,
            ..ren.clone()
        };
        assert_eq!(field(renew(&below, &d)), "lease_ms");
        let keep = pb::RenewRequest {
            lease_ms: 0,
            ..ren.clone()
        };
        assert_eq!(
            renew(&keep, &d).unwrap().lease_ms,
            0,
            "0 keeps the run's lease"
        );
        assert_eq!(
            field(history(&pb::HistoryRequest {
                job: "j".into(),
                limit: 5000,
                before_slot_ms: None
            })),
            "limit"
        );
    }
}
