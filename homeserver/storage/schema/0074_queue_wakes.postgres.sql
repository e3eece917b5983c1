-- Another instance's events are read by position when its NOTIFY arrives, to wake the
-- queues this instance holds (homeserver/runtime/queues.py): which destinations and which
-- users' pushers they concern. Only several instances read them, and those are on
-- PostgreSQL.
CREATE INDEX federation_outbox_by_stream_ordering ON federation_outbox (stream_ordering);
CREATE INDEX event_push_actions_by_stream_ordering ON event_push_actions (stream_ordering);
