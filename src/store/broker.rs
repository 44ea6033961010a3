//! What the two message-broker stores (RabbitMQ, NATS JetStream) share:
//! their backend URLs and the bounds of a memory that forgets.
//!
//! URLs: our own query options are taken out, the rest of the URL goes to
//! the client library ([`super::backend_url`]). Unknown query options are
//! refused: a misspelt `slot_ttl_ms` that was silently ignored would quietly
//! shorten how long a claim is remembered.

use super::backend_url::{split_options, UrlOptions};
use crate::claim::{ClaimAnswer, ClaimSpec, Outcome};
use crate::error::{Error, Result};

/// Default prefix of every queue, subject and stream name.
pub const DEFAULT_PREFIX: &str = "anarchon";
/// Default time a claimed slot is remembered (RabbitMQ `slot_ttl_ms`, NATS
/// `duplicate_window_ms`): ten times the default `max_late_ms`, so claims
/// made a few minutes before their slot and clocks a little apart are covered.
pub const DEFAULT_MEMORY_MS: u64 = 600_000;
/// Default bound on one broker round trip (connect, declare, confirm, ack).
pub const DEFAULT_TIMEOUT_MS: u64 = 5_000;
/// Upper bound of a remembered time: RabbitMQ timers take 32-bit milliseconds.
pub const MAX_MEMORY_MS: u64 = 30 * 24 * 3_600_000;
/// Longest prefix. A gate queue is named `<prefix>.<job>.slot.<slot_ms>`:
/// 1 + 200 + 6 + 19 bytes besides the prefix, and AMQP names end at 255.
pub const MAX_PREFIX_LEN: usize = 255 - (1 + crate::claim::MAX_JOB_LEN + 6 + 19);

fn bad(m: impl Into<String>) -> Error {
    Error::invalid("backend", m)
}

/// A broker URL's own options and the client library's URL. `own` are the
/// broker store's options, `passthrough` the client library's; each own
/// option may be given once.
pub fn split(url: &str, own: &[&str], passthrough: &[&str]) -> Result<UrlOptions> {
    let opts = split_options(url, own, passthrough)?;
    opts.each_once()?;
    Ok(opts)
}

/// The `prefix` option: 1..=[`MAX_PREFIX_LEN`] bytes of `[A-Za-z0-9_-]` (no
/// dots: it is one token of a NATS subject and names a JetStream stream).
pub fn name_prefix(opts: &UrlOptions) -> Result<String> {
    let p = opts.get("prefix").unwrap_or(DEFAULT_PREFIX);
    if p.is_empty() || p.len() > MAX_PREFIX_LEN {
        return Err(bad(format!(
            "prefix must be 1..={MAX_PREFIX_LEN} bytes, got {}",
            p.len()
        )));
    }
    if let Some(c) = p
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-')))
    {
        return Err(bad(format!(
            "prefix contains {c:?}; allowed are [A-Za-z0-9_-]"
        )));
    }
    Ok(p.to_owned())
}

/// Checks that a claim can be decided by a memory that forgets after
/// `memory_ms`, and answers `LATE` when it is too late (on this host's wall
/// clock: a broker has no clock a claim can read).
///
/// A claim first stored at `t0` is remembered until at least
/// `t0 + memory_ms`; a late claim may come until `slot + max_late`. So the
/// memory covers every claim of the slot when `max_late < memory` and
/// `slot - t0 < memory - max_late`: claims for a slot too far ahead are
/// refused instead of being decided by a memory that would lapse.
/// Slot 0 (a lock not tied to time) is never late, so it is claimed once per
/// `memory_ms`.
pub fn check_within_memory(
    backend: &str,
    option: &str,
    memory_ms: i64,
    spec: &ClaimSpec,
    now: i64,
) -> Result<Option<ClaimAnswer>> {
    if spec.max_late_ms >= memory_ms {
        return Err(Error::invalid(
            "max_late_ms",
            format!(
                "{} must be shorter than the {backend} backend's {option} ({memory_ms}): \
                 a claim forgotten before the late window closes would let a second claimer win",
                spec.max_late_ms
            ),
        ));
    }
    if spec.slot_ms == 0 {
        return Ok(None);
    }
    let ahead = spec.slot_ms.saturating_sub(now);
    let horizon = memory_ms - spec.max_late_ms;
    if ahead >= horizon {
        return Err(Error::invalid(
            "slot_ms",
            format!(
                "is {ahead} ms ahead of this host's clock; the {backend} backend remembers a \
                 claim for {option} ({memory_ms} ms), so it takes claims less than \
                 {option} - max_late_ms ({horizon} ms) ahead of their slot"
            ),
        ));
    }
    if now.saturating_sub(spec.slot_ms) > spec.max_late_ms {
        return Ok(Some(ClaimAnswer::bare(
            Outcome::Late,
            now,
            Some("too_late"),
        )));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_options_are_given_once() {
        let s = split(
            "amqp://u:p@h:5672/%2f?heartbeat=10&prefix=x",
            &["prefix"],
            &["heartbeat"],
        )
        .unwrap();
        assert_eq!(s.client_url(), "amqp://u:p@h:5672/%2f?heartbeat=10");
        assert_eq!(name_prefix(&s).unwrap(), "x");
        assert!(split("nats://h?slot_tll_ms=1", &["slot_ttl_ms"], &[]).is_err());
        assert!(split("nats://h?prefix=a&prefix=b", &["prefix"], &[]).is_err());
    }

    #[test]
    fn prefixes() {
        let p = |q: &str| name_prefix(&split(&format!("nats://h?prefix={q}"), &["prefix"], &[])?);
        assert!(p("ok_Name-1").is_ok());
        assert!(p(&"x".repeat(MAX_PREFIX_LEN)).is_ok());
        for bad in [
            "",
            "a.b",
            "a*",
            "a>",
            "a b",
            &"x".repeat(MAX_PREFIX_LEN + 1),
        ] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
    }
}
