-- With several instances (cluster.instances > 1), what one instance changes in the others'
-- memory is a row each, taking a position of its own stream; the others read the rows by
-- position when its NOTIFY arrives (sync/cluster.py). A single instance writes none.
-- Typing changes, applied by every instance in position order (sync/typing.py).
CREATE TABLE typing_changes (
    stream_position BIGINT PRIMARY KEY,
    room_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    typing INTEGER NOT NULL,
    timeout_ms BIGINT NOT NULL,
    instance_name TEXT NOT NULL
);
INSERT INTO stream_positions (stream_name, position) VALUES ('typing', 0);
-- Access tokens that stopped working: every instance forgets their cached owners
-- (accounts/tokens.py). A NULL device_id means every token of the user.
CREATE TABLE token_revocations (
    stream_position BIGINT PRIMARY KEY,
    user_id TEXT NOT NULL,
    device_id TEXT
);
INSERT INTO stream_positions (stream_name, position) VALUES ('token_revocations', 0);
-- Until when a user counts as online, whichever instance they sync through (sync/presence.py).
ALTER TABLE presence ADD COLUMN online_until_ms BIGINT NOT NULL DEFAULT 0;
CREATE INDEX presence_online_until ON presence (online_until_ms) WHERE state <> 'offline';
