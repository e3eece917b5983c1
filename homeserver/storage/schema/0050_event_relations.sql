-- Event relationships (client-server spec, "Forming relationships between events"): one row
-- per stored event whose content has `m.relates_to` with a string `rel_type` and `event_id`,
-- written with the event's row (storage/event_rows.py). Soft-failed events and outliers are
-- never shown to clients and have none. A redacted event's row is deleted: its relation
-- stops counting. `thread_root` is the root of an m.thread relation, NULL for the others.
-- Events stored before this migration are indexed by its step (storage/schema_steps.py).
CREATE TABLE event_relations (
    event_id TEXT PRIMARY KEY,
    relates_to_id TEXT NOT NULL,
    rel_type TEXT NOT NULL,
    type TEXT NOT NULL,
    sender TEXT NOT NULL,
    room_id TEXT NOT NULL,
    stream_ordering BIGINT NOT NULL,
    origin_server_ts BIGINT NOT NULL,
    thread_root TEXT
);
CREATE INDEX event_relations_by_parent ON event_relations (relates_to_id, rel_type, stream_ordering);
CREATE INDEX event_relations_threads ON event_relations (room_id, thread_root, stream_ordering);
