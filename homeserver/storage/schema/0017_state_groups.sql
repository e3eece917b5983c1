-- The state of a room at each event, for state resolution (rooms/state_res.py).

-- A whole state map as JSON, keyed by type and state_key joined with a NUL. Events with the same state after
-- them share one group.
CREATE TABLE state_groups (
    state_group {serial},
    room_id TEXT NOT NULL,
    state TEXT NOT NULL
);

-- The state after an event. No row: the event came without its state (the auth chain of a
-- send_join answer) or was stored before this table; its state is then read by stream
-- order, as before.
CREATE TABLE event_state_groups (
    event_id TEXT PRIMARY KEY,
    room_id TEXT NOT NULL,
    state_group BIGINT NOT NULL
);

-- Soft-failed events (they passed auth against the state before them, not against the
-- current state): stored for the graph, never shown to clients, never an extremity.
ALTER TABLE events ADD COLUMN soft_failed SMALLINT NOT NULL DEFAULT 0;

-- PDUs rejected by the auth rules, remembered so that they are not fetched or checked again.
CREATE TABLE rejected_events (
    event_id TEXT PRIMARY KEY,
    room_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    rejected_ts BIGINT NOT NULL
);
