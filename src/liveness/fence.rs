//! The self-fence: how long this sidecar may still tell its clients that
//! they hold a run, given when it last refreshed its liveness record.
//!
//! A peer may take over this sidecar's runs early only after it has seen
//! our record's counter unchanged for one expiry on its own clock
//! ([`super::observer`]); it cannot have seen the value we last wrote before
//! we *sent* that write. So every hold we answer is valid at most until
//! `sent + expiry − margin` on our monotonic clock, where `sent` is the
//! send time of the newest refresh that succeeded. The margin absorbs
//! clock-rate drift and the time a `LOST_LEASE` takes to reach the client.
//! See `docs/safety.md` for the whole argument.

use std::time::{Duration, Instant};

/// What this sidecar may promise right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// No peer can take our runs over early (a store without liveness
    /// records, or no leases at all): the store lease is the only limit.
    Unbounded,
    /// Holds answered now are valid until this instant at the latest.
    Until(Instant),
    /// Not confirmed in the store (never, or too long ago), or leaving:
    /// promise nothing.
    Fenced,
}

impl Bound {
    /// How many milliseconds a promise made at `now` may last, capped at
    /// `lease_ms`; `None` when nothing may be promised.
    pub fn cap_ms(self, now: Instant, lease_ms: i64) -> Option<i64> {
        match self {
            Bound::Unbounded => Some(lease_ms),
            Bound::Until(t) if t > now => {
                Some(lease_ms.min(t.duration_since(now).as_millis() as i64))
            }
            _ => None,
        }
    }
}

/// The state behind [`Bound`]: pure, driven by the caller's instants.
#[derive(Debug, Clone)]
pub struct SelfFence {
    expiry: Duration,
    margin: Duration,
    last_ok_sent: Option<Instant>,
    closed: bool,
}

impl SelfFence {
    pub fn new(expiry: Duration) -> Self {
        SelfFence {
            expiry,
            margin: margin(expiry),
            last_ok_sent: None,
            closed: false,
        }
    }

    /// A refresh sent at `sent` succeeded. Refreshes may finish out of
    /// order; the newest send time wins.
    pub fn refreshed(&mut self, sent: Instant) {
        self.last_ok_sent = Some(self.last_ok_sent.map_or(sent, |t| t.max(sent)));
    }

    /// Promise nothing from now on (the sidecar is leaving).
    pub fn close(&mut self) {
        self.closed = true;
    }

    pub fn bound(&self, now: Instant) -> Bound {
        match self.last_ok_sent {
            Some(sent) if !self.closed => {
                let until = sent + self.expiry - self.margin;
                if until > now {
                    Bound::Until(until)
                } else {
                    Bound::Fenced
                }
            }
            _ => Bound::Fenced,
        }
    }
}

/// The safety margin below one expiry: a tenth of it, at least 20 ms.
pub fn margin(expiry: Duration) -> Duration {
    (expiry / 10).max(Duration::from_millis(20))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn nothing_is_promised_before_the_first_refresh() {
        let f = SelfFence::new(ms(1500));
        assert_eq!(f.bound(Instant::now()), Bound::Fenced);
    }

    #[test]
    fn the_bound_is_the_send_time_plus_expiry_minus_margin() {
        let t0 = Instant::now();
        let mut f = SelfFence::new(ms(1500));
        f.refreshed(t0);
        // margin = 150 ms: valid until t0 + 1350 ms.
        assert_eq!(f.bound(t0 + ms(100)), Bound::Until(t0 + ms(1350)));
        assert_eq!(f.bound(t0 + ms(1349)), Bound::Until(t0 + ms(1350)));
        assert_eq!(f.bound(t0 + ms(1350)), Bound::Fenced);
        // A late answer to an older refresh does not move the bound back.
        f.refreshed(t0 + ms(500));
        f.refreshed(t0 + ms(200));
        assert_eq!(f.bound(t0 + ms(1400)), Bound::Until(t0 + ms(1850)));
        f.close();
        assert_eq!(f.bound(t0 + ms(1400)), Bound::Fenced);
    }

    #[test]
    fn caps() {
        let t0 = Instant::now();
        assert_eq!(Bound::Unbounded.cap_ms(t0, 30_000), Some(30_000));
        assert_eq!(Bound::Until(t0 + ms(900)).cap_ms(t0, 30_000), Some(900));
        assert_eq!(Bound::Until(t0 + ms(900)).cap_ms(t0, 500), Some(500));
        assert_eq!(Bound::Until(t0).cap_ms(t0, 500), None);
        assert_eq!(Bound::Fenced.cap_ms(t0, 500), None);
        assert_eq!(margin(ms(100)), ms(20));
    }
}
