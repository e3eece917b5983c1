"""Wakes this instance's parked syncs for what other instances wrote.

storage/announcements.py hands on the newest position of each stream other instances
announced; the rows between the last position this instance knew and it say whom to wake
(storage/stream_changes.py), as the local write's own call to the notifier would have:

- events: each room's joined members and the users its member events are about, without
  `recompute`, as the rooms' persist listener does. Those events are not in this
  instance's `RecentEvents`, only their newest position is, so a woken sync finds a gap
  there and reads the database (sync/woken.py): nothing answers from memory that another
  instance wrote. Invites from
  other servers (the same stream) wake the invited user.
- receipts: the room's members (a private receipt: its owner).
- account data and to-device messages: their owner.
- device lists and presence: everyone sharing a room with the user.

Typing is in each instance's memory and is not carried (docs/operations.md, "Several
instances").
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from homeserver.storage.stream_changes import PER_USER_STREAMS, StreamChanges
from homeserver.sync.notifier import Notifier

log = logging.getLogger(__name__)

SHARED_WITH_ROOMS = frozenset({"device_lists", "presence"})


class ClusterWakes:
    def __init__(
        self,
        changes: StreamChanges,
        notifier: Notifier,
        sharing: Callable[[str], Iterable[str]],
    ):
        """`sharing(user_id)`: the users who share a room with `user_id`."""
        self._changes = changes
        self._notifier = notifier
        self._sharing = sharing
        self._last: dict[str, int] = {}
        self.wakes = 0  # batches that woke anyone (weir_cluster_wakes_total)

    def on_positions(self, positions: dict[str, int]) -> None:
        """The newest positions other instances announced: wake whom their writes concern."""
        for stream, upto in positions.items():
            after = self._last.get(stream)
            if after is not None and upto <= after:
                continue
            self._last[stream] = upto
            if stream == "events":
                self._notifier.recent.stored_elsewhere(upto)
            # The first position heard is where this instance started: nothing to wake.
            if after is None or not self._notifier.waiting():
                continue
            self._wake(stream, after, upto)

    def _wake(self, stream: str, after: int, upto: int) -> None:
        notifier = self._notifier
        if stream == "events":
            changes = self._changes.room_events(after, upto)
            for room_id, targets in changes.rooms.items():
                notifier.notify_room(room_id, targets, recompute=False)
            if changes.invited:
                notifier.notify_users(changes.invited)
        elif stream == "receipts":
            rooms, users = self._changes.receipts(after, upto)
            for room_id in rooms:
                notifier.notify_room(room_id)
            notifier.notify_users(users)
        elif stream in PER_USER_STREAMS:
            users = self._changes.users(stream, after, upto)
            if stream in SHARED_WITH_ROOMS:
                users = {shared for user_id in users for shared in self._sharing(user_id)}
            notifier.notify_users(users)
        else:
            return  # a stream no sync answers from (history, directory, auth chains)
        self.wakes += 1
