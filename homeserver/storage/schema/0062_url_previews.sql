-- Link previews (media/preview.py, storage/url_previews.py): each fetch of a URL's preview,
-- kept with its time, so that a client asking for the preview as of a time (`ts`, an
-- event's) gets the one the sender's readers saw, and others the latest while it is fresh.
CREATE TABLE url_previews (
    url TEXT NOT NULL,
    fetched_ts BIGINT NOT NULL,
    expires_ts BIGINT NOT NULL,
    og TEXT NOT NULL                -- the Open Graph object answered, as JSON
);
CREATE INDEX url_previews_by_url ON url_previews (url, fetched_ts);
