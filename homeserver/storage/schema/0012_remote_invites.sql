-- Invites of our users to rooms this server is not in (PUT /_matrix/federation/v2/invite):
-- the invite event as we counter-signed it and the stripped state the inviting server sent,
-- for /sync's rooms.invite. `stream_ordering` is a position of the events stream, so a sync
-- token covers it like any room event; a later member event of the user in the room
-- (a join, or a rejection) supersedes the row.
CREATE TABLE remote_invites (
    room_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    room_version TEXT NOT NULL,
    membership TEXT NOT NULL,        -- 'invite', or 'leave' once rejected or retracted
    event_json TEXT NOT NULL,
    invite_room_state TEXT NOT NULL, -- JSON list of stripped state events
    stream_ordering BIGINT NOT NULL,
    PRIMARY KEY (room_id, user_id)
);
CREATE INDEX remote_invites_by_user ON remote_invites (user_id);
