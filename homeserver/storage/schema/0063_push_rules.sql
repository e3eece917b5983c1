-- Users' push rules (client-server spec, "Push Rules"), merged with the server defaults
-- (sync/push_rules.py) when read. `push_rules` holds the rules a user made: `priority`
-- orders them within their kind (0 first), `conditions` is a JSON list for override and
-- underride rules, `pattern` a content rule's glob; room and sender rules have neither
-- (their rule_id is the room or the sender). `push_rule_defaults` holds what a user changed
-- of a server default: NULL keeps the default's own value.
CREATE TABLE push_rules (
    user_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    rule_id TEXT NOT NULL,
    priority INTEGER NOT NULL,
    conditions TEXT,
    pattern TEXT,
    actions TEXT NOT NULL,
    enabled INTEGER NOT NULL,
    PRIMARY KEY (user_id, kind, rule_id)
);

CREATE TABLE push_rule_defaults (
    user_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    rule_id TEXT NOT NULL,
    enabled INTEGER,
    actions TEXT,
    PRIMARY KEY (user_id, kind, rule_id)
);
