-- Server-side key backups (client-server spec, "Server-side key backups"): numbered backup
-- versions per user, each with its auth_data, and the encrypted megolm session keys stored
-- in it. The server never reads session_data and never checks auth_data's signatures.

-- One row per user who has written to the key backup API: the last version number handed
-- out, so a deleted version's number is never reused (and a client that names it hears it
-- was deleted, not that it never was). Every write takes this row first: on PostgreSQL that
-- row lock makes one user's backup writes run one at a time, as SQLite's one writer does.
CREATE TABLE key_backup_users (
    user_id TEXT PRIMARY KEY REFERENCES users(user_id),
    last_version BIGINT NOT NULL
);

-- Live versions; a deleted version's row is gone, with its keys. The highest is current.
CREATE TABLE key_backup_versions (
    user_id TEXT NOT NULL REFERENCES key_backup_users(user_id),
    version BIGINT NOT NULL,
    algorithm TEXT NOT NULL,
    auth_data TEXT NOT NULL,          -- JSON object, opaque to the server
    etag BIGINT NOT NULL,             -- moves whenever the version's keys change
    key_count BIGINT NOT NULL,        -- rows in key_backup_keys for this version
    PRIMARY KEY (user_id, version)
);

CREATE TABLE key_backup_keys (
    user_id TEXT NOT NULL,
    version BIGINT NOT NULL,
    room_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    first_message_index BIGINT NOT NULL,
    forwarded_count BIGINT NOT NULL,
    is_verified INTEGER NOT NULL,     -- 0 or 1
    session_data TEXT NOT NULL,       -- JSON object, encrypted by the client
    PRIMARY KEY (user_id, version, room_id, session_id),
    FOREIGN KEY (user_id, version) REFERENCES key_backup_versions (user_id, version)
        ON DELETE CASCADE
);
