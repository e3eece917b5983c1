-- The federation sender's queue: one row per PDU still owed to a destination. Rows are written
-- in the same transaction as the event (homeserver/storage/rooms.py, persist_events), so an
-- event is queued before its client gets 200, and a row goes only once the destination
-- answered 200 to a transaction holding it. PDUs go out in stream order.
CREATE TABLE federation_outbox (
    destination TEXT NOT NULL,
    stream_ordering BIGINT NOT NULL,
    event_id TEXT NOT NULL,
    room_id TEXT NOT NULL,
    PRIMARY KEY (destination, stream_ordering)
);
CREATE INDEX federation_outbox_by_room ON federation_outbox (destination, room_id, stream_ordering);

-- One row per destination the sender has known: the next transaction ID (taken in the database,
-- so an ID is never reused, across restarts too), the backoff after failures, and a lease, so
-- that with several instances on one database exactly one sends to a destination.
CREATE TABLE federation_destinations (
    destination TEXT PRIMARY KEY,
    next_txn_id BIGINT NOT NULL DEFAULT 1,
    retry_interval_ms BIGINT NOT NULL DEFAULT 0,    -- 0: the last attempt succeeded
    retry_at_ms BIGINT NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_until_ms BIGINT NOT NULL DEFAULT 0
);
