-- What /sync serves besides room events: stored filters, account data and read receipts, and
-- the streams their parts of a sync token are positions in (see storage/sync.py).

-- Positions in these streams are taken like event positions (storage/streams.py), so a sync
-- token that has seen position N of a stream has seen everything at or below N in it.
INSERT INTO stream_positions (stream_name, position) VALUES ('account_data', 0);
INSERT INTO stream_positions (stream_name, position) VALUES ('receipts', 0);

-- A filter is stored once per user and content: uploading the same filter again returns
-- the same ID. The hash stands in for the JSON in the unique index (JSON can be long).
CREATE TABLE user_filters (
    filter_id {serial},
    user_id TEXT NOT NULL,
    filter_hash TEXT NOT NULL,      -- sha256 hex of filter_json
    filter_json TEXT NOT NULL,      -- canonical JSON: sorted keys, no spaces
    created_ts BIGINT NOT NULL
);
CREATE UNIQUE INDEX user_filters_by_content ON user_filters (user_id, filter_hash);

-- The latest content of each account data type, global (room_id = '') or per room.
CREATE TABLE account_data (
    user_id TEXT NOT NULL,
    room_id TEXT NOT NULL,
    type TEXT NOT NULL,
    content TEXT NOT NULL,          -- JSON object
    stream_position BIGINT NOT NULL,
    PRIMARY KEY (user_id, room_id, type)
);
CREATE INDEX account_data_by_position ON account_data (user_id, stream_position);

-- The latest receipt of each user, per room, receipt type and thread ('' = unthreaded).
CREATE TABLE receipts (
    room_id TEXT NOT NULL,
    receipt_type TEXT NOT NULL,     -- m.read or m.read.private
    user_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    event_stream_ordering BIGINT NOT NULL,  -- receipts only move forward in the room
    ts BIGINT NOT NULL,
    stream_position BIGINT NOT NULL,
    PRIMARY KEY (room_id, receipt_type, user_id, thread_id)
);
CREATE INDEX receipts_by_position ON receipts (room_id, stream_position);
