//! One duration syntax for every command-line flag: a number with a unit —
//! `1500ms`, `30s`, `2m`, `1h`, `1h 30m`, `7days` (humantime) — or a bare
//! number, which is milliseconds (the unit of every `*_ms` key of the
//! config, the environment and the protocol). Text for people goes through
//! [`human`].

use std::time::Duration;

/// Parses `30s`, `2m`, `1500ms`, … or bare milliseconds.
pub fn parse(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| format!("{s:?} is too large"));
    }
    humantime::parse_duration(t).map_err(|e| {
        format!("{s:?} is not a duration ({e}); use e.g. 1500ms, 30s, 2m, or bare milliseconds")
    })
}

/// [`parse`], in whole milliseconds.
pub fn parse_ms(s: &str) -> Result<u64, String> {
    let d = parse(s)?;
    u64::try_from(d.as_millis()).map_err(|_| format!("{s:?} is too large"))
}

/// [`parse_ms`] for the protocol's signed milliseconds.
pub fn parse_ms_i64(s: &str) -> Result<i64, String> {
    i64::try_from(parse_ms(s)?).map_err(|_| format!("{s:?} is too large"))
}

/// A lease: a positive duration (leave the flag out for the sidecar's
/// default), in milliseconds.
pub fn parse_lease_ms(s: &str) -> Result<i64, String> {
    match parse_ms_i64(s)? {
        0 => Err(format!(
            "{s:?}: a lease must be positive (leave the flag out for the sidecar's default)"
        )),
        ms => Ok(ms),
    }
}

/// A duration for people: `7 days`, `1 day 2h`, `30s`, `1500ms`.
pub fn human(d: Duration) -> String {
    humantime::format_duration(d)
        .to_string()
        .split(' ')
        .map(|part| {
            match part.find(|c: char| c.is_ascii_alphabetic()) {
                // humantime writes `7days`, `1month`, `2years`: words get a space.
                Some(i) if part.len() - i > 2 => format!("{} {}", &part[..i], &part[i..]),
                _ => part.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_syntax() {
        assert_eq!(parse("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse("1500ms").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("1h 30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse("30000").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_ms("2m").unwrap(), 120_000);
        assert!(parse("soon").unwrap_err().contains("1500ms"));
        assert!(parse("-1").is_err());
        assert!(parse("").is_err());
        assert!(parse_lease_ms("0s").is_err());
        assert!(parse_lease_ms("0").is_err());
        assert_eq!(parse_lease_ms("5s").unwrap(), 5000);
    }

    #[test]
    fn for_people() {
        assert_eq!(human(Duration::from_secs(7 * 86_400)), "7 days");
        assert_eq!(human(Duration::from_secs(86_400 + 7200)), "1 day 2h");
        assert_eq!(human(Duration::from_secs(30)), "30s");
        assert_eq!(human(Duration::from_millis(1500)), "1s 500ms");
    }
}
