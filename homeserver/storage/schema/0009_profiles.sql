-- User profiles: one row per field (displayname, avatar_url, m.tz or a namespaced custom key).
CREATE TABLE profile_fields (
    user_id TEXT NOT NULL REFERENCES users(user_id),
    field TEXT NOT NULL,
    value TEXT NOT NULL,            -- JSON value
    PRIMARY KEY (user_id, field)
);
