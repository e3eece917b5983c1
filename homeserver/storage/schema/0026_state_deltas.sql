-- State groups become deltas (storage/event_state.py): a group names the group it differs
-- from and holds only the keys that differ (a removed key has no event_id). A chain is at
-- most 100 groups long; the next group is written whole. storage/schema_steps.py then
-- rewrites the groups stored as whole JSON maps and drops their `state` column.
ALTER TABLE state_groups ADD COLUMN prev_state_group BIGINT;
ALTER TABLE state_groups ADD COLUMN chain_length INTEGER NOT NULL DEFAULT 0;

CREATE TABLE state_group_entries (
    state_group BIGINT NOT NULL,
    type TEXT NOT NULL,
    state_key TEXT NOT NULL,
    event_id TEXT,
    PRIMARY KEY (state_group, type, state_key)
);
