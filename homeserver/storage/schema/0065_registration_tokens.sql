-- Registration tokens (client-server spec, "Token-authenticated registration"), made by the
-- server's admins. `pending` counts UIA sessions that passed the token stage and have not
-- registered yet; `completed` counts registrations. A token is valid while
-- pending + completed < uses_allowed (no cap when NULL) and expiry_time (ms) is ahead.
CREATE TABLE registration_tokens (
    token TEXT PRIMARY KEY,
    uses_allowed INTEGER,
    pending INTEGER NOT NULL DEFAULT 0,
    completed INTEGER NOT NULL DEFAULT 0,
    expiry_time BIGINT
);

-- The session that passed the token stage, and when: registering completes it, and one
-- older than a session's life gives its pending use back.
CREATE TABLE registration_token_sessions (
    session TEXT PRIMARY KEY,
    token TEXT NOT NULL,
    created_ts BIGINT NOT NULL
);
CREATE INDEX registration_token_sessions_by_time ON registration_token_sessions (created_ts);
