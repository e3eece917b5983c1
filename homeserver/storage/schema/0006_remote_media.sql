-- The remote media cache: other servers' media, fetched once and kept (ADR-0121).
-- Each row describes a file stored under data_dir/media/remote/, at a path derived from the
-- origin and the media id. A row is written only after its file is in place, and never
-- replaced: a copy that can be read is never displaced.
CREATE TABLE remote_media_cache (
    origin TEXT NOT NULL,
    media_id TEXT NOT NULL,
    content_type TEXT NOT NULL,
    upload_name TEXT,
    media_length BIGINT NOT NULL,
    sha256 TEXT NOT NULL,
    fetched_ts BIGINT NOT NULL,
    -- 1: fetched for the authenticated /_matrix/client/v1 API while the freeze of
    -- unauthenticated media is on; the legacy endpoints then do not serve it.
    authenticated INTEGER NOT NULL,
    PRIMARY KEY (origin, media_id)
);
