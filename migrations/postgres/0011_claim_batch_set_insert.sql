-- Issue 19, round 22: a batch writes its new runs in two statements, not
-- one function call per claim. {prefix} is replaced by the configured table
-- prefix.
--
-- In a stream of new slots (the sidecar's p_lock_first: every claim of its
-- last call won), {prefix}_claim_batch_whole (0010) called {prefix}_claim
-- once per claim, and each call ran the two statements of the locked pass's
-- insert first (0009): draw the job's fencing number under its row lock,
-- then INSERT the run ON CONFLICT DO NOTHING. The call, its fourteen
-- arguments and its result record cost PostgreSQL about as much as the two
-- statements themselves.
--
-- When p_lock_first is set, the batch has more than one claim and no job
-- appears twice in it, {prefix}_claim_batch_whole now runs that same
-- insert first for the whole batch at once:
--
-- 1. One INSERT ... ON CONFLICT DO UPDATE draws every claim's fencing number
--    and takes every job row's lock, in the order given (the sidecar sorts
--    a batch by job, so concurrent batches lock in one order).
-- 2. The clock is read once, after every lock is held.
-- 3. One INSERT ... ON CONFLICT DO NOTHING writes the run of every claim
--    that the decision table would answer 'insert' if its run were missing:
--    not late (slot 0, or no later than p_max_late after its slot) and no
--    overlap check to make (overlap = ALLOW). The same run 0009 writes:
--    attempt 1, the drawn number, lease_until = now + lease, claimed_at =
--    now. A row written means the run was missing: the claim is decided
--    'insert', exactly as in 0009.
-- 4. Every other claim (its run exists, it is late, or it makes an overlap
--    check) first hands back its unused number (the job row's lock is still
--    held, and the number was given to no run) and is then decided by
--    {prefix}_claim as before, which draws the same number again. So the
--    job's counter and every answer are what one call per claim would
--    have given.
--
-- A batch in which a job appears twice, or that does not go straight to the
-- lock, is decided one call per claim as in 0010. So is everything else of
-- 0010: an error aborts the call (the sidecar then runs the batch as
-- {prefix}_claim_batch, one subtransaction per claim), and once any claim
-- wrote, the synchronous_commit the call started with is restored. The
-- decision table still lives in {prefix}_claim alone: step 3 is its
-- insert-first step, for many claims at once.
CREATE OR REPLACE FUNCTION {prefix}_claim_batch_whole(
    p_jobs text[], p_slots bigint[], p_tokens text[], p_node text, p_instance bigint,
    p_leases bigint[], p_max_lates bigint[], p_skips boolean[], p_max_attempts bigint[],
    p_dead_nodes text[], p_dead_instances bigint[],
    p_current_nodes text[], p_current_instances bigint[], p_lock_first boolean)
RETURNS TABLE (
    o_index integer, o_error text, o_decision text, o_now_ms bigint,
    o_overlap_node text, o_overlap_instance bigint,
    o_slot_ms bigint, o_state text, o_attempt bigint, o_fencing bigint,
    o_token text, o_holder_node text, o_holder_instance bigint,
    o_lease_until_ms bigint, o_claimed_at_ms bigint, o_finished_at_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_sync    text := current_setting('synchronous_commit');
    v_wrote   boolean := false;
    v_n       integer := coalesce(array_length(p_jobs, 1), 0);
    -- Per claim, the number drawn in step 1 (NULL: no set-wise pass).
    v_fences  bigint[];
    v_now     bigint;
    -- How many runs step 3 wrote.
    v_written integer := 0;
    c         record;
BEGIN
    o_error := NULL;
    IF p_lock_first AND v_n > 1
       AND (SELECT count(DISTINCT j) FROM unnest(p_jobs) AS j) = v_n THEN
        -- 1. Every job's lock and next number, in the order given.
        WITH drawn AS (
            INSERT INTO {prefix}_jobs AS j (job, fence)
                SELECT a.job, 1 FROM unnest(p_jobs) WITH ORDINALITY AS a(job, i) ORDER BY a.i
                ON CONFLICT (job) DO UPDATE SET fence = j.fence + 1
                RETURNING j.job, j.fence)
        SELECT array_agg(d.fence ORDER BY a.i) INTO v_fences
            FROM unnest(p_jobs) WITH ORDINALITY AS a(job, i) JOIN drawn d ON d.job = a.job;
        -- 2. The clock, once every lock is held.
        v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
        -- 3. The runs of the claims that would be decided 'insert'.
        RETURN QUERY
        WITH written AS (
            INSERT INTO {prefix}_runs AS r (job, slot_ms, state, attempt, fencing, token,
                    holder_node, holder_instance, lease_until_ms, claimed_at_ms,
                    finished_at_ms, lease_ms)
                SELECT a.job, a.slot, 'RUNNING', 1, a.fence, a.token, p_node, p_instance,
                    LEAST(v_now::numeric + a.lease, 9223372036854775807)::bigint, v_now, 0,
                    a.lease
                FROM unnest(p_jobs, p_slots, p_tokens, p_leases, p_max_lates, p_skips,
                        v_fences) AS a(job, slot, token, lease, max_late, skip, fence)
                WHERE NOT a.skip AND (a.slot = 0 OR v_now::numeric - a.slot <= a.max_late)
                ON CONFLICT (job, slot_ms) DO NOTHING
                RETURNING r.*)
        SELECT a.i::integer, NULL::text, 'insert'::text, v_now, NULL::text, NULL::bigint,
               w.slot_ms, w.state, w.attempt, w.fencing, w.token, w.holder_node,
               w.holder_instance, w.lease_until_ms, w.claimed_at_ms, w.finished_at_ms
        FROM written w JOIN unnest(p_jobs) WITH ORDINALITY AS a(job, i) ON a.job = w.job;
        GET DIAGNOSTICS v_written = ROW_COUNT;
        IF v_written > 0 THEN
            v_wrote := true;
        END IF;
        IF v_written = v_n THEN
            PERFORM set_config('synchronous_commit', v_sync, true);
            RETURN;
        END IF;
    END IF;
    -- 4. One call per claim: every claim, or those step 3 did not write.
    FOR i IN 1 .. v_n LOOP
        IF v_fences IS NOT NULL THEN
            -- Written in step 3: the run holds the number drawn for it.
            CONTINUE WHEN v_written > 0 AND EXISTS (
                SELECT 1 FROM {prefix}_runs r
                WHERE r.job = p_jobs[i] AND r.slot_ms = p_slots[i] AND r.fencing = v_fences[i]);
            -- Not written: its number goes back, unused, under the lock.
            UPDATE {prefix}_jobs SET fence = fence - 1 WHERE job = p_jobs[i];
        END IF;
        o_index := i;
        c := {prefix}_claim(
            p_jobs[i], p_slots[i], p_tokens[i], p_node, p_instance,
            p_leases[i], p_max_lates[i], p_skips[i], p_max_attempts[i],
            p_dead_nodes, p_dead_instances, p_current_nodes, p_current_instances,
            p_lock_first);
        o_decision := c.o_decision;
        o_now_ms := c.o_now_ms;
        o_overlap_node := c.o_overlap_node;
        o_overlap_instance := c.o_overlap_instance;
        o_slot_ms := c.o_slot_ms;
        o_state := c.o_state;
        o_attempt := c.o_attempt;
        o_fencing := c.o_fencing;
        o_token := c.o_token;
        o_holder_node := c.o_holder_node;
        o_holder_instance := c.o_holder_instance;
        o_lease_until_ms := c.o_lease_until_ms;
        o_claimed_at_ms := c.o_claimed_at_ms;
        o_finished_at_ms := c.o_finished_at_ms;
        IF c.o_decision IN ('insert', 'takeover', 'relock', 'exhausted') THEN
            v_wrote := true;
        END IF;
        RETURN NEXT;
    END LOOP;
    IF v_wrote THEN
        PERFORM set_config('synchronous_commit', v_sync, true);
    END IF;
END
$$;
