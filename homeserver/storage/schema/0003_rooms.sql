-- Rooms as events: the event graph, current state, memberships and the event stream.

-- Named stream positions. Taking the next position is an UPDATE of the stream's row, which
-- locks it until commit, so positions commit in order: a reader that has seen position N has
-- seen every event at or below N (what /messages and /sync tokens rely on).
CREATE TABLE stream_positions (
    stream_name TEXT PRIMARY KEY,
    position BIGINT NOT NULL
);
INSERT INTO stream_positions (stream_name, position) VALUES ('events', 0);

CREATE TABLE rooms (
    room_id TEXT PRIMARY KEY,
    room_version TEXT NOT NULL,
    creator TEXT NOT NULL,
    created_ts BIGINT NOT NULL
);

-- Every accepted event. `json` is the PDU exactly as signed; the other columns index it.
CREATE TABLE events (
    stream_ordering BIGINT PRIMARY KEY,
    event_id TEXT NOT NULL UNIQUE,
    room_id TEXT NOT NULL REFERENCES rooms(room_id),
    type TEXT NOT NULL,
    state_key TEXT,                 -- NULL for message events
    sender TEXT NOT NULL,
    depth BIGINT NOT NULL,          -- topological ordering
    origin_server_ts BIGINT NOT NULL,
    membership TEXT,                -- content.membership of m.room.member events
    json TEXT NOT NULL,
    unsigned TEXT                   -- prev_content / replaces_state of state events, as JSON
);
CREATE INDEX events_by_room ON events (room_id, stream_ordering);
CREATE INDEX events_by_state ON events (room_id, type, state_key, stream_ordering);

-- Events with no children yet: the prev_events of the room's next event.
CREATE TABLE event_forward_extremities (
    room_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    PRIMARY KEY (room_id, event_id)
);

CREATE TABLE current_state (
    room_id TEXT NOT NULL,
    type TEXT NOT NULL,
    state_key TEXT NOT NULL,
    event_id TEXT NOT NULL,
    membership TEXT,
    PRIMARY KEY (room_id, type, state_key)
);
CREATE INDEX current_state_by_member ON current_state (state_key, type, membership);

-- Client transaction IDs: one per device and request path (room, event type, txn id).
CREATE TABLE event_txn_ids (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    room_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    txn_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    created_ts BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id, room_id, event_type, txn_id)
);
CREATE INDEX event_txn_ids_by_event ON event_txn_ids (event_id);

-- What a room directory shows, kept current as state events are persisted.
CREATE TABLE room_stats (
    room_id TEXT PRIMARY KEY REFERENCES rooms(room_id),
    joined_members INTEGER NOT NULL DEFAULT 0,
    invited_members INTEGER NOT NULL DEFAULT 0,
    name TEXT,
    topic TEXT,
    canonical_alias TEXT,
    avatar_url TEXT,
    join_rule TEXT,
    history_visibility TEXT,
    guest_access TEXT,
    room_type TEXT
);

-- The joined member count after each change of it, by event stream position: the public room
-- list orders a paging session by the counts at the position its first page was read at.
CREATE TABLE room_joined_count_history (
    room_id TEXT NOT NULL,
    stream_ordering BIGINT NOT NULL,
    joined_members INTEGER NOT NULL,
    PRIMARY KEY (room_id, stream_ordering)
);
