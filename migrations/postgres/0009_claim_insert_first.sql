-- Issue 19, round 12: the locked pass of a claim writes a new run first.
-- {prefix} is replaced by the configured table prefix.
--
-- In the locked pass, with the job row's lock held, {prefix}_claim reads
-- the run FOR UPDATE, decides with the table, and for a first claim writes
-- the run with INSERT ... ON CONFLICT DO UPDATE: three statements and a
-- round of the decision table for the most common claim of all, a new slot.
--
-- The decision table answers 'insert' for a missing run whenever the claim
-- is not late (slot 0, or no later than p_max_late after its slot) and it
-- makes no overlap check (overlap = ALLOW). In exactly that case the locked
-- pass now tries INSERT ... ON CONFLICT DO NOTHING first: a row written
-- means the run was missing and the decision is 'insert', with the same
-- run the table would have written (attempt 1, the drawn fencing number,
-- lease_until = now + lease, claimed_at = now). A conflict writes nothing
-- and takes no lock, and the claim reads the run FOR UPDATE and decides as
-- before. Late claims and overlap = SKIP take the old path unchanged.
--
-- The job row's lock is held throughout, as before, so no other claim of
-- the job can come between the insert and the decision. Only the body of
-- the 14-argument {prefix}_claim changes; {prefix}_claim_batch and the
-- 13-argument wrappers of 0008 call it by name.

CREATE OR REPLACE FUNCTION {prefix}_claim(
    p_job text, p_slot bigint, p_token text, p_node text, p_instance bigint,
    p_lease bigint, p_max_late bigint, p_skip boolean, p_max_attempts bigint,
    p_dead_nodes text[], p_dead_instances bigint[],
    p_current_nodes text[], p_current_instances bigint[], p_lock_first boolean,
    OUT o_decision text, OUT o_now_ms bigint,
    OUT o_overlap_node text, OUT o_overlap_instance bigint,
    OUT o_slot_ms bigint, OUT o_state text, OUT o_attempt bigint, OUT o_fencing bigint,
    OUT o_token text, OUT o_holder_node text, OUT o_holder_instance bigint,
    OUT o_lease_until_ms bigint, OUT o_claimed_at_ms bigint, OUT o_finished_at_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r          {prefix}_runs%ROWTYPE;
    has_run    boolean;
    -- p_lock_first: straight to the locked pass (see above).
    locked     boolean := p_lock_first;
    v_fence    bigint;
    overlapped boolean;
BEGIN
    LOOP
        IF NOT locked THEN
            o_now_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
            SELECT * INTO r FROM {prefix}_runs WHERE job = p_job AND slot_ms = p_slot;
            has_run := FOUND;
        ELSE
            -- The job row's lock, and the job's next fencing number, in
            -- one write (0005 wrote the row twice: here, then again with
            -- the number it issued).
            INSERT INTO {prefix}_jobs AS j (job, fence) VALUES (p_job, 1)
                ON CONFLICT (job) DO UPDATE SET fence = j.fence + 1
                RETURNING j.fence INTO v_fence;
            o_now_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
            -- Insert first (0009): where a missing run would be decided
            -- 'insert' (not late, no overlap check to make), write it at
            -- once. A conflict writes nothing, and the run is read and
            -- decided below as before.
            IF NOT p_skip AND (p_slot = 0 OR o_now_ms::numeric - p_slot <= p_max_late) THEN
                INSERT INTO {prefix}_runs (job, slot_ms, state, attempt, fencing, token,
                        holder_node, holder_instance, lease_until_ms, claimed_at_ms,
                        finished_at_ms, lease_ms)
                    VALUES (p_job, p_slot, 'RUNNING', 1, v_fence, p_token, p_node, p_instance,
                        LEAST(o_now_ms::numeric + p_lease, 9223372036854775807)::bigint,
                        o_now_ms, 0, p_lease)
                    ON CONFLICT (job, slot_ms) DO NOTHING
                    RETURNING * INTO r;
                IF FOUND THEN
                    o_decision := 'insert';
                    o_slot_ms := r.slot_ms;
                    o_state := r.state;
                    o_attempt := r.attempt;
                    o_fencing := r.fencing;
                    o_token := r.token;
                    o_holder_node := r.holder_node;
                    o_holder_instance := r.holder_instance;
                    o_lease_until_ms := r.lease_until_ms;
                    o_claimed_at_ms := r.claimed_at_ms;
                    o_finished_at_ms := r.finished_at_ms;
                    RETURN;
                END IF;
            END IF;
            SELECT * INTO r FROM {prefix}_runs WHERE job = p_job AND slot_ms = p_slot FOR UPDATE;
            has_run := FOUND;
        END IF;

        -- The decision table (claim::decide).
        o_overlap_node := NULL;
        o_overlap_instance := NULL;
        IF NOT has_run AND p_slot <> 0 AND o_now_ms::numeric - p_slot > p_max_late THEN
            o_decision := 'late';
        ELSIF NOT has_run OR (r.state <> 'RUNNING' AND p_slot = 0) THEN
            -- A run would start: with overlap = SKIP, another running run of
            -- the job with a current lease and a live holder stops it.
            overlapped := false;
            IF p_skip THEN
                SELECT o.holder_node, o.holder_instance INTO o_overlap_node, o_overlap_instance
                FROM {prefix}_runs o
                WHERE o.job = p_job AND o.state = 'RUNNING' AND o.slot_ms <> p_slot
                  AND o.lease_until_ms > o_now_ms
                  AND NOT {prefix}_holder_dead(o.holder_node, o.holder_instance,
                        p_dead_nodes, p_dead_instances, p_current_nodes, p_current_instances)
                LIMIT 1;
                overlapped := FOUND;
            END IF;
            IF overlapped THEN
                o_decision := 'overlap';
            ELSIF has_run THEN
                o_decision := 'relock';
            ELSE
                o_decision := 'insert';
            END IF;
        ELSIF r.state = 'RUNNING' THEN
            IF r.lease_until_ms > o_now_ms
               AND NOT {prefix}_holder_dead(r.holder_node, r.holder_instance,
                        p_dead_nodes, p_dead_instances, p_current_nodes, p_current_instances) THEN
                IF r.token = p_token THEN
                    o_decision := 'resend';
                ELSE
                    o_decision := 'running';
                END IF;
            ELSIF p_slot = 0 OR r.attempt < p_max_attempts THEN
                o_decision := 'takeover';
            ELSE
                o_decision := 'exhausted';
            END IF;
        ELSE
            o_decision := 'done';
        END IF;

        EXIT WHEN locked OR o_decision NOT IN ('insert', 'takeover', 'exhausted', 'relock');
        locked := true;
    END LOOP;

    IF o_decision IN ('insert', 'takeover', 'relock') THEN
        r.job := p_job;
        r.slot_ms := p_slot;
        r.state := 'RUNNING';
        -- A takeover is the next attempt; a first claim and a relock of a
        -- released lock (slot 0) start a new run at attempt 1.
        r.attempt := CASE WHEN o_decision = 'takeover' THEN LEAST(r.attempt + 1, 4294967295) ELSE 1 END;
        r.fencing := v_fence;
        r.token := p_token;
        r.holder_node := p_node;
        r.holder_instance := p_instance;
        r.lease_until_ms := LEAST(o_now_ms::numeric + p_lease, 9223372036854775807)::bigint;
        r.claimed_at_ms := o_now_ms;
        r.finished_at_ms := 0;
        r.lease_ms := p_lease;
        INSERT INTO {prefix}_runs VALUES (r.*)
            ON CONFLICT (job, slot_ms) DO UPDATE SET
              state = excluded.state, attempt = excluded.attempt, fencing = excluded.fencing,
              token = excluded.token, holder_node = excluded.holder_node,
              holder_instance = excluded.holder_instance, lease_until_ms = excluded.lease_until_ms,
              claimed_at_ms = excluded.claimed_at_ms, finished_at_ms = excluded.finished_at_ms,
              lease_ms = excluded.lease_ms;
    ELSIF o_decision = 'exhausted' THEN
        r.state := 'INTERRUPTED';
        r.finished_at_ms := o_now_ms;
        UPDATE {prefix}_runs SET state = r.state, finished_at_ms = r.finished_at_ms
            WHERE job = p_job AND slot_ms = p_slot;
    ELSIF locked THEN
        -- Lost the race under the lock: nothing but the job's fencing
        -- number was written, a number issued to no one, so the commit need
        -- not wait for a WAL flush (lost in a crash, it is issued again,
        -- still above every number a committed win holds).
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;

    IF has_run OR o_decision IN ('insert', 'takeover', 'relock') THEN
        o_slot_ms := r.slot_ms;
        o_state := r.state;
        o_attempt := r.attempt;
        o_fencing := r.fencing;
        o_token := r.token;
        o_holder_node := r.holder_node;
        o_holder_instance := r.holder_instance;
        o_lease_until_ms := r.lease_until_ms;
        o_claimed_at_ms := r.claimed_at_ms;
        o_finished_at_ms := r.finished_at_ms;
    END IF;
END
$$;
