-- Issue 19: a won claim writes no secondary index unless its job is checked
-- for overlap.
--
-- runs_running_by (0005) took one index page per won claim, for two readers:
-- the overlap check of a claim with overlap = SKIP (the job's running runs)
-- and a leaving sidecar's end_leases_of (the runs it holds). Most jobs never
-- ask for SKIP, and a leaving sidecar now finds its runs with a plain read
-- beside the writer. So a job is "watched" once a SKIP claim has asked about
-- it, and only the running runs of watched jobs are indexed:
--
--   jobs.watch  1 once a SKIP claim has looked at the job's running runs;
--   runs.watch  the job's flag when the run was written;
--
-- and the invariant the overlap check rests on: every RUNNING run of a
-- watched job has watch = 1. The first SKIP claim of a job sets the job's
-- flag and marks its running runs in the same transaction; every run written
-- after that copies the flag.
--
-- Both columns default to 1, so a writer that does not know them (an older
-- sidecar on the same file) leaves its runs indexed. Existing jobs start
-- unwatched: their next SKIP claim marks their running runs, which the
-- default already marked.
ALTER TABLE jobs ADD COLUMN watch INTEGER NOT NULL DEFAULT 1;
UPDATE jobs SET watch = 0;
ALTER TABLE runs ADD COLUMN watch INTEGER NOT NULL DEFAULT 1;
CREATE INDEX IF NOT EXISTS runs_watched ON runs (job) WHERE state = 'RUNNING' AND watch = 1;
DROP INDEX IF EXISTS runs_running_by;
