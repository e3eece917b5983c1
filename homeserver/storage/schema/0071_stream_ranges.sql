-- Other instances' writes are read by stream position alone when their NOTIFY arrives
-- (storage/stream_changes.py); these tables were indexed by room or user first.
CREATE INDEX receipts_by_stream_position ON receipts (stream_position);
CREATE INDEX account_data_by_stream_position ON account_data (stream_position);
CREATE INDEX to_device_by_stream_position ON to_device_messages (stream_position);
CREATE INDEX remote_invites_by_stream_ordering ON remote_invites (stream_ordering);
