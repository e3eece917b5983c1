-- Jump to date (timestamp_to_event): the room's event closest to a time is one index probe,
-- not a scan of the room.
CREATE INDEX events_by_room_ts ON events (room_id, origin_server_ts);
