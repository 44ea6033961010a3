//! Slots far in the future are refused before any store writes them.
//!
//! A slot of `i64::MAX`, or 9,999,999,999,999 on the Redis `stream-id`
//! strategy (where it would make every later slot of the job `LATE` for
//! ever), is almost always a bug in the caller. [`FutureGuard`] wraps every
//! store that [`super::open`] returns: a claim whose slot is more than
//! `max_future` ahead of the *store's* clock is `INVALID_ARGUMENT` naming
//! `slot_ms`, and nothing is written.
//!
//! Asking the store for its clock costs a round trip, so it is only asked
//! when the slot is near or past the bound by the host clock (within
//! [`HOST_SKEW_MS`] of it); every ordinary claim goes straight through.

use async_trait::async_trait;

use super::{Store, StoreInfo};
use crate::claim::*;
use crate::error::{Error, Result};

/// How far the host clock may be off the store's before a slot just inside
/// the bound by the host clock could be outside it by the store's.
pub const HOST_SKEW_MS: i64 = 3_600_000;

pub struct FutureGuard {
    inner: super::DynStore,
    max_future_ms: i64,
}

impl FutureGuard {
    pub fn new(inner: super::DynStore, max_future: std::time::Duration) -> Self {
        let max_future_ms = i64::try_from(max_future.as_millis()).unwrap_or(i64::MAX);
        FutureGuard {
            inner,
            max_future_ms,
        }
    }

    /// Refuses `slot_ms` when it is more than `max_future` ahead of the
    /// store's clock.
    async fn check(&self, slot_ms: i64) -> Result<()> {
        let near = host_now_ms()
            .saturating_add(self.max_future_ms)
            .saturating_sub(HOST_SKEW_MS);
        if slot_ms <= near {
            return Ok(());
        }
        let now = self.inner.now_ms().await?;
        refuse_far_future(slot_ms, now, self.max_future_ms)
    }
}

/// The rule itself: `slot_ms - now > max_future_ms` is refused.
pub fn refuse_far_future(slot_ms: i64, now: i64, max_future_ms: i64) -> Result<()> {
    let ahead = slot_ms.saturating_sub(now);
    if ahead > max_future_ms {
        return Err(Error::invalid(
            "slot_ms",
            format!(
                "{slot_ms} is {ahead} ms ahead of the store's clock ({now}); at most \
                 max_future_ms = {max_future_ms} ahead is accepted"
            ),
        ));
    }
    Ok(())
}

#[async_trait]
impl Store for FutureGuard {
    fn info(&self) -> &StoreInfo {
        self.inner.info()
    }

    async fn claim(&self, spec: &ClaimSpec, dead: &DeadHolders) -> Result<ClaimAnswer> {
        self.check(spec.slot_ms).await?;
        self.inner.claim(spec, dead).await
    }

    async fn release(&self, spec: &ReleaseSpec, dead: &DeadHolders) -> Result<()> {
        self.inner.release(spec, dead).await
    }

    async fn history(
        &self,
        job: &Job,
        limit: u32,
        before_slot_ms: Option<i64>,
    ) -> Result<HistoryPage> {
        self.inner.history(job, limit, before_slot_ms).await
    }

    async fn ping(&self) -> Result<()> {
        self.inner.ping().await
    }

    async fn now_ms(&self) -> Result<i64> {
        self.inner.now_ms().await
    }

    fn leases(&self) -> Option<&dyn super::Leases> {
        self.inner.leases()
    }
}

#[cfg(test)]
mod tests {
    use super::refuse_far_future;

    #[test]
    fn the_bound_is_inclusive_and_saturates() {
        let day = 86_400_000;
        assert!(refuse_far_future(1_000 + day, 1_000, day).is_ok());
        let e = refuse_far_future(1_001 + day, 1_000, day).unwrap_err();
        assert_eq!(e.reason(), Some("slot_ms"));
        assert!(refuse_far_future(i64::MAX, 1_000, day).is_err());
        assert!(refuse_far_future(9_999_999_999_999, 1_796_000_000_000, day).is_err());
        assert!(refuse_far_future(0, 1_796_000_000_000, day).is_ok());
    }
}
