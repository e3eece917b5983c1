"""Push rules, push actions and what they count (client-server spec, "Push Notifications").

`push_rules` and `push_rule_defaults` (0063) keep what each user made or changed of their
rules; `event_push_actions` (0064) what each event meant for each local user, written in the
transaction that stores the event (`insert_push_actions`, an extra write of
`RoomStore.persist_events`). Unread counts are those rows after the user's read receipt."""

from __future__ import annotations

import json
from dataclasses import dataclass

from homeserver.storage.database import Database, in_lists
from homeserver.storage.rooms import StoredEvent, _stored

# Receipts that mark a user's reading (not m.fully_read, a marker of its own).
READ_RECEIPTS = ("m.read", "m.read.private")
MAIN_THREAD = "main"


@dataclass(frozen=True)
class UserRule:
    kind: str
    rule_id: str
    conditions: list | None
    pattern: str | None
    actions: list
    enabled: bool


@dataclass(frozen=True)
class UserRules:
    """A user's own rules, in priority order per kind, and their changes to the defaults:
    {(kind, rule_id): (enabled or None, actions or None)}."""

    rules: tuple[UserRule, ...] = ()
    defaults: dict | None = None


@dataclass(frozen=True)
class PushAction:
    user_id: str
    event_id: str
    thread_id: str
    highlight: bool
    actions: list


@dataclass(frozen=True)
class Notification:
    stored: StoredEvent
    room_id: str
    actions: list
    read: bool


def _dumps(value) -> str:
    return json.dumps(value, separators=(",", ":"))


class PushStore:
    def __init__(self, db: Database):
        self.db = db

    # --- rules ------------------------------------------------------------------------

    def rules_of(self, user_ids: list[str]) -> dict[str, UserRules]:
        """Each user's rules; users with none are left out."""
        found: dict[str, tuple[list, dict]] = {}

        def read(tx) -> None:
            for chunk, marks in in_lists(user_ids):
                for r in tx.fetchall(
                    "SELECT user_id, kind, rule_id, conditions, pattern, actions, enabled"
                    f" FROM push_rules WHERE user_id IN ({marks}) ORDER BY user_id, priority",
                    chunk,
                ):
                    rule = UserRule(r[1], r[2], _loads(r[3]), r[4], json.loads(r[5]), bool(r[6]))
                    found.setdefault(r[0], ([], {}))[0].append(rule)
                for r in tx.fetchall(
                    "SELECT user_id, kind, rule_id, enabled, actions FROM push_rule_defaults"
                    f" WHERE user_id IN ({marks})",
                    chunk,
                ):
                    enabled = None if r[3] is None else bool(r[3])
                    found.setdefault(r[0], ([], {}))[1][(r[1], r[2])] = (enabled, _loads(r[4]))

        self.db.read(read)
        return {u: UserRules(tuple(rules), defaults) for u, (rules, defaults) in found.items()}

    def put_rule(self, user_id: str, rule: UserRule, before: str | None, after: str | None) -> bool:
        """Adds or replaces a rule, placed just before `before` or just after `after`
        (user rules of its kind), first among them when new and neither is given, where it
        was otherwise. Returns False, writing nothing, when the rule named is not there."""

        def write(tx) -> bool:
            order = [
                r[0]
                for r in tx.fetchall(
                    "SELECT rule_id FROM push_rules WHERE user_id = ? AND kind = ?"
                    " ORDER BY priority",
                    (user_id, rule.kind),
                )
            ]
            existed = rule.rule_id in order
            anchor = before or after
            if anchor is not None:
                if anchor == rule.rule_id or anchor not in order:
                    return False
                if existed:
                    order.remove(rule.rule_id)
                order.insert(order.index(anchor) + (1 if before is None else 0), rule.rule_id)
            elif not existed:
                order.insert(0, rule.rule_id)
            tx.execute(
                "DELETE FROM push_rules WHERE user_id = ? AND kind = ? AND rule_id = ?",
                (user_id, rule.kind, rule.rule_id),
            )
            tx.execute(
                "INSERT INTO push_rules (user_id, kind, rule_id, priority, conditions, pattern,"
                " actions, enabled) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    user_id,
                    rule.kind,
                    rule.rule_id,
                    0,
                    None if rule.conditions is None else _dumps(rule.conditions),
                    rule.pattern,
                    _dumps(rule.actions),
                    int(rule.enabled),
                ),
            )
            for priority, rule_id in enumerate(order):
                tx.execute(
                    "UPDATE push_rules SET priority = ? WHERE user_id = ? AND kind = ?"
                    " AND rule_id = ?",
                    (priority, user_id, rule.kind, rule_id),
                )
            return True

        return self.db.write(write)

    def delete_rule(self, user_id: str, kind: str, rule_id: str) -> bool:
        """Whether there was such a rule."""
        return self.db.write(
            lambda tx: (
                tx.fetchone(
                    "DELETE FROM push_rules WHERE user_id = ? AND kind = ? AND rule_id = ?"
                    " RETURNING rule_id",
                    (user_id, kind, rule_id),
                )
                is not None
            )
        )

    def set_rule_field(self, user_id: str, kind: str, rule_id: str, field: str, value) -> bool:
        """Sets `enabled` or `actions` of a user rule; whether there was such a rule."""
        column = {"enabled": "enabled", "actions": "actions"}[field]
        stored = int(value) if field == "enabled" else _dumps(value)
        return self.db.write(
            lambda tx: (
                tx.fetchone(
                    f"UPDATE push_rules SET {column} = ? WHERE user_id = ? AND kind = ?"
                    " AND rule_id = ? RETURNING rule_id",
                    (stored, user_id, kind, rule_id),
                )
                is not None
            )
        )

    def set_default_field(self, user_id: str, kind: str, rule_id: str, field: str, value) -> None:
        """Sets the user's `enabled` or `actions` of a server default rule."""
        column = {"enabled": "enabled", "actions": "actions"}[field]
        stored = int(value) if field == "enabled" else _dumps(value)
        self.db.write(
            lambda tx: tx.execute(
                f"INSERT INTO push_rule_defaults (user_id, kind, rule_id, {column})"
                " VALUES (?, ?, ?, ?) ON CONFLICT (user_id, kind, rule_id)"
                f" DO UPDATE SET {column} = excluded.{column}",
                (user_id, kind, rule_id, stored),
            )
        )

    # --- room facts the rules read ------------------------------------------------------

    def local_members(self, room_id: str, server_name: str) -> tuple[dict[str, str | None], int]:
        """({local joined user: their display name in the room}, the joined count)."""
        suffix = ":" + server_name

        def read(tx) -> tuple[dict[str, str | None], int]:
            rows = tx.fetchall(
                "SELECT c.state_key, e.json FROM current_state c"
                " JOIN events e ON e.event_id = c.event_id WHERE c.room_id = ?"
                " AND c.type = 'm.room.member' AND c.membership = 'join'",
                (room_id,),
            )
            members: dict[str, str | None] = {}
            for user_id, text in rows:
                if user_id.endswith(suffix):  # decoded on the database's thread
                    name = json.loads(text).get("content", {}).get("displayname")
                    members[user_id] = name if isinstance(name, str) else None
            return members, len(rows)

        return self.db.read(read)

    # --- actions ------------------------------------------------------------------------

    @staticmethod
    def insert_push_actions(tx, actions: list[PushAction]) -> None:
        """In the event's own write: nothing for an event stored as hidden (soft failed) or
        as an outlier. Each rule's actions encoded once: a big room's message is thousands
        of rows. On PostgreSQL one statement an event, its rows as arrays: a statement a
        row cost the database about as much again as the rows themselves."""
        if not actions:
            return
        texts: dict[int, str] = {}
        for a in actions:
            if id(a.actions) not in texts:
                texts[id(a.actions)] = _dumps(a.actions)
        # Each event's rows: (user, thread, highlight, actions).
        by_event: dict[str, list[tuple]] = {}
        for a in actions:
            row = (a.user_id, a.thread_id, int(a.highlight), texts[id(a.actions)])
            by_event.setdefault(a.event_id, []).append(row)
        # The event's room and position are read by the statement itself: it runs while the
        # events stream's row is held (storage/streams.py), so no round trip of its own.
        insert = (
            "INSERT INTO event_push_actions (user_id, thread_id, highlight, actions, notif,"
            " room_id, event_id, stream_ordering) SELECT {row}, 1, e.room_id, e.event_id,"
            " e.stream_ordering FROM {events} WHERE e.event_id = ? AND e.soft_failed = 0"
            " AND e.outlier = 0 ON CONFLICT DO NOTHING"
        )
        if tx.dialect != "postgres":  # a statement a row costs nothing in process
            tx.executemany(
                insert.format(row="?, ?, ?, ?", events="events e"),
                [(*row, event_id) for event_id, rows in by_event.items() for row in rows],
            )
            return
        sql = insert.format(
            row="r.*",
            events="unnest(?::text[], ?::text[], ?::int[], ?::text[]) AS r, events e",
        )
        for event_id, rows in by_event.items():
            tx.execute(sql, (*(list(column) for column in zip(*rows)), event_id))

    def unread_counts(self, user_id: str, room_ids: list[str]) -> dict[str, dict]:
        """{room_id: {thread_id: (notifications, highlights)}} after the user's read
        receipts: an unthreaded one covers every thread, a threaded one its thread."""
        return self.unread_counts_of([user_id], room_ids).get(user_id, {})

    def unread_counts_of(self, user_ids: list[str], room_ids: list[str]) -> dict[str, dict]:
        """`unread_counts` of several users at once: {user_id: {room_id: {thread_id: ...}}},
        for every pair of those users and rooms that has any."""
        found: dict[str, dict] = {}

        def read(tx) -> None:
            for users, user_marks in in_lists(user_ids):
                for rooms, room_marks in in_lists(room_ids):
                    for user_id, room_id, thread_id, count, highlights in tx.fetchall(
                        "SELECT a.user_id, a.room_id, a.thread_id, COUNT(*), SUM(a.highlight)"
                        f" FROM event_push_actions a WHERE a.user_id IN ({user_marks})"
                        f" AND a.room_id IN ({room_marks}) AND a.stream_ordering > COALESCE(("
                        " SELECT MAX(r.event_stream_ordering) FROM receipts r"
                        " WHERE r.room_id = a.room_id AND r.user_id = a.user_id"
                        " AND r.receipt_type IN (?, ?)"
                        " AND (r.thread_id = '' OR r.thread_id = a.thread_id)), 0)"
                        " GROUP BY a.user_id, a.room_id, a.thread_id",
                        (*users, *rooms, *READ_RECEIPTS),
                    ):
                        by_room = found.setdefault(user_id, {}).setdefault(room_id, {})
                        by_room[thread_id] = (int(count), int(highlights))

        if user_ids and room_ids:
            self.db.read(read)
        return found

    def notifications(
        self, user_id: str, before: int | None, limit: int, only_highlight: bool
    ) -> list[Notification]:
        """The user's notifications older than `before` (the stream position), newest
        first, each with whether their read receipt covers it."""

        def read(tx) -> list[Notification]:
            rows = tx.fetchall(
                "SELECT a.room_id, a.actions, e.stream_ordering, e.event_id, e.json,"
                " e.unsigned, COALESCE(("
                " SELECT MAX(r.event_stream_ordering) FROM receipts r"
                " WHERE r.room_id = a.room_id AND r.user_id = a.user_id"
                " AND r.receipt_type IN (?, ?)"
                " AND (r.thread_id = '' OR r.thread_id = a.thread_id)), 0)"
                " FROM event_push_actions a JOIN events e ON e.event_id = a.event_id"
                " WHERE a.user_id = ? AND a.stream_ordering < ?"
                + (" AND a.highlight = 1" if only_highlight else "")
                + " ORDER BY a.stream_ordering DESC LIMIT ?",
                (*READ_RECEIPTS, user_id, 2**62 if before is None else before, limit),
            )
            return [
                Notification(_stored(r[2:6]), r[0], json.loads(r[1]), r[2] <= r[6]) for r in rows
            ]

        return self.db.read(read)


def _loads(text: str | None):
    return None if text is None else json.loads(text)
