-- Inbound federation transactions (PUT /_matrix/federation/v1/send/<txnId>) already answered,
-- with the answer given: a sender's retry of the same (origin, txn_id) gets the same answer
-- and nothing is applied twice. Rows older than a day are pruned as new ones arrive.
CREATE TABLE received_transactions (
    origin TEXT NOT NULL,
    txn_id TEXT NOT NULL,
    response_json TEXT NOT NULL,
    received_ts BIGINT NOT NULL,
    PRIMARY KEY (origin, txn_id)
);
CREATE INDEX received_transactions_by_age ON received_transactions (received_ts);
