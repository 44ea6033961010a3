//! The store conformance suite, stamped onto every backend. Adding a backend
//! is one `conformance!` line with a factory that returns `Option<DynStore>`
//! (`None` = its service is unreachable outside CI; the suite says SKIPPED),
//! and `memory_ms = N` for a once backend that forgets a claim after N ms.

mod common;

use anarchon::store::{self, DynStore, StoreOptions};
use common::services;
use common::suite;

macro_rules! conformance {
    // `memory_ms = N`: a once backend whose memory of a claim lapses after
    // N ms; it also gets the refusals of what that memory cannot cover.
    ($name:ident, $factory:expr $(, memory_ms = $memory:expr)?) => {
        mod $name {
            use super::*;

            async fn store() -> Option<DynStore> {
                $factory.await
            }

            macro_rules! case {
                ($case:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $case() {
                        if let Some(s) = store().await {
                            suite::$case(&*s).await;
                        }
                    }
                };
            }

            case!(win);
            case!(resend_same_token);
            case!(second_claimer_is_excluded);
            case!(takeover_after_lapsed_lease);
            case!(takeover_of_dead_holder);
            case!(attempts_exhausted);
            case!(late_writes_nothing);
            case!(far_future_slot_is_refused_and_writes_nothing);
            case!(overlap_skip);
            case!(renew_extends);
            case!(renew_keeps_the_claimed_lease);
            case!(stale_token_is_fenced);
            case!(release_is_idempotent);
            case!(history_newest_first);
            case!(lock_slot_zero);
            case!(end_lease_hands_over);
            case!(prune_removes_old_runs);
            case!(prune_goes_by_slot_and_claim_time);

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn contest() {
                if let Some(s) = store().await {
                    suite::contest(s).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fifty_claimers_one_slot() {
                if let Some(s) = store().await {
                    suite::fifty_claimers_one_slot(s).await;
                }
            }

            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn refuses_what_its_memory_cannot_cover() {
                    if let Some(s) = store().await {
                        suite::refuses_what_its_memory_cannot_cover(&*s, $memory).await;
                    }
                }
            )?
        }
    };
}

/// A fresh SQLite file per test; `query` is the URL's options.
async fn sqlite(query: &str) -> Option<DynStore> {
    let dir = tempfile::tempdir().unwrap().keep();
    let url = format!("sqlite://{}{query}", dir.join("t.db").display());
    Some(store::open(&url, &StoreOptions::default()).await.unwrap())
}

conformance!(sqlite, sqlite(""));
// Group commit off: every write is its own transaction (the path of the
// bench's "raw single-claim step").
conformance!(sqlite_max_batch_1, sqlite("?max_batch=1"));
conformance!(postgres, common::pg::store(""));
conformance!(
    postgres_max_batch_1,
    common::pg::store("&max_batch=1&batches_in_flight=16")
);
conformance!(
    postgres_transaction,
    common::pg::store("&claim=transaction")
);

conformance!(redis_lease, common::redis::single("lease"));
conformance!(redis_stream_id, common::redis::single("stream-id"));
conformance!(redis_script, common::redis::single("script"));
conformance!(redis_idmp, common::redis::idmp());
// The same server kinds over a Unix socket (`redis+unix://`, database 1).
conformance!(redis_unix_lease, common::redis::unix("lease"));
conformance!(redis_unix_stream_id, common::redis::unix("stream-id"));
conformance!(redis_unix_script, common::redis::unix("script"));
conformance!(redis_cluster_lease, common::redis::cluster("lease"));
conformance!(redis_cluster_stream_id, common::redis::cluster("stream-id"));
conformance!(redis_cluster_script, common::redis::cluster("script"));
// High availability (scripts/services/extra-redis-ha.sh): a 3+3 cluster with
// the default min_replicas (1: every master has a replica), and a Sentinel
// group with min_replicas=1.
conformance!(redis_ha_cluster_lease, redis_ha("redis+cluster://127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103,127.0.0.1:7104,127.0.0.1:7105?strategy=lease"));
conformance!(redis_ha_cluster_stream_id, redis_ha("redis+cluster://127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103,127.0.0.1:7104,127.0.0.1:7105?strategy=stream-id"));
conformance!(redis_sentinel_lease, redis_ha("redis+sentinel://127.0.0.1:26390,127.0.0.1:26391,127.0.0.1:26392/anarchon-ha?strategy=lease&min_replicas=1"));
conformance!(redis_sentinel_stream_id, redis_ha("redis+sentinel://127.0.0.1:26390,127.0.0.1:26391,127.0.0.1:26392/anarchon-ha?strategy=stream-id&min_replicas=1"));
conformance!(redis_sentinel_script, redis_ha("redis+sentinel://127.0.0.1:26390,127.0.0.1:26391,127.0.0.1:26392/anarchon-ha?strategy=script&min_replicas=1"));

/// A store on the HA setups, with a key prefix of its own.
async fn redis_ha(url: &str) -> Option<DynStore> {
    if !services::require("Redis HA (cluster)", "127.0.0.1:7100")
        || !services::require("Redis HA (sentinel)", "127.0.0.1:26390")
    {
        return None;
    }
    let url = format!("{url}&prefix={}", common::redis::prefix());
    Some(store::open(&url, &StoreOptions::default()).await.unwrap())
}

// The memories outlast the suite's widest max_late (1 h).
conformance!(
    rabbitmq,
    common::brokers::rabbitmq("&slot_ttl_ms=3700000"),
    memory_ms = 3_700_000
);
conformance!(
    nats,
    common::brokers::nats("&duplicate_window_ms=3700000"),
    memory_ms = 3_700_000
);

#[allow(unused)]
fn _services_used() -> bool {
    services::in_ci()
}
