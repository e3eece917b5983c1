-- A lease on each appservice's and pusher's queue, as federation_destinations has one
-- (homeserver/storage/leases.py): the instance sending for it, and until when.
ALTER TABLE appservice_state ADD COLUMN lease_owner TEXT;
ALTER TABLE appservice_state ADD COLUMN lease_until_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE pushers ADD COLUMN lease_owner TEXT;
ALTER TABLE pushers ADD COLUMN lease_until_ms BIGINT NOT NULL DEFAULT 0;
-- Typing, receipts and to-device messages an instance received for an appservice another
-- instance holds, handed to the holder (homeserver/appservice/sender.py): gone once in a
-- transaction kept in appservice_state.
CREATE TABLE appservice_handover (
    id {serial},
    appservice_id TEXT NOT NULL,
    section TEXT NOT NULL,
    content TEXT NOT NULL
);
CREATE INDEX appservice_handover_by_appservice ON appservice_handover (appservice_id, id);
