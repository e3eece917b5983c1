-- The auth chain index (storage/auth_chains.py): "auth difference" without walking chains.
-- Each state event sits at (chain_id, seq) on one chain of its room's auth graph, and every
-- event lower on that chain is in its auth chain. A link says that the event at
-- (origin_chain, origin_seq) has the one at (target_chain, target_seq) in its auth chain,
-- and so every event below that one on its chain. Messages are never indexed: they are in
-- no state set and no auth chain. storage/schema_steps.py indexes the events stored before.
CREATE TABLE event_auth_positions (
    event_id TEXT PRIMARY KEY,
    chain_id BIGINT NOT NULL,
    seq INTEGER NOT NULL
);
CREATE UNIQUE INDEX event_auth_positions_by_chain ON event_auth_positions (chain_id, seq);

CREATE TABLE auth_chain_links (
    origin_chain BIGINT NOT NULL,
    origin_seq INTEGER NOT NULL,
    target_chain BIGINT NOT NULL,
    target_seq INTEGER NOT NULL
);
CREATE INDEX auth_chain_links_by_origin ON auth_chain_links (origin_chain, origin_seq);

-- Chain IDs are taken from this counter, a block per write.
INSERT INTO stream_positions (stream_name, position) VALUES ('auth_chains', 0);
