"""Unread counts in /sync and `GET /notifications` (client-server spec, "Push
Notifications"), from the push actions recorded with each event (push_actions.py) after
the user's read receipts (storage/push.py)."""

from __future__ import annotations

from homeserver.core.clock import now_ms
from homeserver.core.concurrency import GatheredReads
from homeserver.core.errors import invalid_param
from homeserver.rooms.format import client_event
from homeserver.storage.push import MAIN_THREAD, PushStore

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


def _counts(notifications: int, highlights: int) -> dict:
    return {"notification_count": notifications, "highlight_count": highlights}


def _fields(counts: dict[str, dict], room_ids: list[str], by_thread: bool) -> dict:
    found = {}
    for room_id in room_ids:
        threads = counts.get(room_id, {})
        if by_thread:
            found[room_id] = {
                "unread_notifications": _counts(*threads.get(MAIN_THREAD, (0, 0))),
                "unread_thread_notifications": {
                    t: _counts(*c) for t, c in threads.items() if t != MAIN_THREAD
                },
            }
        else:
            total = (sum(c[0] for c in threads.values()), sum(c[1] for c in threads.values()))
            found[room_id] = {"unread_notifications": _counts(*total)}
    return found


class Notifications:
    def __init__(self, store: PushStore):
        self.store = store

    def add_unread_counts(self, user_id: str, joined: dict, by_thread: bool) -> None:
        """Puts the unread counts in each of a sync's joined room entries."""
        for room_id, fields in self.unread_fields(user_id, list(joined), by_thread).items():
            joined[room_id].update(fields)

    def unread_fields(self, user_id: str, room_ids: list[str], by_thread: bool) -> dict:
        """{room_id: {"unread_notifications": ..., and, `by_thread`,
        "unread_thread_notifications": ...}}: one read for all the rooms."""
        counts = self.store.unread_counts(user_id, room_ids) if room_ids else {}
        return _fields(counts, room_ids, by_thread)

    def page(self, user_id: str, from_token: str | None, limit: int, only: str | None) -> dict:
        """The user's notifications, newest first; `next_token` pages on while any are left."""
        before = None
        if from_token is not None:
            if not from_token.isdigit():
                raise invalid_param("from is not a token this server gave")
            before = int(from_token)
        limit = max(1, min(limit, MAX_LIMIT))
        found = self.store.notifications(user_id, before, limit, only == "highlight")
        now = now_ms()
        body: dict = {
            "notifications": [
                {
                    "actions": n.actions,
                    "event": client_event(n.stored, now),
                    "read": n.read,
                    "room_id": n.room_id,
                    "ts": n.stored.event.pdu.get("origin_server_ts", 0),
                }
                for n in found
            ]
        }
        if len(found) == limit:
            body["next_token"] = str(found[-1].stored.stream_ordering)
        return body


class GatheredUnread:
    """`Notifications.unread_fields` for syncs woken together (sync/woken.py): one message
    wakes every member at once, and each answer needs its own user's counts, so they are
    read together (core/concurrency.py, GatheredReads): a read per turn of the hub rather
    than one per sync."""

    def __init__(self, store: PushStore):
        self.store = store
        self.reads: GatheredReads[tuple[str, tuple[str, ...]], dict] = GatheredReads(
            self._read_many, lambda key: store.unread_counts(key[0], list(key[1]))
        )

    def __call__(self, user_id: str, room_ids: list[str], by_thread: bool) -> dict:
        counts = self.reads.get((user_id, tuple(room_ids)))
        return _fields(counts, room_ids, by_thread)

    def _read_many(self, keys: list[tuple[str, tuple[str, ...]]]) -> dict:
        users = sorted({user_id for user_id, _ in keys})
        rooms = sorted({room_id for _, room_ids in keys for room_id in room_ids})
        found = self.store.unread_counts_of(users, rooms)
        return {key: found.get(key[0], {}) for key in keys}
