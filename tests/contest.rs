//! Multi-process contests: 3 real `anarchon serve` processes, 48 concurrent
//! gRPC claimers, ≥ 500 slots, exactly one WON per slot, on every backend.
//! Adding a backend is one `contest!` line with a factory that returns
//! `Option<Backend>` (`None` = its service is unreachable outside CI).

mod common;

use common::contest::{Backend, Contest};

/// `contest!(name, factory)`, or `contest!(name, factory, field: value, …)`
/// to change the contest's shape (the fields of [`Contest`]).
macro_rules! contest {
    ($name:ident, $backend:expr $(, $field:ident: $value:expr)* $(,)?) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            if let Some(backend) = $backend.await {
                Contest {
                    $($field: $value,)*
                    ..Contest::default()
                }
                .run_on(backend)
                .await;
            }
        }
    };
}

contest!(sqlite_three_processes_one_file, Backend::sqlite());
contest!(postgres_three_processes, Backend::postgres());
// Slots of 16 jobs, each slot claimed once through each sidecar: batches of
// different jobs, which go set-wise after a call of wins (migration 11; from
// five claims up, migration 12) and meet the other sidecars' rows.
contest!(
    postgres_three_processes_sixteen_jobs,
    Backend::postgres(),
    jobs: 16,
    spread: 16,
);
contest!(redis_lease_three_processes, Backend::redis("lease"));
// stream-id expects each job's slots in increasing order, so every claimer
// claims every slot in order (`spread: 1`): whoever claims slot n has
// claimed every earlier slot, and no claim is ever answered LATE.
contest!(redis_stream_id_three_processes, Backend::redis("stream-id"), spread: 1, slots: 500);
contest!(
    redis_unix_lease_three_processes,
    Backend::redis_unix("lease")
);
contest!(
    redis_cluster_lease_three_processes,
    Backend::redis_cluster("lease")
);
// Each slot is claimed by 12 claimers; every claim declares a durable
// queue, so this takes about a minute.
contest!(rabbitmq_three_processes, Backend::rabbitmq());
contest!(nats_three_processes, Backend::nats());
