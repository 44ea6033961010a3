//! Every statement of the PostgreSQL store, spelled once for the
//! configured table prefix.

use std::sync::Arc;

use super::super::sql::{self, RUN_COLUMNS};

/// The database's clock, in epoch milliseconds.
/// What `<prefix>_claim` returns, under the names `answer_of` reads.
const CLAIM_COLUMNS: &str = "o_decision AS decision, o_now_ms AS now_ms, \
    o_overlap_node AS overlap_node, o_overlap_instance AS overlap_instance, \
    o_slot_ms AS slot_ms, o_state AS state, o_attempt AS attempt, o_fencing AS fencing, \
    o_token AS token, o_holder_node AS holder_node, o_holder_instance AS holder_instance, \
    o_lease_until_ms AS lease_until_ms, o_claimed_at_ms AS claimed_at_ms, \
    o_finished_at_ms AS finished_at_ms";

pub(super) const NOW_MS: &str = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// A call of the batch function `<p>_<function>`, under the column names of
/// [`Statements::claim_batch`].
fn batch_call(p: &str, function: &str) -> Arc<str> {
    format!(
        "SELECT o_index AS idx, o_error AS error, {CLAIM_COLUMNS}
         FROM {p}_{function}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
    )
    .into()
}

/// The statements, spelled once for the configured prefix.
pub(super) struct Statements {
    /// Claims, one call of `<prefix>_claim_batch` (see
    /// `migrations/postgres/0006_claim_batch.sql` and `0008_claim_lock_first.sql`,
    /// `$14` is `p_lock_first`): per claim, its index in the arrays (from
    /// 1), its error or its decision and run.
    pub(super) claim_batch: Arc<str>,
    /// The same batch as one call of `<prefix>_claim_batch_whole`
    /// (`migrations/postgres/0010_claim_batch_whole.sql`): the same columns,
    /// no subtransaction per claim, and an error of one claim fails the call.
    pub(super) claim_batch_whole: Arc<str>,
    /// One claim alone, one call of `<prefix>_claim` (same columns but the
    /// index and error; `$14` is `p_lock_first`).
    pub(super) claim_one: Arc<str>,
    /// The database's clock and the run, without a lock.
    pub(super) peek: String,
    /// The claim's first statement: upsert the job row (taking its lock),
    /// returning the job's fencing counter and the clock.
    pub(super) lock_job: String,
    /// Renew/Release/end_lease: lock an existing job row, returning the clock.
    pub(super) lock_existing_job: String,
    pub(super) run_for_update: String,
    pub(super) others: String,
    /// Moves the job's fencing counter on (never back) and writes the run.
    pub(super) write_run: String,
    pub(super) renew: String,
    pub(super) release: String,
    pub(super) end_lease: String,
    pub(super) end_leases_of: String,
    pub(super) history: String,
    pub(super) prune: String,
    /// Raises an instance's liveness counter; returns it.
    pub(super) beat: String,
    /// Liveness counters of (node, instance) arrays, read FOR SHARE.
    pub(super) liveness_for_share: String,
    /// Liveness counters of (node, instance) arrays, without a lock.
    pub(super) liveness: String,
    /// Deletes liveness records not refreshed since a cutoff.
    pub(super) prune_liveness: String,
}

impl Statements {
    pub(super) fn new(p: &str) -> Statements {
        let runs = format!("{p}_runs");
        let jobs = format!("{p}_jobs");
        let liveness = format!("{p}_liveness");
        let liveness_of = format!(
            "SELECT d.n AS node, d.i AS instance, l.counter
             FROM unnest($1::text[], $2::bigint[]) AS d(n, i)
             JOIN {liveness} l ON l.node = d.n AND l.instance = d.i"
        );
        Statements {
            beat: format!(
                "INSERT INTO {liveness} (node, instance, counter, updated_at_ms)
                 VALUES ($1, $2, 1, {NOW_MS})
                 ON CONFLICT (node, instance) DO UPDATE
                   SET counter = {liveness}.counter + 1, updated_at_ms = excluded.updated_at_ms
                 RETURNING counter"
            ),
            liveness_for_share: format!("{liveness_of} FOR SHARE OF l"),
            liveness: liveness_of,
            prune_liveness: format!(
                "DELETE FROM {liveness} WHERE (node, instance) IN (
                   SELECT node, instance FROM {liveness} WHERE updated_at_ms < $1 LIMIT $2)"
            ),
            claim_one: format!(
                "SELECT {CLAIM_COLUMNS} FROM {p}_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
            )
            .into(),
            claim_batch: batch_call(p, "claim_batch"),
            claim_batch_whole: batch_call(p, "claim_batch_whole"),
            peek: format!(
                "SELECT {NOW_MS} AS now_ms, {RUN_COLUMNS}
                 FROM (VALUES (1)) AS one LEFT JOIN {runs} ON job = $1 AND slot_ms = $2"
            ),
            lock_job: format!(
                "INSERT INTO {jobs} AS j (job, fence) VALUES ($1, 0)
                 ON CONFLICT (job) DO UPDATE SET fence = j.fence
                 RETURNING j.fence, {NOW_MS} AS now_ms"
            ),
            lock_existing_job: format!(
                "UPDATE {jobs} SET fence = fence WHERE job = $1 RETURNING {NOW_MS} AS now_ms"
            ),
            run_for_update: format!(
                "SELECT {RUN_COLUMNS} FROM {runs} WHERE job = $1 AND slot_ms = $2 FOR UPDATE"
            ),
            others: format!(
                "SELECT {RUN_COLUMNS} FROM {runs}
                 WHERE job = $1 AND state = 'RUNNING' AND slot_ms <> $2 AND lease_until_ms > $3"
            ),
            write_run: format!(
                "WITH fence AS (UPDATE {jobs} SET fence = $12 WHERE job = $1 AND fence < $12) {}",
                sql::upsert_run_sql(&runs, None)
            ),
            // $3 the clock, $4 the lease asked for (0 = the run's own, see
            // sql::RENEW_LEASE).
            renew: format!(
                "UPDATE {runs} SET lease_until_ms = $3 + {}
                 WHERE job = $1 AND slot_ms = $2 RETURNING lease_until_ms",
                sql::renew_lease("$4", "GREATEST")
            ),
            release: format!(
                "UPDATE {runs} SET state = $3, finished_at_ms = $4 WHERE job = $1 AND slot_ms = $2"
            ),
            end_lease: format!(
                "UPDATE {runs} SET lease_until_ms = $4
                 WHERE job = $1 AND slot_ms = $2 AND token = $3
                   AND state = 'RUNNING' AND lease_until_ms > $4"
            ),
            end_leases_of: format!(
                "WITH c AS (SELECT {NOW_MS} AS now_ms)
                 UPDATE {runs} SET lease_until_ms = c.now_ms FROM c
                 WHERE holder_node = $1 AND holder_instance = $2
                   AND state = 'RUNNING' AND lease_until_ms > c.now_ms"
            ),
            history: format!(
                "SELECT {RUN_COLUMNS} FROM {runs} WHERE job = $1 AND slot_ms < $2
                 ORDER BY slot_ms DESC LIMIT $3"
            ),
            // Only runs whose slot is older than the cutoff too: a slot
            // claimed long before its time must not be forgotten before a late
            // claim of it could still come.
            prune: format!(
                "DELETE FROM {runs} WHERE (job, slot_ms) IN (
                   SELECT job, slot_ms FROM {runs}
                   WHERE claimed_at_ms < $1 AND slot_ms < $1
                     AND (state <> 'RUNNING' OR lease_until_ms < $1)
                   LIMIT $2 FOR UPDATE SKIP LOCKED)"
            ),
        }
    }
}
