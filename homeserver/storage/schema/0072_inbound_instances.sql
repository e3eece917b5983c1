-- Staged transactions and held PDUs belong to the instance that took them
-- (storage/transactions.py): with several instances on one database each applies and
-- retries its own, so no two apply one at once. One instance is named "main" by default.
ALTER TABLE inbound_staging ADD COLUMN instance_name TEXT NOT NULL DEFAULT 'main';
ALTER TABLE inbound_held ADD COLUMN instance_name TEXT NOT NULL DEFAULT 'main';
