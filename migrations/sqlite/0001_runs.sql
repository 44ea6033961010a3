-- One row per job: its fencing counter, bumped at every win or takeover.
CREATE TABLE IF NOT EXISTS jobs (
    job   TEXT PRIMARY KEY NOT NULL,
    fence INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

-- One row per (job, slot): the run.
CREATE TABLE IF NOT EXISTS runs (
    job             TEXT    NOT NULL,
    slot_ms         INTEGER NOT NULL,
    state           TEXT    NOT NULL,
    attempt         INTEGER NOT NULL,
    fencing         INTEGER NOT NULL,
    token           TEXT    NOT NULL,
    holder_node     TEXT    NOT NULL,
    holder_instance INTEGER NOT NULL,
    lease_until_ms  INTEGER NOT NULL,
    claimed_at_ms   INTEGER NOT NULL,
    finished_at_ms  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job, slot_ms)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS runs_running ON runs (job) WHERE state = 'RUNNING';
CREATE INDEX IF NOT EXISTS runs_holder ON runs (holder_node, holder_instance) WHERE state = 'RUNNING';
CREATE INDEX IF NOT EXISTS runs_claimed ON runs (claimed_at_ms);
