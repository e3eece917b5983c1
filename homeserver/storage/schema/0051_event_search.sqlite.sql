-- Full-text search of room events (client-server spec, "Server Side Search"): one row per
-- stored event shown to clients that has a searchable string (m.room.message content.body,
-- m.room.name content.name, m.room.topic content.topic), written with the event's row
-- (storage/event_rows.py); the rowid is the event's stream_ordering. Encrypted events have
-- none; a redaction deletes the row. Older events are indexed by its step
-- (storage/schema_steps.py). PostgreSQL's table is in 0051_event_search.postgres.sql.
CREATE VIRTUAL TABLE event_search USING fts5 (
    event_id UNINDEXED,
    room_id UNINDEXED,
    key UNINDEXED,
    value,
    tokenize = 'porter unicode61'
);
