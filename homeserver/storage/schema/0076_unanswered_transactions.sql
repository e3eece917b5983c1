-- The transaction a destination was last sent and has not answered yet: its ID and what
-- it carries (JSON lists of federation_outbox stream orderings and federation_edu_outbox
-- ids), cleared when it is answered or has failed. An instance that takes the destination
-- over from one that died in the call sends exactly that again, under that ID
-- (homeserver/federation/sender.py), so the receiver's deduplication by ID holds.
ALTER TABLE federation_destinations ADD COLUMN pending_txn_id BIGINT;
ALTER TABLE federation_destinations ADD COLUMN pending_pdus TEXT;
ALTER TABLE federation_destinations ADD COLUMN pending_edus TEXT;
