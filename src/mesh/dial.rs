//! The redial policy: jittered exponential backoff from one heartbeat,
//! capped at the expiry (SPEC §4.3), built on `backon`.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Delays between dials of one address.
#[derive(Debug)]
pub struct Redial {
    builder: ExponentialBuilder,
    cap: Duration,
    delays: ExponentialBackoff,
}

impl Redial {
    pub fn new(heartbeat: Duration, expiry: Duration) -> Self {
        let builder = ExponentialBuilder::default()
            .with_min_delay(heartbeat)
            .with_max_delay(expiry)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Redial {
            builder,
            cap: expiry,
            delays: builder.build(),
        }
    }

    /// The next delay: in `[d, 2d)` for `d` = heartbeat, 2 × heartbeat, …,
    /// never above the expiry.
    pub fn next_delay(&mut self) -> Duration {
        self.delays.next().unwrap_or(self.cap).min(self.cap)
    }

    /// Back to one heartbeat (a link that held for a while).
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HB: Duration = Duration::from_millis(200);
    const EXPIRY: Duration = Duration::from_millis(1500);

    #[test]
    fn delays_double_from_a_heartbeat_with_jitter_and_stop_at_the_expiry() {
        for _ in 0..50 {
            let mut r = Redial::new(HB, EXPIRY);
            let mut base = HB;
            for _ in 0..8 {
                let d = r.next_delay();
                assert!(
                    d >= base.min(EXPIRY) && d <= (base * 2).min(EXPIRY),
                    "{d:?} for {base:?}"
                );
                base = (base * 2).min(EXPIRY);
            }
            assert_eq!(r.next_delay(), EXPIRY, "capped");
            r.reset();
            let d = r.next_delay();
            assert!(d >= HB && d < HB * 2, "{d:?}");
        }
    }

    /// The jitter spreads the delays over their range: dialers that failed
    /// together do not redial in step.
    #[test]
    fn jitter_spreads_the_first_delay_over_a_heartbeat() {
        let firsts: Vec<Duration> = (0..64)
            .map(|_| Redial::new(HB, EXPIRY).next_delay())
            .collect();
        let low = firsts.iter().min().copied().unwrap_or_default();
        let high = firsts.iter().max().copied().unwrap_or_default();
        assert!(low >= HB && high <= HB * 2, "{low:?}..{high:?}");
        assert!(high - low > HB / 4, "no spread: {low:?}..{high:?}");
    }

    /// Under paused time, a dialer that fails 6 times in a row waits the sum
    /// of its delays — between the sums of the lower and upper bounds.
    #[tokio::test(start_paused = true)]
    async fn a_failing_dialer_waits_its_backoff_on_the_tokio_clock() {
        let start = tokio::time::Instant::now();
        let mut r = Redial::new(HB, EXPIRY);
        for _ in 0..6 {
            tokio::time::sleep(r.next_delay()).await;
        }
        let waited = start.elapsed();
        // 200 + 400 + 800 + 1500 + 1500 + 1500 at least; twice that at most,
        // each step capped at the expiry.
        let low = Duration::from_millis(200 + 400 + 800 + 1500 * 3);
        let high = Duration::from_millis(400 + 800 + 1500 * 4);
        assert!(waited >= low && waited <= high, "{waited:?}");
    }
}
