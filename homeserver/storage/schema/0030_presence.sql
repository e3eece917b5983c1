-- Presence (client-server spec, "Presence"): each user's latest state, ours and other
-- servers' users', one row per user. A change takes the next position of the `presence`
-- stream in the same write (homeserver/storage/presence.py), so /sync reads what changed
-- after its token with a range query.
CREATE TABLE presence (
    user_id TEXT PRIMARY KEY,
    state TEXT NOT NULL,                 -- online, unavailable or offline
    status_msg TEXT,
    last_active_ts BIGINT NOT NULL,
    currently_active INTEGER NOT NULL,   -- 0 or 1
    stream_position BIGINT NOT NULL
);
CREATE INDEX presence_by_position ON presence (stream_position);
INSERT INTO stream_positions (stream_name, position) VALUES ('presence', 0);
