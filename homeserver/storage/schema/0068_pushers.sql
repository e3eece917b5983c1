-- Users' pushers (client-server spec, "Push Notifications"): one per (user, app_id,
-- pushkey). `data` is the client's JSON object, `url` included. `position` is the last
-- `event_push_actions.stream_ordering` sent to the gateway (sync/push_sender.py): rows after
-- it are owed, so a restart resends nothing sent and loses nothing owed. A new pusher starts
-- at the events stream's end. `retry_interval_ms` is the current backoff, 0 when none.
CREATE TABLE pushers (
    user_id TEXT NOT NULL,
    app_id TEXT NOT NULL,
    pushkey TEXT NOT NULL,
    kind TEXT NOT NULL,
    app_display_name TEXT NOT NULL,
    device_display_name TEXT NOT NULL,
    profile_tag TEXT,
    lang TEXT NOT NULL,
    data TEXT NOT NULL,
    pushkey_ts BIGINT NOT NULL,
    position BIGINT NOT NULL,
    retry_interval_ms BIGINT NOT NULL,
    PRIMARY KEY (user_id, app_id, pushkey)
);
-- `append: false` removes other users' pushers with the same app_id and pushkey.
CREATE INDEX pushers_by_key ON pushers (app_id, pushkey);
