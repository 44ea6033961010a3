-- Issue 19: one secondary index written per claim instead of three.
--
-- Every won claim wrote four b-trees: the run itself (the primary key) and
-- three indexes, each a page of WAL per commit. What they served:
--   runs_running (job)                        the running runs of a job (overlap = SKIP)
--   runs_holder  (holder_node, holder_instance) the runs a leaving sidecar holds
--   runs_claimed (claimed_at_ms)              pruning by age
-- Now one partial index serves the first two (a leaving sidecar scans the
-- running runs' index entries, which carry the holder, instead of a
-- b-tree of its own), and pruning walks each job's runs by the primary key
-- (slot_ms below the cutoff, as the PostgreSQL and Redis stores prune).
CREATE INDEX IF NOT EXISTS runs_running_by ON runs (job, holder_node, holder_instance)
    WHERE state = 'RUNNING';
DROP INDEX IF EXISTS runs_running;
DROP INDEX IF EXISTS runs_holder;
DROP INDEX IF EXISTS runs_claimed;
