-- Issue 19: group commit. {prefix} is replaced by the configured table prefix.
--
-- {prefix}_claim_batch runs {prefix}_claim (0005) for each element of its
-- arrays, in the order given, all in the caller's one transaction: one
-- COMMIT, one WAL flush for the whole batch. The sidecar sorts a batch by
-- job, so that concurrent batches take job row locks in one order and never
-- deadlock one another.
--
-- Each element runs in its own subtransaction (the BEGIN … EXCEPTION block):
-- an element that fails is rolled back alone and answered with o_error
-- (SQLSTATE, a space, the message), and the others go on. Elements are
-- decided one after another, exactly as separate calls would be.
--
-- {prefix}_claim turns synchronous_commit off for a transaction that only
-- lost a race under the lock. In a batch another element may have won, so
-- once any element wrote, the setting the batch started with is restored:
-- no win commits without its WAL flush.
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
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_sync  text := current_setting('synchronous_commit');
    v_wrote boolean := false;
    c       record;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_jobs, 1), 0) LOOP
        o_index := i;
        BEGIN
            SELECT * INTO c FROM {prefix}_claim(
                p_jobs[i], p_slots[i], p_tokens[i], p_node, p_instance,
                p_leases[i], p_max_lates[i], p_skips[i], p_max_attempts[i],
                p_dead_nodes, p_dead_instances, p_current_nodes, p_current_instances);
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
