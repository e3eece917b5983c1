-- Application services' queues (homeserver/appservice/sender.py). The events stream is the
-- queue: every event is already stored with its stream position in the write that made it,
-- so an appservice needs only how far it has been served. `stream_position` moves only once
-- the appservice answered 200 to the transaction carrying the events up to it. The transaction
-- being delivered is kept whole (`pending_*`), so after a failure or a restart the same
-- txnId is sent again with the same events until it is answered.
CREATE TABLE appservice_state (
    appservice_id TEXT PRIMARY KEY,
    stream_position BIGINT NOT NULL,
    next_txn_id BIGINT NOT NULL DEFAULT 1,
    pending_txn_id BIGINT,
    pending_up_to BIGINT,
    pending_body TEXT,
    retry_interval_ms BIGINT NOT NULL DEFAULT 0
);
