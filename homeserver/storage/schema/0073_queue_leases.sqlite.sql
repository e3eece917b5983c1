-- A lease on each appservice's and pusher's queue, as federation_destinations has one
-- (homeserver/storage/leases.py): the instance sending for it, and until when.
ALTER TABLE appservice_state ADD COLUMN lease_owner TEXT;
ALTER TABLE appservice_state ADD COLUMN lease_until_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE pushers ADD COLUMN lease_owner TEXT;
ALTER TABLE pushers ADD COLUMN lease_until_ms BIGINT NOT NULL DEFAULT 0;
