-- Outliers: events known for the room's graph and state but not part of its timeline (a
-- send_join answer's state and auth chain). Unlike soft-failed events they are valid state
-- (a user's membership, the room's history visibility); like them, /messages and /sync
-- never show them. They take history positions (0024_history.sql), below the timeline.
ALTER TABLE events ADD COLUMN outlier SMALLINT NOT NULL DEFAULT 0;
