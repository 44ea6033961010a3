-- One row per sidecar instance: its liveness counter, raised every
-- expiry/4 while the instance can reach the database. A claim may take over
-- an expired holder's run early only if the counter it observed unchanged
-- for one expiry is still the value here, read FOR SHARE under the job's
-- lock, so no refresh commits between the check and the takeover
-- (docs/safety.md). updated_at_ms is for pruning only, never for a decision.
CREATE TABLE IF NOT EXISTS {prefix}_liveness (
    node          TEXT   NOT NULL,
    instance      BIGINT NOT NULL,
    counter       BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    PRIMARY KEY (node, instance)
);
