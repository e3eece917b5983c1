-- Simplified sliding sync (MSC4186) connections: what each connection of a device was last
-- sent, so a request with its `pos` answers only what changed since, after a restart too
-- (storage/sliding_sync.py, sync/sliding.py).
CREATE TABLE sliding_sync_connections (
    id {serial},
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    conn_id TEXT NOT NULL,          -- the client's name for the connection, "" if none
    generation BIGINT NOT NULL,     -- the latest generation of its entries handed out
    last_used_ts BIGINT NOT NULL
);
CREATE UNIQUE INDEX sliding_sync_connections_by_key
    ON sliding_sync_connections (user_id, device_id, conn_id);
CREATE INDEX sliding_sync_connections_by_use ON sliding_sync_connections (last_used_ts);
-- A connection's entries, written at the generation that changed them: the state at
-- generation G is, per (kind, room_id), the row of the highest generation <= G. Rows past
-- a pos the client came back with were never acknowledged and are dropped then.
CREATE TABLE sliding_sync_entries (
    connection_id BIGINT NOT NULL REFERENCES sliding_sync_connections(id) ON DELETE CASCADE,
    generation BIGINT NOT NULL,
    kind TEXT NOT NULL,             -- 'room': what was sent of it; 'sub': a room subscription
    room_id TEXT NOT NULL,
    value TEXT,                     -- JSON; NULL: removed at this generation
    PRIMARY KEY (connection_id, kind, room_id, generation)
);
