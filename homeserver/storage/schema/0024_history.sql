-- History: events stored behind the room's timeline (backfilled, or fetched to fill a gap
-- as state or auth events) take positions from this counter, negated: -1, -2, ... So
-- /messages reads them, going back, after everything stored before, and /sync, which only
-- reads forward of a token, never sees them.
INSERT INTO stream_positions (stream_name, position) VALUES ('history', 0);
