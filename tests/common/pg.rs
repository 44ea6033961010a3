//! The local PostgreSQL (trust auth, database `test`): each test gets its
//! own table prefix, so tests never see each other's rows.

use anarchon::store::{self, DynStore, StoreOptions};

use super::services;

/// The server every PostgreSQL test uses.
pub const URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Whether the server is there (skips outside CI, fails under CI=true).
pub fn available() -> bool {
    services::require("PostgreSQL", "127.0.0.1:5432")
}

/// A fresh table prefix.
pub fn prefix() -> String {
    format!("t_{:016x}", rand::random::<u64>())
}

/// The backend URL of a prefix.
pub fn backend(prefix: &str) -> String {
    format!("{URL}?table={prefix}")
}

/// The `application_name` of a store on `prefix` (see `postgres::parse_url`).
pub fn application_name(prefix: &str) -> String {
    format!("anarchon/{prefix}")
}

/// A store on a fresh prefix, or `None` when PostgreSQL is not reachable.
/// `params` are more URL parameters (`&claim=transaction`).
pub async fn store(params: &str) -> Option<DynStore> {
    if !available() {
        return None;
    }
    sweep_stale().await;
    let url = format!("{}{params}", backend(&prefix()));
    Some(store::open(&url, &StoreOptions::default()).await.unwrap())
}

/// A plain pool for a test's own statements.
pub async fn admin() -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(URL)
        .await
        .unwrap()
}

/// Drops the tables and functions of `prefix`.
pub async fn drop_tables(prefix: &str) {
    let pool = admin().await;
    drop_prefix(&pool, prefix).await.unwrap();
}

async fn drop_prefix(pool: &sqlx::PgPool, prefix: &str) -> sqlx::Result<()> {
    // Every overload of the prefix's functions (`_claim` and `_claim_batch`
    // have a 13- and a 14-argument form since migration 8).
    sqlx::raw_sql(&format!(
        "DO $$ DECLARE f regprocedure; BEGIN
           FOR f IN SELECT oid::regprocedure FROM pg_proc
             WHERE proname IN ('{prefix}_claim', '{prefix}_claim_batch',
                               '{prefix}_claim_batch_whole', '{prefix}_holder_dead')
               AND pronamespace = current_schema()::regnamespace
           LOOP EXECUTE 'DROP FUNCTION IF EXISTS ' || f::text || ' CASCADE'; END LOOP;
         END $$;
         DROP TABLE IF EXISTS {prefix}_runs, {prefix}_jobs, {prefix}_liveness, {prefix}_meta,
           {prefix}_migrations"
    ))
    .execute(pool)
    .await
    .map(drop)
}

/// Once per test process: drops the test prefixes (`t_…`) migrated more
/// than an hour ago, which tests that cannot clean up after themselves (the
/// conformance suite) leave behind.
async fn sweep_stale() {
    static SWEPT: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    SWEPT
        .get_or_init(|| async {
            let pool = admin().await;
            let prefixes: Vec<String> = sqlx::query_scalar(
                r"SELECT left(tablename, -11) FROM pg_tables
                  WHERE schemaname = current_schema() AND tablename LIKE 't\_%\_migrations'",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            for p in prefixes {
                let stale: bool = sqlx::query_scalar(&format!(
                    "SELECT coalesce(max(applied_at) < now() - interval '1 hour', false)
                     FROM {p}_migrations"
                ))
                .fetch_one(&pool)
                .await
                .unwrap_or(false);
                if stale {
                    // Another test process may be sweeping it too.
                    let _ = drop_prefix(&pool, &p).await;
                }
            }
        })
        .await;
}
