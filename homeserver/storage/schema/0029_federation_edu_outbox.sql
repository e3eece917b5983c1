-- EDUs other servers must not miss (to-device messages, device list and signing key updates),
-- queued in the transaction of the local write that made them (homeserver/storage/outbox.py,
-- queue_edus), so a restart loses none. A row goes once its destination answered 200 to a
-- transaction holding it, or once it was refused too often. They go out in `id` order.
-- Typing and receipts are ephemeral and stay in the sender's memory.
CREATE TABLE federation_edu_outbox (
    id {serial},
    destination TEXT NOT NULL,
    edu_type TEXT NOT NULL,
    content TEXT NOT NULL,
    refusals INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX federation_edu_outbox_by_destination ON federation_edu_outbox (destination, id);
