-- Redactions (client-server spec, "Redactions"; room versions 3 and later, "Handling
-- redactions"). Every stored m.room.redaction is recorded with the event it names, whether
-- or not that event is here yet: a redaction that arrives before its target applies when the
-- target does. `by_power` is whether the redaction's sender had the room's `redact` level by
-- the redaction's auth events; without it, it applies only to events of its sender's server.
CREATE TABLE redactions (
    redaction_id TEXT PRIMARY KEY,
    redacts TEXT NOT NULL,
    room_id TEXT NOT NULL,
    sender TEXT NOT NULL,
    by_power BOOLEAN NOT NULL
);
CREATE INDEX redactions_by_target ON redactions (redacts);

-- Applied redactions: event -> the redaction that redacted it (the first that applied). Once a
-- row is here, the event's `events.json` holds its redacted PDU (the original is not kept)
-- and `events.unsigned` its `redacted_because`.
CREATE TABLE redacted_events (
    event_id TEXT PRIMARY KEY,
    redacted_by TEXT NOT NULL,
    room_id TEXT NOT NULL,
    redacted_ts BIGINT NOT NULL
);
