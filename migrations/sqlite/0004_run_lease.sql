-- The lease a run was claimed with, so that a renew without a lease keeps it
-- (issue 21). Written at every win (the claim's lease_until_ms - claimed_at_ms);
-- 0 for runs claimed before this migration, which then fall back to their
-- first lease.
ALTER TABLE runs ADD COLUMN lease_ms INTEGER NOT NULL DEFAULT 0;
