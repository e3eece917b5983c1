-- The media repository: metadata of local uploads, and what the thumbnailer made and learned.
-- The files themselves live under data_dir/media, at paths derived from the media id.

-- One row per local mxc:// URI. media_length is NULL while an async upload (/create) waits
-- for its content; the content's columns are filled in when it arrives.
CREATE TABLE local_media (
    media_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    content_type TEXT,
    upload_name TEXT,
    media_length BIGINT,
    sha256 TEXT,
    created_ts BIGINT NOT NULL,
    uploaded_ts BIGINT,
    -- 1: stored after the freeze of unauthenticated media; the legacy endpoints refuse it.
    authenticated INTEGER NOT NULL
);
CREATE INDEX local_media_pending_by_user ON local_media (user_id, created_ts)
    WHERE media_length IS NULL;

-- What probing an original found, once per file: its size after EXIF orientation and whether
-- it is animated, or why it cannot be thumbnailed ('too_large', 'not_an_image').
-- origin is the server name of the mxc:// URI, ours for local media.
CREATE TABLE thumbnail_sources (
    origin TEXT NOT NULL,
    media_id TEXT NOT NULL,
    width INTEGER,
    height INTEGER,
    animated INTEGER NOT NULL DEFAULT 0,
    refusal TEXT,
    PRIMARY KEY (origin, media_id)
);

-- Thumbnails stored on disk: the pre-generated sizes and those made on demand.
CREATE TABLE thumbnails (
    origin TEXT NOT NULL,
    media_id TEXT NOT NULL,
    width INTEGER NOT NULL,
    height INTEGER NOT NULL,
    method TEXT NOT NULL,
    content_type TEXT NOT NULL,
    animated INTEGER NOT NULL,
    length BIGINT NOT NULL,
    created_ts BIGINT NOT NULL,
    PRIMARY KEY (origin, media_id, width, height, method, content_type, animated)
);
