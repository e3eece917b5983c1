-- End-to-end encryption: device keys, one-time and fallback keys, cross-signing keys and
-- their signatures, the device list stream and to-device messages (storage/e2ee.py).

-- A user's device list changes (device keys uploaded, a device deleted, cross-signing keys
-- replaced) take a position in this stream; sync tokens and /keys/changes read it.
INSERT INTO stream_positions (stream_name, position) VALUES ('device_lists', 0);
-- Every to-device message takes a position here; a sync token acknowledges up to one.
INSERT INTO stream_positions (stream_name, position) VALUES ('to_device', 0);

CREATE TABLE e2e_device_keys (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    key_json TEXT NOT NULL,         -- the signed object as uploaded
    PRIMARY KEY (user_id, device_id)
);

CREATE TABLE e2e_one_time_keys (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    key_id TEXT NOT NULL,
    key_json TEXT NOT NULL,         -- a JSON string or a signed object
    PRIMARY KEY (user_id, device_id, algorithm, key_id)
);

-- One fallback key per device and algorithm; handed out (and marked used) only when no
-- one-time key is left.
CREATE TABLE e2e_fallback_keys (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    key_id TEXT NOT NULL,
    key_json TEXT NOT NULL,
    used INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, device_id, algorithm)
);

CREATE TABLE e2e_cross_signing_keys (
    user_id TEXT NOT NULL,
    key_type TEXT NOT NULL,         -- master, self_signing or user_signing
    key_json TEXT NOT NULL,
    PRIMARY KEY (user_id, key_type)
);

-- Signatures uploaded with /keys/signatures/upload, on a device key (target_key_id is the
-- device ID) or a cross-signing key (its public key).
CREATE TABLE e2e_signatures (
    target_user_id TEXT NOT NULL,
    target_key_id TEXT NOT NULL,
    signer_user_id TEXT NOT NULL,
    signer_key_id TEXT NOT NULL,    -- ed25519:<device ID or public key>
    signature TEXT NOT NULL,
    PRIMARY KEY (target_user_id, target_key_id, signer_user_id, signer_key_id)
);

CREATE TABLE device_list_changes (
    stream_position BIGINT NOT NULL,
    user_id TEXT NOT NULL,
    PRIMARY KEY (stream_position, user_id)
);
CREATE INDEX device_list_changes_by_user ON device_list_changes (user_id, stream_position);

CREATE TABLE to_device_messages (
    stream_position BIGINT NOT NULL,
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    sender TEXT NOT NULL,
    type TEXT NOT NULL,
    content TEXT NOT NULL,          -- JSON object
    PRIMARY KEY (user_id, device_id, stream_position)
);

-- A sender's transaction IDs, per device: a retried PUT /sendToDevice stores nothing twice.
CREATE TABLE to_device_txns (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    txn_id TEXT NOT NULL,
    created_ts BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id, txn_id)
);
