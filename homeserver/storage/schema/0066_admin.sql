-- What server admins decide (homeserver/admin/): rooms no local user may join again, and
-- media no one may download again.
CREATE TABLE blocked_rooms (
    room_id TEXT PRIMARY KEY,
    blocked_by TEXT NOT NULL,
    blocked_ts BIGINT NOT NULL
);

CREATE TABLE quarantined_media (
    origin TEXT NOT NULL,
    media_id TEXT NOT NULL,
    quarantined_by TEXT NOT NULL,
    quarantined_ts BIGINT NOT NULL,
    PRIMARY KEY (origin, media_id)
);
