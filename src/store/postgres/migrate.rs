//! The embedded PostgreSQL migrations, applied once per table prefix under
//! an advisory lock.

use sha2::{Digest, Sha256};
use sqlx::{Connection, Executor, PgConnection};

use super::errors::AttemptResult;
use crate::error::{Error, Result};

/// The embedded migrations: version, name, SQL with `{prefix}` for the table
/// prefix. Append only.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "runs",
        include_str!("../../../migrations/postgres/0001_runs.sql"),
    ),
    (
        2,
        "claim_function",
        include_str!("../../../migrations/postgres/0002_claim_function.sql"),
    ),
    (
        3,
        "liveness",
        include_str!("../../../migrations/postgres/0003_liveness.sql"),
    ),
    (
        4,
        "store_identity",
        include_str!("../../../migrations/postgres/0004_store_identity.sql"),
    ),
    (
        5,
        "run_lease",
        include_str!("../../../migrations/postgres/0005_run_lease.sql"),
    ),
    (
        6,
        "claim_batch",
        include_str!("../../../migrations/postgres/0006_claim_batch.sql"),
    ),
    (
        7,
        "claim_one_fence_write",
        include_str!("../../../migrations/postgres/0007_claim_one_fence_write.sql"),
    ),
    (
        8,
        "claim_lock_first",
        include_str!("../../../migrations/postgres/0008_claim_lock_first.sql"),
    ),
    (
        9,
        "claim_insert_first",
        include_str!("../../../migrations/postgres/0009_claim_insert_first.sql"),
    ),
    (
        10,
        "claim_batch_whole",
        include_str!("../../../migrations/postgres/0010_claim_batch_whole.sql"),
    ),
    (
        11,
        "claim_batch_set_insert",
        include_str!("../../../migrations/postgres/0011_claim_batch_set_insert.sql"),
    ),
    (
        12,
        "claim_batch_set_wise_from_five",
        include_str!("../../../migrations/postgres/0012_claim_batch_set_wise_from_five.sql"),
    ),
];

/// The advisory lock key that serialises the migrations of one prefix.
pub(super) fn migration_lock_key(table: &str) -> i64 {
    let digest = Sha256::digest(format!("anarchon migrations {table}").as_bytes());
    let mut key = [0u8; 8];
    key.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(key)
}

/// Applies the embedded migrations that `<table>_migrations` does not list,
/// in one transaction that holds an advisory lock for the prefix: sidecars
/// starting at once against an empty database queue here, and the first one
/// creates the tables while the others then find them done.
pub(super) async fn migrate(conn: &mut PgConnection, table: &str) -> Result<()> {
    migrate_once(conn, table)
        .await
        .map_err(|f| match f.into_error() {
            Error::Store(m) => Error::Store(format!("postgres migrations failed: {m}")),
            other => other,
        })
}

async fn migrate_once(conn: &mut PgConnection, table: &str) -> AttemptResult<()> {
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {table}_migrations (
           version    INTEGER     PRIMARY KEY,
           name       TEXT        NOT NULL,
           applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
    );
    let select = format!("SELECT version FROM {table}_migrations");
    let record = format!("INSERT INTO {table}_migrations (version, name) VALUES ($1, $2)");
    let mut tx = conn.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(migration_lock_key(table))
        .execute(&mut *tx)
        .await?;
    (&mut *tx).execute(create.as_str()).await?;
    let applied: Vec<i32> = sqlx::query_scalar(&select).fetch_all(&mut *tx).await?;
    for (version, name, text) in MIGRATIONS {
        if applied.contains(version) {
            continue;
        }
        // Several statements: sent as one simple query (no parameters).
        let text = text.replace("{prefix}", table);
        (&mut *tx).execute(text.as_str()).await?;
        sqlx::query(&record)
            .bind(version)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tracing::info!(version, name, table, "applied postgres migration");
    }
    let known = MIGRATIONS.iter().map(|m| m.0).max().unwrap_or(0);
    if let Some(newer) = applied.iter().copied().filter(|&v| v > known).max() {
        tracing::warn!(
            version = newer,
            known,
            table,
            "the database was migrated by a newer anarchon"
        );
    }
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_differ_per_prefix() {
        assert_ne!(migration_lock_key("a"), migration_lock_key("b"));
        assert_eq!(migration_lock_key("a"), migration_lock_key("a"));
    }
}
