-- End-to-end encryption over federation (storage/e2ee_remote.py).

-- Other servers' users' device lists, as their server last told us (GET /user/devices, then
-- m.device_list_update and m.signing_key_update EDUs applied in order). `stream_id` is the
-- owner's position of the last update applied: an EDU whose prev_id is not it (or an earlier
-- EDU of the same batch) means we missed one, and the list is fetched again.
CREATE TABLE e2e_remote_device_lists (
    user_id TEXT PRIMARY KEY,
    stream_id BIGINT NOT NULL,
    devices TEXT NOT NULL           -- JSON: devices by ID, master_key, self_signing_key
);

-- Our users' device list updates as sent to other servers: the stream_id of the last
-- m.device_list_update sent for the user (the next one's prev_id), and that one's prev_id.
CREATE TABLE e2e_device_list_outbound (
    user_id TEXT PRIMARY KEY,
    stream_id BIGINT NOT NULL,
    prev_id TEXT NOT NULL           -- JSON list
);
