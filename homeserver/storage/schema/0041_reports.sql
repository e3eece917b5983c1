-- Content reports for the server's admins (client-server spec, "Reporting content"): an
-- event, a room or a user, reported by a local user. Kept until an admin deals with them
-- (the admin API that lists them is another change; storage/reports.py reads them).
CREATE TABLE reports (
    id {serial},
    reporter TEXT NOT NULL,         -- the local user who reported
    kind TEXT NOT NULL,             -- 'event', 'room' or 'user'
    room_id TEXT,                   -- an event's room, or the room reported
    event_id TEXT,                  -- the event reported
    target_user_id TEXT,            -- the user reported
    reason TEXT,                    -- as the reporter wrote it, at most 1000 characters
    score INTEGER,                  -- an event report's score, -100 (worst) to 0, if given
    received_ts BIGINT NOT NULL
);
CREATE INDEX reports_by_time ON reports (received_ts, id);
