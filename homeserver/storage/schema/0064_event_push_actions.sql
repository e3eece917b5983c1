-- What each stored event means for each local user who could see it, as their push rules
-- decided (sync/push_actions.py), written in the transaction that stores the event: a row
-- only where the actions notify. `thread_id` is the thread root, or "main". Unread counts
-- are the rows after the user's read receipt (storage/push.py), hence the first index;
-- /notifications pages a user's rows newest first, hence the second.
CREATE TABLE event_push_actions (
    user_id TEXT NOT NULL,
    room_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    stream_ordering BIGINT NOT NULL,
    thread_id TEXT NOT NULL,
    notif INTEGER NOT NULL,
    highlight INTEGER NOT NULL,
    actions TEXT NOT NULL,
    PRIMARY KEY (user_id, event_id)
);
CREATE INDEX event_push_actions_unread ON event_push_actions (user_id, room_id, stream_ordering);
CREATE INDEX event_push_actions_by_user ON event_push_actions (user_id, stream_ordering);
