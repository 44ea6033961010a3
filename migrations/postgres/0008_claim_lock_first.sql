-- Issue 19, round 11: a claim may go straight to its locked pass, and the
-- batch calls the claim as an expression. {prefix} is replaced by the
-- configured table prefix.
--
-- {prefix}_claim takes a 14th argument, p_lock_first. When it is true the
-- claim skips its first pass, the read without a lock that answers late
-- claims, finished runs, live leases and resends, and decides under the job
-- row's lock at once, exactly as the locked pass of 0007 does. The sidecar
-- sets it while every claim of its last call won (a stream of new slots),
-- where the first pass answers nothing and costs a statement and a round of
-- the decision table. A claim decided under the lock that does not win
-- leaves its fencing number unused (see 0007): numbers of a job still rise
-- with every win, with gaps.
--
-- {prefix}_claim_batch takes the same argument and calls {prefix}_claim as an
-- expression (c := ...), not as SELECT * INTO c FROM ..., which ran every
-- claim through a function scan with a tuple store and a fresh result
-- descriptor.
--
-- The 13-argument forms stay, as wrappers that pass p_lock_first = false,
-- for sidecars of the previous version during a rolling upgrade. The
-- decision table lives in the 14-argument {prefix}_claim alone.

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

CREATE OR REPLACE FUNCTION {prefix}_claim_batch(
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
    v_sync  text := current_setting('synchronous_commit');
    v_wrote boolean := false;
    c       record;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_jobs, 1), 0) LOOP
        o_index := i;
        BEGIN
            c := {prefix}_claim(
                p_jobs[i], p_slots[i], p_tokens[i], p_node, p_instance,
                p_leases[i], p_max_lates[i], p_skips[i], p_max_attempts[i],
                p_dead_nodes, p_dead_instances, p_current_nodes, p_current_instances,
                p_lock_first);
            o_error := NULL;
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
        EXCEPTION WHEN OTHERS THEN
            o_error := SQLSTATE || ' ' || SQLERRM;
            o_decision := NULL;
            o_now_ms := NULL;
            o_overlap_node := NULL;
            o_overlap_instance := NULL;
            o_slot_ms := NULL;
            o_state := NULL;
            o_attempt := NULL;
            o_fencing := NULL;
            o_token := NULL;
            o_holder_node := NULL;
            o_holder_instance := NULL;
            o_lease_until_ms := NULL;
            o_claimed_at_ms := NULL;
            o_finished_at_ms := NULL;
        END;
        RETURN NEXT;
    END LOOP;
    IF v_wrote THEN
        PERFORM set_config('synchronous_commit', v_sync, true);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION {prefix}_claim(
    p_job text, p_slot bigint, p_token text, p_node text, p_instance bigint,
    p_lease bigint, p_max_late bigint, p_skip boolean, p_max_attempts bigint,
    p_dead_nodes text[], p_dead_instances bigint[],
    p_current_nodes text[], p_current_instances bigint[],
    OUT o_decision text, OUT o_now_ms bigint,
    OUT o_overlap_node text, OUT o_overlap_instance bigint,
    OUT o_slot_ms bigint, OUT o_state text, OUT o_attempt bigint, OUT o_fencing bigint,
    OUT o_token text, OUT o_holder_node text, OUT o_holder_instance bigint,
    OUT o_lease_until_ms bigint, OUT o_claimed_at_ms bigint, OUT o_finished_at_ms bigint)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM {prefix}_claim(p_job, p_slot, p_token, p_node, p_instance,
        p_lease, p_max_late, p_skip, p_max_attempts,
        p_dead_nodes, p_dead_instances, p_current_nodes, p_current_instances, false)
$$;

CREATE OR REPLACE FUNCTION {prefix}_claim_batch(
    p_jobs text[], p_slots bigint[], p_tokens text[], p_node text, p_instance bigint,
    p_leases bigint[], p_max_lates bigint[], p_skips boolean[], p_max_attempts bigint[],
    p_dead_nodes text[], p_dead_instances bigint[],
    p_current_nodes text[], p_current_instances bigint[])
RETURNS TABLE (
    o_index integer, o_error text, o_decision text, o_now_ms bigint,
    o_overlap_node text, o_overlap_instance bigint,
    o_slot_ms bigint, o_state text, o_attempt bigint, o_fencing bigint,
    o_token text, o_holder_node text, o_holder_instance bigint,
    o_lease_until_ms bigint, o_claimed_at_ms bigint, o_finished_at_ms bigint)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM {prefix}_claim_batch(p_jobs, p_slots, p_tokens, p_node, p_instance,
        p_leases, p_max_lates, p_skips, p_max_attempts,
        p_dead_nodes, p_dead_instances, p_current_nodes, p_current_instances, false)
$$;
