"""Pushers and what they owe (client-server spec, "Push Notifications"; 0068_pushers.sql).

A pusher's `position` is the last `event_push_actions.stream_ordering` its gateway took:
the rows after it are owed (`owed`), and it moves on only once the gateway answered
(`advance`), so a restart resends nothing sent and loses nothing owed."""

from __future__ import annotations

import json
from dataclasses import dataclass

from homeserver.storage.database import Database
from homeserver.storage.leases import LeasedTable, QueueLeases
from homeserver.storage.push import READ_RECEIPTS

PusherKey = tuple[str, str, str]  # (user_id, app_id, pushkey)
# Each pusher's row carries its lease (storage/leases.py; 0073_queue_leases).
PUSHERS = LeasedTable("pushers", ("user_id", "app_id", "pushkey"))


@dataclass(frozen=True)
class Pusher:
    user_id: str
    app_id: str
    pushkey: str
    kind: str
    app_display_name: str
    device_display_name: str
    profile_tag: str | None
    lang: str
    data: dict
    pushkey_ts: int = 0
    position: int = 0
    retry_interval_ms: int = 0

    @property
    def key(self) -> PusherKey:
        return (self.user_id, self.app_id, self.pushkey)


@dataclass(frozen=True)
class OwedAction:
    """One notifying push action a pusher's gateway has not taken yet, with its event."""

    stream_ordering: int
    event_id: str
    room_id: str
    highlight: bool
    actions: list
    event: dict  # the event's PDU, as stored


@dataclass(frozen=True)
class RoomLabels:
    """What a notification names the room and the sender by, from current state."""

    room_name: str | None
    room_alias: str | None
    sender_display_name: str | None


_COLUMNS = (
    "user_id, app_id, pushkey, kind, app_display_name, device_display_name, profile_tag,"
    " lang, data, pushkey_ts, position, retry_interval_ms"
)


def _pusher(row) -> Pusher:
    user_id, app_id, pushkey, kind, app_name, device_name, tag, lang, data, ts, at, retry = row
    return Pusher(
        user_id,
        app_id,
        pushkey,
        kind,
        app_name,
        device_name,
        tag,
        lang,
        json.loads(data),
        ts,
        at,
        retry,
    )


class PusherStore:
    def __init__(self, db: Database):
        self.db = db

    def set_pusher(self, pusher: Pusher, append: bool) -> tuple[Pusher, list[PusherKey]]:
        """Adds or updates the user's pusher (a new one owes only events after now); unless
        `append`, other users' pushers with the same app_id and pushkey go. Returns the
        pusher as stored and the keys of those removed."""

        def write(tx) -> tuple[Pusher, list[PusherKey]]:
            removed: list[PusherKey] = []
            if not append:
                removed = [
                    (r[0], r[1], r[2])
                    for r in tx.fetchall(
                        "DELETE FROM pushers WHERE app_id = ? AND pushkey = ? AND user_id <> ?"
                        " RETURNING user_id, app_id, pushkey",
                        (pusher.app_id, pusher.pushkey, pusher.user_id),
                    )
                ]
            (end,) = tx.fetchone("SELECT COALESCE(MAX(stream_ordering), 0) FROM events")
            row = tx.fetchone(
                f"INSERT INTO pushers ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)"
                " ON CONFLICT (user_id, app_id, pushkey) DO UPDATE SET kind = excluded.kind,"
                " app_display_name = excluded.app_display_name,"
                " device_display_name = excluded.device_display_name,"
                " profile_tag = excluded.profile_tag, lang = excluded.lang,"
                " data = excluded.data, pushkey_ts = excluded.pushkey_ts"
                f" RETURNING {_COLUMNS}",
                (
                    pusher.user_id,
                    pusher.app_id,
                    pusher.pushkey,
                    pusher.kind,
                    pusher.app_display_name,
                    pusher.device_display_name,
                    pusher.profile_tag,
                    pusher.lang,
                    json.dumps(pusher.data, separators=(",", ":")),
                    pusher.pushkey_ts,
                    end,
                ),
            )
            return _pusher(row), removed

        return self.db.write(write)

    def delete(self, key: PusherKey) -> bool:
        """Whether there was such a pusher."""
        return self.db.write(
            lambda tx: (
                tx.fetchone(
                    "DELETE FROM pushers WHERE user_id = ? AND app_id = ? AND pushkey = ?"
                    " RETURNING user_id",
                    key,
                )
                is not None
            )
        )

    def delete_user(self, user_id: str) -> list[PusherKey]:
        return self.db.write(
            lambda tx: [
                (r[0], r[1], r[2])
                for r in tx.fetchall(
                    "DELETE FROM pushers WHERE user_id = ? RETURNING user_id, app_id, pushkey",
                    (user_id,),
                )
            ]
        )

    def pushers_of(self, user_id: str) -> list[Pusher]:
        return self.db.read(
            lambda tx: [
                _pusher(r)
                for r in tx.fetchall(
                    f"SELECT {_COLUMNS} FROM pushers WHERE user_id = ? ORDER BY app_id, pushkey",
                    (user_id,),
                )
            ]
        )

    def all_pushers(self) -> list[Pusher]:
        return self.db.read(
            lambda tx: [_pusher(r) for r in tx.fetchall(f"SELECT {_COLUMNS} FROM pushers")]
        )

    def get(self, key: PusherKey) -> Pusher | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                f"SELECT {_COLUMNS} FROM pushers WHERE user_id = ? AND app_id = ? AND pushkey = ?",
                key,
            )
        )
        return None if row is None else _pusher(row)

    def claim(self, leases: QueueLeases, key: PusherKey) -> tuple[Pusher | None, bool, float]:
        """Claims (or renews) the pusher's lease: (the pusher as stored, whether claimed,
        seconds until the other holder's lease lapses if not); (None, False, 0) when the
        pusher is gone."""
        claim = leases.claim(key, returning=_COLUMNS)
        pusher = None if claim.row is None else _pusher(claim.row)
        return pusher, claim.claimed, claim.lapses_in

    def notified_between(self, after: int, upto: int) -> list[Pusher]:
        """The pushers of users with notifying push actions at stream positions in
        (after, upto]: those another instance stored, when its NOTIFY arrives."""
        return self.db.read(
            lambda tx: [
                _pusher(r)
                for r in tx.fetchall(
                    f"SELECT {_COLUMNS} FROM pushers WHERE user_id IN ("
                    " SELECT user_id FROM event_push_actions"
                    " WHERE stream_ordering > ? AND stream_ordering <= ? AND notif = 1)",
                    (after, upto),
                )
            ]
        )

    def advance(self, key: PusherKey, position: int) -> None:
        """The gateway took everything up to `position`; a pusher gone meanwhile stays gone."""
        self.db.write(
            lambda tx: tx.execute(
                "UPDATE pushers SET position = ?, retry_interval_ms = 0 WHERE user_id = ?"
                " AND app_id = ? AND pushkey = ? AND position < ?",
                (position, *key, position),
            )
        )

    def set_retry(self, key: PusherKey, interval_ms: int) -> None:
        self.db.write(
            lambda tx: tx.execute(
                "UPDATE pushers SET retry_interval_ms = ? WHERE user_id = ? AND app_id = ?"
                " AND pushkey = ?",
                (interval_ms, *key),
            )
        )

    # --- what a pusher owes, and what its notifications say -------------------------------

    def owed(self, user_id: str, after: int, limit: int) -> list[OwedAction]:
        """The user's notifying push actions after `after`, oldest first."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT a.stream_ordering, a.event_id, a.room_id, a.highlight, a.actions, e.json"
                " FROM event_push_actions a JOIN events e ON e.event_id = a.event_id"
                " WHERE a.user_id = ? AND a.stream_ordering > ? AND a.notif = 1"
                " ORDER BY a.stream_ordering LIMIT ?",
                (user_id, after, limit),
            )
        )
        return [
            OwedAction(r[0], r[1], r[2], bool(r[3]), json.loads(r[4]), json.loads(r[5]))
            for r in rows
        ]

    def badge_counts(self, user_id: str) -> tuple[int, int]:
        """(unread notifications, unread call invites) in the rooms the user is joined to,
        after their read receipts (as storage/push.py counts a room's)."""
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT COUNT(*), COALESCE(SUM(CASE WHEN e.type = 'm.call.invite' THEN 1"
                " ELSE 0 END), 0) FROM event_push_actions a"
                " JOIN events e ON e.event_id = a.event_id"
                " WHERE a.user_id = ? AND a.room_id IN (SELECT c.room_id FROM current_state c"
                " WHERE c.type = 'm.room.member' AND c.state_key = ? AND c.membership = 'join')"
                " AND a.stream_ordering > COALESCE(("
                " SELECT MAX(r.event_stream_ordering) FROM receipts r"
                " WHERE r.room_id = a.room_id AND r.user_id = a.user_id"
                " AND r.receipt_type IN (?, ?)"
                " AND (r.thread_id = '' OR r.thread_id = a.thread_id)), 0)",
                (user_id, user_id, *READ_RECEIPTS),
            )
        )
        return int(row[0]), int(row[1])

    def room_labels(self, room_id: str, sender: str) -> RoomLabels:
        keys = [("m.room.name", ""), ("m.room.canonical_alias", ""), ("m.room.member", sender)]
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT c.type, e.json FROM current_state c JOIN events e"
                " ON e.event_id = c.event_id WHERE c.room_id = ? AND ("
                + " OR ".join(["(c.type = ? AND c.state_key = ?)"] * len(keys))
                + ")",
                (room_id, *[part for key in keys for part in key]),
            )
        )
        content = {t: json.loads(text).get("content") for t, text in rows}

        def text(event_type: str, field: str) -> str | None:
            value = content.get(event_type)
            found = value.get(field) if isinstance(value, dict) else None
            return found if isinstance(found, str) and found else None

        return RoomLabels(
            text("m.room.name", "name"),
            text("m.room.canonical_alias", "alias"),
            text("m.room.member", "displayname"),
        )
