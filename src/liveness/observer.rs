//! The observer: when this sidecar first saw each suspect's liveness counter
//! at its current value, on this sidecar's own monotonic clock.
//!
//! This is client-go's `observedTime` rule. The time written in a record is
//! never trusted; only the moment *we* read a value. A value read at `t`
//! was written before `t`, so its writer sent that write before `t` too and
//! has stopped promising anything by `t + expiry − margin`
//! ([`super::fence`]). A suspect whose counter we have seen unchanged since
//! `since`, with `now − since ≥ expiry`, may therefore be treated as dead, on
//! the condition — re-checked inside the store's atomic step — that the
//! counter still has that value.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::claim::Holder;

#[derive(Debug, Clone, Copy)]
struct Seen {
    counter: u64,
    /// When we first read this value (the receipt of the answer).
    since: Instant,
    /// When we last read it (so a stale observation is not trusted).
    last_read: Instant,
}

/// Pure: reads in, verdicts out.
#[derive(Debug)]
pub struct Observer {
    expiry: Duration,
    /// How old the newest read may be for a verdict.
    max_staleness: Duration,
    seen: HashMap<Holder, Seen>,
}

impl Observer {
    pub fn new(expiry: Duration, max_staleness: Duration) -> Self {
        Observer {
            expiry,
            max_staleness,
            seen: HashMap::new(),
        }
    }

    /// `counter` was read for `h`; `at` is when the answer arrived.
    pub fn saw(&mut self, h: &Holder, counter: u64, at: Instant) {
        match self.seen.get_mut(h) {
            Some(s) if s.counter == counter => s.last_read = s.last_read.max(at),
            _ => {
                self.seen.insert(
                    h.clone(),
                    Seen {
                        counter,
                        since: at,
                        last_read: at,
                    },
                );
            }
        }
    }

    /// Forgets every holder that is no longer a suspect: a later suspicion
    /// starts a fresh observation.
    pub fn retain(&mut self, suspects: &HashSet<Holder>) {
        self.seen.retain(|h, _| suspects.contains(h));
    }

    /// The counter `h` must still have to be dead, if we have seen it
    /// unchanged for a whole expiry and read it recently.
    pub fn ripe(&self, h: &Holder, now: Instant) -> Option<u64> {
        let s = self.seen.get(h)?;
        (now.saturating_duration_since(s.since) >= self.expiry
            && now.saturating_duration_since(s.last_read) <= self.max_staleness)
            .then_some(s.counter)
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn h(n: &str) -> Holder {
        Holder {
            node: n.into(),
            instance: 1,
        }
    }

    #[test]
    fn ripe_only_after_a_whole_expiry_unchanged() {
        let t0 = Instant::now();
        let mut o = Observer::new(ms(1500), ms(400));
        o.saw(&h("a"), 7, t0);
        for t in [0, 200, 400, 600, 800, 1000, 1200, 1400] {
            o.saw(&h("a"), 7, t0 + ms(t));
            assert_eq!(o.ripe(&h("a"), t0 + ms(t)), None, "{t}");
        }
        o.saw(&h("a"), 7, t0 + ms(1500));
        assert_eq!(o.ripe(&h("a"), t0 + ms(1499)), None);
        assert_eq!(o.ripe(&h("a"), t0 + ms(1500)), Some(7));
        // Not read for longer than max_staleness: no verdict.
        assert_eq!(o.ripe(&h("a"), t0 + ms(1901)), None);
        assert_eq!(o.ripe(&h("b"), t0 + ms(1500)), None);
    }

    #[test]
    fn a_changed_counter_starts_over() {
        let t0 = Instant::now();
        let mut o = Observer::new(ms(1000), ms(400));
        o.saw(&h("a"), 7, t0);
        o.saw(&h("a"), 8, t0 + ms(900));
        o.saw(&h("a"), 8, t0 + ms(1200));
        assert_eq!(o.ripe(&h("a"), t0 + ms(1200)), None);
        o.saw(&h("a"), 8, t0 + ms(1900));
        assert_eq!(o.ripe(&h("a"), t0 + ms(1900)), Some(8));
    }

    #[test]
    fn forgetting_a_suspect_restarts_its_observation() {
        let t0 = Instant::now();
        let mut o = Observer::new(ms(1000), ms(400));
        o.saw(&h("a"), 7, t0);
        o.saw(&h("b"), 1, t0);
        o.retain(&[h("b")].into_iter().collect());
        assert_eq!(o.len(), 1);
        o.saw(&h("a"), 7, t0 + ms(1000));
        assert_eq!(o.ripe(&h("a"), t0 + ms(1000)), None);
        o.saw(&h("b"), 1, t0 + ms(1000));
        assert_eq!(o.ripe(&h("b"), t0 + ms(1000)), Some(1));
    }
}
