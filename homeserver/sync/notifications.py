"""Unread counts in /sync and `GET /notifications` (client-server spec, "Push
Notifications"), from the push actions recorded with each event (push_actions.py) after
the user's read receipts (storage/push.py)."""

from __future__ import annotations

import gevent
from gevent.event import AsyncResult

from homeserver.core.clock import now_ms
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


class _Asked:
    """The users and rooms one gathered read is for, and what it found."""

    __slots__ = ("users", "rooms", "counts")

    def __init__(self) -> None:
        self.users: set[str] = set()
        self.rooms: set[str] = set()
        self.counts: AsyncResult = AsyncResult()


class GatheredUnread:
    """`Notifications.unread_fields` for syncs woken together (sync/woken.py). One message
    wakes every member at once, and each answer needs its own user's counts: the first to
    ask gives the others one turn of the hub to ask too, then reads them all at once, so a
    wake-up costs a read per turn rather than one per sync."""

    def __init__(self, store: PushStore):
        self.store = store
        self._open: _Asked | None = None
        self.reads = 0

    def __call__(self, user_id: str, room_ids: list[str], by_thread: bool) -> dict:
        asked = self._open
        if asked is None:
            asked = self._open = _Asked()
            asked.users.add(user_id)
            asked.rooms.update(room_ids)
            self._read(asked)
        else:
            asked.users.add(user_id)
            asked.rooms.update(room_ids)
            asked.counts.wait()  # a hang-up of this sync's own client raises here
        if asked.counts.successful():
            counts = asked.counts.value.get(user_id, {})
        else:  # the first asker failed or was hung up on: on its own
            counts = self.store.unread_counts(user_id, room_ids)
        return _fields(counts, room_ids, by_thread)

    def _read(self, asked: _Asked) -> None:
        try:
            gevent.sleep(0)  # the syncs woken with this one ask meanwhile
            self._open = None
            self.reads += 1
            counts = self.store.unread_counts_of(sorted(asked.users), sorted(asked.rooms))
        except BaseException as e:
            if self._open is asked:
                self._open = None
            asked.counts.set_exception(e)
            raise
        asked.counts.set(counts)
