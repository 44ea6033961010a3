-- One row per sidecar instance: its liveness counter, raised every
-- expiry/4 while the instance can reach this store. A claim may take over
-- an expired holder's run early only if the counter it observed unchanged
-- for one expiry is still the value here, checked under the write lock
-- (docs/safety.md). updated_at_ms is for pruning only, never for a decision.
CREATE TABLE IF NOT EXISTS liveness (
    node          TEXT    NOT NULL,
    instance      INTEGER NOT NULL,
    counter       INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (node, instance)
) WITHOUT ROWID;
