-- Inbound transactions answered 200 before their PDUs were applied (homeserver/rooms/staging.py):
-- kept until applied, so a restart resumes them. One row per transaction, in arrival order;
-- `pdus` and `bytes` are what the per-origin caps count.
CREATE TABLE inbound_staging (
    id {serial},
    origin TEXT NOT NULL,
    txn_id TEXT NOT NULL,
    body TEXT NOT NULL,          -- JSON: the PDUs, the results decided, source IP and EDUs
    pdus INTEGER NOT NULL,
    bytes BIGINT NOT NULL,
    staged_ts BIGINT NOT NULL,
    UNIQUE (origin, txn_id)
);
CREATE INDEX inbound_staging_by_origin ON inbound_staging (origin, id);
