-- Other servers' signing keys, as the keyring fetched and verified them.
-- A current key (verify_keys) is usable for signatures made up to valid_until_ts; an old one
-- (old_verify_keys) has expired_ts set, and valid_until_ts equal to it.
CREATE TABLE server_signing_keys (
    server_name TEXT NOT NULL,
    key_id TEXT NOT NULL,
    verify_key TEXT NOT NULL,
    valid_until_ts BIGINT NOT NULL,
    expired_ts BIGINT,
    fetched_ts BIGINT NOT NULL,
    PRIMARY KEY (server_name, key_id)
);

-- The latest key document of each server, exactly as its origin signed it (canonical JSON),
-- which the notary endpoints serve with our signature added.
CREATE TABLE server_key_documents (
    server_name TEXT PRIMARY KEY,
    valid_until_ts BIGINT NOT NULL,
    key_json TEXT NOT NULL,
    fetched_ts BIGINT NOT NULL
);
