//! What every backend URL shares: hiding its password, and splitting its
//! query into the store's own options and the ones its client library takes.
//!
//! Unknown query options are refused, naming the option and the known ones:
//! a misspelt `slot_ttl_ms` that was silently ignored would quietly change
//! how a store decides.

use crate::error::{Error, Result};

/// Hides the password of a URL, for logs and messages:
/// `redis://user:secret@host/0` → `redis://user:***@host/0`, and a password
/// in the query (`redis+unix:///run/redis.sock?pass=secret`,
/// `postgres://h/db?password=secret`) → `pass=***`.
///
/// Works on URLs the `url` crate refuses too (`redis+cluster://u:pw@a:1,b:2`):
/// the userinfo is whatever sits between `://` and the last `@` before the
/// query. A URL without a password is returned as it is.
pub fn redact(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let mut out = redact_userinfo(head);
    if let Some(q) = query {
        out.push('?');
        for (i, pair) in q.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            match pair.split_once('=') {
                Some((k, _)) if matches!(k, "pass" | "password") => {
                    out.push_str(k);
                    out.push_str("=***");
                }
                _ => out.push_str(pair),
            }
        }
    }
    out
}

/// [`redact`] of the part of a URL before its query.
fn redact_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let head_len = rest.find('#').unwrap_or(rest.len());
    let Some(at) = rest[..head_len].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
        None => url.to_owned(),
    }
}

/// A backend URL split into the store's own query options and the rest.
#[derive(Debug, Default)]
pub struct UrlOptions {
    /// The URL before its query.
    pub base: String,
    /// The store's own options, in order, percent-decoded.
    pub own: Vec<(String, String)>,
    /// The client library's options, in order, as written (`key=value`).
    pub passthrough: Vec<String>,
}

/// Splits `url`'s query into the options named in `own` and the ones that go
/// on to the store's client library (`passthrough`; an entry ending in `[`
/// lets through every key it begins, `options[` for `options[search_path]`);
/// anything else is an `invalid backend` error naming the option and the
/// known ones.
pub fn split_options(url: &str, own: &[&str], passthrough: &[&str]) -> Result<UrlOptions> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut out = UrlOptions {
        base: base.to_owned(),
        ..UrlOptions::default()
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let Some((k, v)) = url::form_urlencoded::parse(pair.as_bytes()).next() else {
            continue;
        };
        if own.contains(&&*k) {
            out.own.push((k.into_owned(), v.into_owned()));
            continue;
        }
        if !known_key(passthrough, &k) {
            let mut names: Vec<String> = own
                .iter()
                .chain(passthrough)
                .map(|n| match n.strip_suffix('[') {
                    Some(stem) => format!("{stem}[NAME]"),
                    None => (*n).to_owned(),
                })
                .collect();
            names.sort_unstable();
            return Err(bad(format!(
                "unknown option {k:?} in the backend URL; known: {}",
                names.join(", ")
            )));
        }
        out.passthrough.push(pair.to_owned());
    }
    Ok(out)
}

/// `key` is one of `known`, or `STEM[…]` where `STEM[` is one of them.
fn known_key(known: &[&str], key: &str) -> bool {
    known
        .iter()
        .any(|n| *n == key || (n.ends_with('[') && key.starts_with(n) && key.ends_with(']')))
}

/// A whole number option `field=v` within `1..=max`, or an error naming
/// `field`.
pub fn count(field: &'static str, v: &str, max: usize) -> Result<usize> {
    v.parse::<usize>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| {
            Error::invalid(
                field,
                format!("must be a number from 1 to {max}, got {v:?}"),
            )
        })
}

fn bad(m: impl Into<String>) -> Error {
    Error::invalid("backend", m)
}

impl UrlOptions {
    /// The URL the client library gets: the base and the passthrough options.
    pub fn client_url(&self) -> String {
        if self.passthrough.is_empty() {
            self.base.clone()
        } else {
            format!("{}?{}", self.base, self.passthrough.join("&"))
        }
    }

    /// The value of an own option (the last one, if it is given twice).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.own
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Refuses an own option given twice.
    pub fn each_once(&self) -> Result<()> {
        for (i, (k, _)) in self.own.iter().enumerate() {
            if self.own[..i].iter().any(|(o, _)| o == k) {
                return Err(bad(format!("option {k} is given twice")));
            }
        }
        Ok(())
    }

    /// A millisecond option within `min..=max`, or its default.
    pub fn millis(&self, key: &str, default: u64, min: u64, max: u64) -> Result<u64> {
        let Some(v) = self.get(key) else {
            return Ok(default);
        };
        let n: u64 = v
            .parse()
            .map_err(|_| bad(format!("{key}={v:?} is not a whole number of milliseconds")))?;
        if n < min || n > max {
            return Err(bad(format!("{key}={n} must be within {min}..={max}")));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        for (url, shown) in [
            (
                "amqp://guest:secret@127.0.0.1:5672/%2f",
                "amqp://guest:***@127.0.0.1:5672/%2f",
            ),
            ("redis://u:pw@h:1/0", "redis://u:***@h:1/0"),
            (
                "redis+cluster://u:pw@a:1,b:2?strategy=lease",
                "redis+cluster://u:***@a:1,b:2?strategy=lease",
            ),
            ("redis://u:p@ss@h:1", "redis://u:***@h:1"),
            (
                "postgres://u:pw@h/db?application_name=a@b",
                "postgres://u:***@h/db?application_name=a@b",
            ),
            (
                "redis+unix:///run/r.sock?db=2&user=u&pass=s%40cret&strategy=lease",
                "redis+unix:///run/r.sock?db=2&user=u&pass=***&strategy=lease",
            ),
            (
                "postgres://h/db?password=pw&application_name=x",
                "postgres://h/db?password=***&application_name=x",
            ),
            (
                "redis://h:1/0?prefix=password",
                "redis://h:1/0?prefix=password",
            ),
            ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("sqlite::memory:", "sqlite::memory:"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
    }

    #[test]
    fn splits_own_and_passthrough_options() {
        let s = split_options(
            "amqp://u:p@h:5672/%2f?heartbeat=10&prefix=x&slot_ttl_ms=90000",
            &["prefix", "slot_ttl_ms"],
            &["heartbeat"],
        )
        .unwrap();
        assert_eq!(s.client_url(), "amqp://u:p@h:5672/%2f?heartbeat=10");
        assert_eq!(s.get("prefix"), Some("x"));
        assert_eq!(s.millis("slot_ttl_ms", 1, 1, 100_000).unwrap(), 90_000);
        assert_eq!(s.millis("timeout_ms", 7, 1, 100).unwrap(), 7);
        let e = split_options("nats://h?slot_tll_ms=1", &["slot_ttl_ms"], &[]).unwrap_err();
        assert!(e.to_string().contains("\"slot_tll_ms\""), "{e}");
        let twice = split_options("nats://h?prefix=a&prefix=b", &["prefix"], &[]).unwrap();
        assert_eq!(twice.get("prefix"), Some("b"));
        assert!(twice.each_once().is_err());
        let driver = split_options(
            "postgres://h/db?sslmode=disable&table=t&options[search_path]=s",
            &["table"],
            &["sslmode", "options["],
        )
        .unwrap();
        assert_eq!(
            driver.client_url(),
            "postgres://h/db?sslmode=disable&options[search_path]=s"
        );
        assert_eq!(driver.get("table"), Some("t"));
        for bad in ["sslmod=disable", "options[x=1", "optionsx=1"] {
            let e = split_options(
                &format!("postgres://h/db?{bad}"),
                &["table"],
                &["sslmode", "options["],
            )
            .unwrap_err();
            assert!(e.to_string().contains("unknown option"), "{bad}: {e}");
            assert!(
                e.to_string().contains("options[NAME], sslmode"),
                "{bad}: {e}"
            );
        }
    }
}
