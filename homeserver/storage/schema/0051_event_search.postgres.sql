-- Full-text search of room events: as 0051_event_search.sqlite.sql, with a tsvector per
-- row (English stemming, like SQLite's porter tokenizer) under a GIN index.
CREATE TABLE event_search (
    stream_ordering BIGINT PRIMARY KEY,
    event_id TEXT NOT NULL,
    room_id TEXT NOT NULL,
    key TEXT NOT NULL,
    vector TSVECTOR NOT NULL
);
CREATE INDEX event_search_fts ON event_search USING GIN (vector);
