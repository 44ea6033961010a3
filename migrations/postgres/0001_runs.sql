-- {prefix} is replaced by the configured table prefix (`?table=`, default
-- `anarchon`). Applied once per prefix, under an advisory lock, and recorded
-- in {prefix}_migrations.

-- One row per job: its row lock orders every write to the job's runs, and it
-- holds the job's fencing counter, bumped at every win, takeover or relock.
-- Never pruned, so fencing keeps rising.
CREATE TABLE IF NOT EXISTS {prefix}_jobs (
    job   TEXT   PRIMARY KEY,
    fence BIGINT NOT NULL DEFAULT 0
);

-- One row per (job, slot): the run.
CREATE TABLE IF NOT EXISTS {prefix}_runs (
    job             TEXT   NOT NULL,
    slot_ms         BIGINT NOT NULL,
    state           TEXT   NOT NULL,
    attempt         BIGINT NOT NULL,
    fencing         BIGINT NOT NULL,
    token           TEXT   NOT NULL,
    holder_node     TEXT   NOT NULL,
    holder_instance BIGINT NOT NULL,
    lease_until_ms  BIGINT NOT NULL,
    claimed_at_ms   BIGINT NOT NULL,
    finished_at_ms  BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (job, slot_ms)
);

CREATE INDEX IF NOT EXISTS {prefix}_runs_running ON {prefix}_runs (job) WHERE state = 'RUNNING';
CREATE INDEX IF NOT EXISTS {prefix}_runs_holder ON {prefix}_runs (holder_node, holder_instance) WHERE state = 'RUNNING';
CREATE INDEX IF NOT EXISTS {prefix}_runs_claimed ON {prefix}_runs (claimed_at_ms);
