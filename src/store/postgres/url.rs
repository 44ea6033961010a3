//! The PostgreSQL backend URL: where the store is and how it runs.

use super::super::backend_url::{count, split_options};
use super::super::Backend;
use crate::error::{Error, Result};

/// The query options the store takes itself (the driver's are [`DRIVER_OPTIONS`]).
const OPTIONS: &[&str] = &[
    "table",
    "max_connections",
    "claim",
    "max_batch",
    "batches_in_flight",
];

/// The query options the driver (sqlx 0.8) reads; any other is refused, since
/// the driver would only log it and connect without it (`sslmod=require`
/// would connect without requiring TLS). `options[` admits `options[search_path]=…`.
const DRIVER_OPTIONS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
    "options[",
];

/// The table prefix when the URL names none.
pub const DEFAULT_TABLE: &str = "anarchon";
/// Claims per group commit when the URL names no `max_batch` (in a batch
/// that runs again after one of its claims failed, each claim is a
/// subtransaction; PostgreSQL keeps 64 per transaction in shared memory).
pub const DEFAULT_MAX_BATCH: usize = 32;
/// Group commits at once when the URL names no `batches_in_flight`. Two
/// carried 10–20 % more claims than four at 4 and 16 clients, and as many at
/// 64, once a batch had no subtransaction per claim (docs/BENCHMARKS.md,
/// round 17): fewer batches at once carry more claims each, and a batch's
/// commit is most of its cost to the server.
pub const DEFAULT_BATCHES_IN_FLIGHT: usize = 2;
/// Connections per store when the URL names no `max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 16;
/// Where and how a PostgreSQL store runs, from its backend URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTarget {
    /// What the driver gets: the URL without the parameters below.
    pub url: String,
    /// `table`: the prefix of the store's tables.
    pub table: String,
    /// `max_connections`: the pool size.
    pub max_connections: u32,
    /// `claim`: how a claim runs.
    pub claim: PgClaim,
    /// `max_batch`: the most claims one group commit carries (1: none).
    pub max_batch: usize,
    /// `batches_in_flight`: group commits running at once, each on its own
    /// connection.
    pub batches_in_flight: usize,
}

/// How a claim runs. Both take the same steps under the same locks and decide
/// with the same table; the conformance suite runs against both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgClaim {
    /// `claim=function` (default): one round trip, a call of the
    /// `<prefix>_claim` PL/pgSQL function the migrations create, for each
    /// claim of a batch gathered from concurrent requests (group commit,
    /// `<prefix>_claim_batch`, see [`batch`]).
    Function,
    /// `claim=transaction`: a plain read, then the transaction driven from
    /// Rust with the shared `claim::decide` (up to six round trips).
    Transaction,
}

/// Parses
/// `postgres://USER@HOST:PORT/DB?table=PREFIX[&max_connections=N][&claim=function|transaction][&max_batch=N][&batches_in_flight=N]`.
/// The driver's own parameters ([`DRIVER_OPTIONS`]: `sslmode`,
/// `application_name`, …) go on to it; any other is refused, naming it.
/// Without an `application_name`, connections are named
/// `anarchon/<prefix>`, so an operator can find them in `pg_stat_activity`.
pub(in crate::store) fn parse_url(url: &str) -> Result<Backend> {
    // The URL itself is not repeated: it may hold a password.
    url::Url::parse(url)
        .map_err(|e| Error::invalid("backend", format!("not a valid postgres:// URL: {e}")))?;
    let opts = split_options(url, OPTIONS, DRIVER_OPTIONS)?;
    let mut table = DEFAULT_TABLE.to_owned();
    let mut max_connections = DEFAULT_MAX_CONNECTIONS;
    let mut claim = PgClaim::Function;
    let mut max_batch = DEFAULT_MAX_BATCH;
    let mut batches_in_flight = DEFAULT_BATCHES_IN_FLIGHT;
    for (k, v) in &opts.own {
        match k.as_str() {
            "table" => table = v.clone(),
            "max_connections" => {
                max_connections = count("max_connections", v, 1000)? as u32;
            }
            "max_batch" => max_batch = count("max_batch", v, 64)?,
            "batches_in_flight" => batches_in_flight = count("batches_in_flight", v, 1000)?,
            "claim" => {
                claim = match v.as_str() {
                    "function" => PgClaim::Function,
                    "transaction" => PgClaim::Transaction,
                    other => {
                        return Err(Error::invalid(
                            "claim",
                            format!("must be function or transaction, got {other:?}"),
                        ))
                    }
                }
            }
            // split_options let no other option through as ours.
            _ => {}
        }
    }
    check_table(&table)?;
    let mut driver = opts;
    let named = driver.passthrough.iter().any(|p| {
        url::form_urlencoded::parse(p.as_bytes())
            .next()
            .is_some_and(|(k, _)| k == "application_name")
    });
    if !named {
        driver.passthrough.push(
            url::form_urlencoded::Serializer::new(String::new())
                .append_pair("application_name", &format!("anarchon/{table}"))
                .finish(),
        );
    }
    Ok(Backend::Postgres(PgTarget {
        url: driver.client_url(),
        table,
        max_connections,
        claim,
        max_batch,
        batches_in_flight,
    }))
}

/// The table prefix goes into identifiers, so it is held to
/// `[a-z_][a-z0-9_]{0,40}`, not ending in `_` (the tables are
/// `<prefix>_runs`, …: `x_` would make `x__runs`).
pub(super) fn check_table(table: &str) -> Result<()> {
    if table.ends_with('_') {
        return Err(Error::invalid(
            "table",
            format!(
                "{table:?} must not end with _: the tables are named {table}_runs, {table}_jobs, …; \
                 use {:?}",
                table.trim_end_matches('_')
            ),
        ));
    }
    let ok = table.len() <= 41
        && table
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && table
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "table",
            format!("{table:?} must match [a-z_][a-z0-9_]{{0,40}}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> PgTarget {
        match parse_url(url).unwrap() {
            Backend::Postgres(t) => t,
            other => panic!("not postgres: {other:?}"),
        }
    }

    #[test]
    fn urls() {
        let t = target("postgres://u@h:5433/db?table=t_1&sslmode=disable");
        assert_eq!(
            t,
            PgTarget {
                url: "postgres://u@h:5433/db?sslmode=disable&application_name=anarchon%2Ft_1"
                    .into(),
                table: "t_1".into(),
                max_connections: DEFAULT_MAX_CONNECTIONS,
                claim: PgClaim::Function,
                max_batch: DEFAULT_MAX_BATCH,
                batches_in_flight: DEFAULT_BATCHES_IN_FLIGHT,
            }
        );
        let t =
            target("postgresql://u@h/db?application_name=x&max_connections=3&claim=transaction");
        assert_eq!(t.url, "postgresql://u@h/db?application_name=x");
        assert_eq!(t.table, DEFAULT_TABLE);
        assert_eq!(t.max_connections, 3);
        assert_eq!(t.claim, PgClaim::Transaction);
        assert!(matches!(
            parse_url("postgres://u@h/db?claim=lua"),
            Err(Error::InvalidArgument { field: "claim", .. })
        ));
        let t = target("postgres://u@h/db?max_batch=1&batches_in_flight=16");
        assert_eq!((t.max_batch, t.batches_in_flight), (1, 16));
        // A misspelt option is refused, whether ours or the driver's: the
        // driver would only log it.
        for bad in ["max_bach=8", "sslmod=require", "tabel=x"] {
            let e = parse_url(&format!("postgres://u@h/db?{bad}")).unwrap_err();
            let key = bad.split('=').next().unwrap_or_default();
            assert!(
                matches!(
                    e,
                    Error::InvalidArgument {
                        field: "backend",
                        ..
                    }
                ) && e.to_string().contains(&format!("{key:?}")),
                "{bad}: {e}"
            );
        }
        let t = target("postgres://u@h/db?sslmode=require&options[search_path]=s&port=5433");
        assert_eq!(
            t.url,
            "postgres://u@h/db?sslmode=require&options[search_path]=s&port=5433\
             &application_name=anarchon%2Fanarchon"
        );
        for (bad, field) in [
            ("max_batch=0", "max_batch"),
            ("max_batch=65", "max_batch"),
            ("batches_in_flight=x", "batches_in_flight"),
        ] {
            let e = parse_url(&format!("postgres://u@h/db?{bad}")).unwrap_err();
            assert!(
                matches!(e, Error::InvalidArgument { field: f, .. } if f == field),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn table_prefix_is_checked_and_named() {
        for bad in [
            "",
            "1abc",
            "A",
            "a-b",
            "a;drop",
            &"a".repeat(42),
            "ü",
            "x_",
            "_",
        ] {
            let e = parse_url(&format!("postgres://u@h/db?table={bad}")).unwrap_err();
            assert!(
                matches!(e, Error::InvalidArgument { field: "table", .. }),
                "{bad}: {e}"
            );
        }
        for good in ["_a", "a", "anarchon", "t_0f", &"a".repeat(41)] {
            assert!(parse_url(&format!("postgres://u@h/db?table={good}")).is_ok());
        }
        let e = parse_url("postgres://u@h/db?max_connections=0").unwrap_err();
        assert!(matches!(
            e,
            Error::InvalidArgument {
                field: "max_connections",
                ..
            }
        ));
    }
}
