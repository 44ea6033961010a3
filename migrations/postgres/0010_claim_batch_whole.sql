-- Issue 19, round 17: a batch without subtransactions. {prefix} is replaced
-- by the configured table prefix.
--
-- {prefix}_claim_batch (0008) runs each element in its own subtransaction
-- (a BEGIN ... EXCEPTION block), so that one element that fails is rolled
-- back alone. Every element then costs a subtransaction's start and
-- release, and a subtransaction id for its writes, although an element
-- almost never fails.
--
-- {prefix}_claim_batch_whole takes the same arguments and returns the same
-- rows (o_error always NULL), but runs the elements with no block around
-- them: an element that fails aborts the call, and with it the caller's
-- transaction, so nothing of the batch is written. The sidecar then calls
-- {prefix}_claim_batch with the same batch, where the element that fails is
-- answered with its own error and the others go on. Elements are decided
-- one after another, in the order given, exactly as in {prefix}_claim_batch;
-- the synchronous_commit rule is the same: once any element wrote, the
-- setting the batch started with is restored, so no win commits without
-- its WAL flush.
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
    v_sync  text := current_setting('synchronous_commit');
    v_wrote boolean := false;
    c       record;
BEGIN
    o_error := NULL;
    FOR i IN 1 .. coalesce(array_length(p_jobs, 1), 0) LOOP
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
