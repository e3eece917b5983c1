-- Accounts: users, devices and access tokens. Passwords and tokens are stored hashed only.
CREATE TABLE users (
    user_id TEXT PRIMARY KEY,
    password_hash TEXT,
    admin INTEGER NOT NULL DEFAULT 0,
    created_ts BIGINT NOT NULL,
    deactivated INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE devices (
    user_id TEXT NOT NULL REFERENCES users(user_id),
    device_id TEXT NOT NULL,
    display_name TEXT,
    created_ts BIGINT NOT NULL,
    last_seen_ts BIGINT,
    PRIMARY KEY (user_id, device_id)
);

CREATE TABLE access_tokens (
    token_hash TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users(user_id),
    device_id TEXT NOT NULL,
    created_ts BIGINT NOT NULL
);
CREATE INDEX access_tokens_by_device ON access_tokens (user_id, device_id);
