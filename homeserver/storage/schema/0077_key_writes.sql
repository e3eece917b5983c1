-- With several instances, a write of one-time or fallback keys takes a position of this
-- stream, and its NOTIFY tells the others that key counts they read before may be stale
-- (storage/e2ee.py, KEY_WRITES_STREAM). The position is all there is: no rows.
INSERT INTO stream_positions (stream_name, position) VALUES ('key_writes', 0);
