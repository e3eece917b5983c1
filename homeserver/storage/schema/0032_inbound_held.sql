-- Received PDUs whose missing prev_events or auth_events could not be fetched yet
-- (homeserver/rooms/held.py): answered as accepted, kept, and retried until stored or too
-- old. One row per (origin, event); `bytes` counts against the origin's staging caps.
CREATE TABLE inbound_held (
    id {serial},
    origin TEXT NOT NULL,
    event_id TEXT NOT NULL,
    txn_id TEXT NOT NULL,        -- the transaction it came in: its staging counts it already
    pdu TEXT NOT NULL,           -- JSON, as received
    source_ip TEXT,
    bytes BIGINT NOT NULL,
    held_ts BIGINT NOT NULL,
    next_try_ts BIGINT NOT NULL,
    tries INTEGER NOT NULL,
    UNIQUE (origin, event_id)
);
CREATE INDEX inbound_held_by_next_try ON inbound_held (next_try_ts);
