-- The room's current state (the resolved state of its forward extremities) as it became at
-- a stream position: a row wherever an event changed it. Reading the state "at position P"
-- takes the latest row at or before P, so /sync and /messages show the resolved state
-- rather than the latest state event by stream order. Positions before a room's first row
-- (events stored before this table) are read by stream order, as before.
CREATE TABLE room_state_positions (
    room_id TEXT NOT NULL,
    stream_ordering BIGINT NOT NULL,
    state_group BIGINT NOT NULL,
    PRIMARY KEY (room_id, stream_ordering)
);
