-- Issue 19, round 23: a batch goes set-wise only from five claims up.
-- {prefix} is replaced by the configured table prefix.
--
-- Migration 0011 wrote the new runs of every batch of two claims or more
-- set-wise. On a faster boot (docs/BENCHMARKS.md, round 23) that path costs
-- PostgreSQL more than one call per claim in small batches: its statements
-- (the distinct-jobs check, the two INSERTs over unnest with their joins)
-- have a fixed cost per batch that one call per claim does not pay.
-- pgbench, PostgreSQL CPU per claim, set-wise against one call per claim:
-- 2 claims +18 to +21 %, 3 claims +4 to +11 %, 4 claims -1 to +9 %,
-- 5 claims -5 to 0 %, 6 claims -10 to -15 %, 16 claims -7 to -17 %. Behind
-- the sidecar at 4 clients (batches of about two) 0011 carried 13 % fewer
-- claims than 0010, at 22 % more PostgreSQL CPU per claim.
--
-- So the set-wise pass now needs at least five claims; a smaller batch is
-- decided one call per claim, as in 0010. Nothing else changes: the
-- function is 0011's, rewritten from the catalog with its one condition
-- `v_n > 1` become `v_n >= 5` (so its body is not repeated here), and every
-- answer and every job's fencing counter stay what one call per claim
-- gives. Should the function not hold that condition, the migration fails
-- rather than leave it unchanged.
DO $migration$
DECLARE
    f       regprocedure := '{prefix}_claim_batch_whole(text[], bigint[], text[], text, bigint,
        bigint[], bigint[], boolean[], bigint[], text[], bigint[], text[], bigint[],
        boolean)'::regprocedure;
    old_def text := pg_get_functiondef(f);
    new_def text := replace(old_def, 'IF p_lock_first AND v_n > 1', 'IF p_lock_first AND v_n >= 5');
BEGIN
    IF new_def = old_def THEN
        RAISE EXCEPTION 'migration 12: % does not hold the set-wise condition of migration 11', f;
    END IF;
    EXECUTE new_def;
END
$migration$;
