"""Wakes this instance's parked syncs for what other instances wrote.

storage/announcements.py hands on the newest position of each stream other instances
announced; the rows between the last position this instance knew and it say whom to wake
(storage/stream_changes.py), as the local write's own call to the notifier would have:

- events: each room's joined members and the users its member events are about, without
  `recompute`, as the rooms' persist listener does. Those events are not in this
  instance's `RecentEvents`, only their newest position is, so a woken sync finds a gap
  there and reads the database (sync/woken.py): nothing answers from memory that another
  instance wrote. Invites from other servers (the same stream) wake the invited user.
- receipts: the room's members (a private receipt: its owner).
- account data and to-device messages: their owner.
- device lists and presence: everyone sharing a room with the user.

The same reads keep this instance's memory of what others changed: push rules' facts about
a room whose state changed, and a user's compiled push rules when their account data moved
(a rule's change writes m.push_rules), are forgotten whether or not anyone waits. Until the
notification arrives (milliseconds) they may be stale.

Typing is in each instance's memory and is not carried (docs/operations.md, "Several
instances").
"""

from __future__ import annotations

from typing import Callable, Iterable

from homeserver.storage.stream_changes import PER_USER_STREAMS, StreamChanges
from homeserver.sync.notifier import Notifier

SHARED_WITH_ROOMS = frozenset({"device_lists", "presence"})


class ClusterWakes:
    def __init__(
        self,
        changes: StreamChanges,
        notifier: Notifier,
        sharing: Callable[[str], Iterable[str]],
        forget_room: Callable[[str], None] = lambda room_id: None,
        forget_rules: Callable[[str], None] = lambda user_id: None,
    ):
        """`sharing(user_id)`: the users who share a room with `user_id`; `forget_room`,
        `forget_rules`: what is kept in memory about a room's state and a user's push rules."""
        self._changes = changes
        self._notifier = notifier
        self._sharing = sharing
        self._forget_room = forget_room
        self._forget_rules = forget_rules
        self._last: dict[str, int] = {}
        self.wakes = 0  # ranges read to wake syncs (weir_cluster_wakes_total)

    def on_positions(self, positions: dict[str, int]) -> None:
        """The newest positions other instances announced: wake whom their writes concern."""
        for stream, upto in positions.items():
            after = self._last.get(stream)
            if after is not None and upto <= after:
                continue
            if after is not None:  # else where this instance started: nothing to wake
                self._apply(stream, after, upto)
            # Only once applied: a failed read is tried again with the next batch.
            self._last[stream] = upto

    def _apply(self, stream: str, after: int, upto: int) -> None:
        if stream == "events":
            self._notifier.recent.stored_elsewhere(upto)
            self._room_events(after, upto)
        elif stream == "account_data":
            users = self._changes.users(stream, after, upto)
            for user_id in users:
                self._forget_rules(user_id)
            if self._notifier.waiting():
                self._notifier.notify_users(users)
                self.wakes += 1
        elif self._notifier.waiting():
            self._wake(stream, after, upto)

    def _room_events(self, after: int, upto: int) -> None:
        changes = self._changes.room_events(after, upto)
        for room_id in changes.state_changed:
            self._forget_room(room_id)
        if self._notifier.waiting():
            notifier = self._notifier
            for room_id, targets in changes.rooms.items():
                notifier.notify_room(room_id, targets, recompute=False)
            notifier.notify_users(changes.invited)
            self.wakes += 1

    def _wake(self, stream: str, after: int, upto: int) -> None:
        notifier = self._notifier
        if stream == "receipts":
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
