"""Wakes this instance's parked syncs for what other instances wrote.

storage/announcements.py hands on the newest position of each stream other instances
announced; the rows between the last position this instance knew and it say whom to wake
(storage/stream_changes.py), as the local write's own call to the notifier would have:

- events: each room's joined members and the users its member events are about, without
  `recompute`, as the rooms' persist listener does. The events are read once, whole, and
  added to this instance's `RecentEvents` before anyone is woken, so a wake-up here is
  answered from memory as on the instance that wrote them (sync/woken.py). Invites from
  other servers (the same stream) wake the invited user.
- receipts: the room's members (a private receipt: its owner).
- account data and to-device messages: their owner.
- device lists and presence: everyone sharing a room with the user.

The same reads keep this instance's memory of what others changed (`KeptInMemory`), whether
or not anyone waits: push rules' facts about a room whose state changed, a user's compiled
push rules when their account data moved (a rule's change writes m.push_rules), a user's
presence as last seen here, and the owners of access tokens another instance ended are
forgotten, and key counts read before another instance's key write are no longer trusted
(storage/e2ee.py); typing changes are applied in position order (sync/typing.py). Until the
notification arrives (milliseconds) they may be stale (docs/architecture.md, "What memory
may not serve").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from gevent.lock import Semaphore

from homeserver.storage.cluster_memory import TOKENS_STREAM, TYPING_STREAM
from homeserver.storage.e2ee import KEY_WRITES_STREAM
from homeserver.storage.stream_changes import PER_USER_STREAMS, StreamChanges
from homeserver.sync.notifier import Notifier
from homeserver.sync.woken import RECENT_EVENTS

SHARED_WITH_ROOMS = frozenset({"device_lists", "presence"})


def _nothing(*_) -> None:
    return None


@dataclass(frozen=True)
class KeptInMemory:
    """What this instance keeps of what others change, and how to put it right."""

    forget_room: Callable[[str], None] = _nothing  # push facts of a room (state changed)
    forget_rules: Callable[[str], None] = _nothing  # a user's compiled push rules
    forget_presence: Callable[[str], None] = _nothing  # a user's presence as last seen
    forget_tokens: Callable[[str, str | None], None] = _nothing  # (user, device or all)
    typing_upto: Callable[[int], None] = _nothing  # apply typing changes up to a position
    keys_written: Callable[[], None] = _nothing  # key counts read before may be stale


class ClusterWakes:
    def __init__(
        self,
        changes: StreamChanges,
        notifier: Notifier,
        sharing: Callable[[str], Iterable[str]],
        kept: KeptInMemory = KeptInMemory(),
    ):
        """`sharing(user_id)`: the users who share a room with `user_id`."""
        self._changes = changes
        self._notifier = notifier
        self._sharing = sharing
        self._kept = kept
        self._last: dict[str, int] = {}
        # One reader of the events stream at a time: the listening greenlet, or a local
        # write's catching up (`events_below`).
        self._reading_events = Semaphore()
        self.wakes = 0  # ranges read to wake syncs (weir_cluster_wakes_total)

    def on_positions(self, positions: dict[str, int]) -> None:
        """The newest positions other instances announced: wake whom their writes concern."""
        for stream, upto in positions.items():
            if stream == "events":
                with self._reading_events:
                    self._advance(stream, upto)
            else:
                self._advance(stream, upto)

    def events_below(self, position: int) -> None:
        """This instance stored events from `position` and is about to wake its syncs for
        them. Every position below it is committed (storage/streams.py hands them out in
        commit order), so other instances' events there are read and woken for first,
        without waiting for their NOTIFY: a sync woken by ours then finds no gap in
        `RecentEvents` and answers from memory."""
        recent = self._notifier.recent
        with self._reading_events:
            after = self._last.get("events")
            if after is None or position - 1 <= after:
                return
            if recent.has_all(after, position - 1):  # ours only: woken for already
                self._last["events"] = position - 1
            else:
                self._advance("events", position - 1)

    def _advance(self, stream: str, upto: int) -> None:
        after = self._last.get(stream)
        if after is not None and upto <= after:
            return
        if after is not None:  # else where this instance started: nothing to wake
            self._apply(stream, after, upto)
        elif stream == TYPING_STREAM:  # applied from typing's own position
            self._kept.typing_upto(upto)
        # Only once applied: a failed read is tried again with the next batch.
        self._last[stream] = upto

    def positions(self) -> dict[str, int]:
        """How far this instance has applied each stream (weir_cluster_position)."""
        return dict(self._last)

    def _apply(self, stream: str, after: int, upto: int) -> None:
        kept = self._kept
        if stream == "events":
            self._room_events(after, upto)
        elif stream == TYPING_STREAM:
            kept.typing_upto(upto)  # wakes the rooms' syncs itself
        elif stream == KEY_WRITES_STREAM:
            kept.keys_written()
        elif stream == TOKENS_STREAM:
            for user_id, device_id in self._changes.revoked_tokens(after, upto):
                kept.forget_tokens(user_id, device_id)
        elif stream in ("account_data", "presence"):
            users = self._changes.users(stream, after, upto)
            forget = kept.forget_rules if stream == "account_data" else kept.forget_presence
            for user_id in users:
                forget(user_id)
            if self._notifier.waiting():
                self._wake_users(stream, users)
        elif self._notifier.waiting():
            self._wake(stream, after, upto)

    def _room_events(self, after: int, upto: int) -> None:
        # By pages of what RecentEvents keeps: a long range (an instance that was busy or
        # paused) is never held whole in memory.
        for start in range(after, upto, RECENT_EVENTS):
            self._room_events_page(start, min(start + RECENT_EVENTS, upto))

    def _room_events_page(self, after: int, upto: int) -> None:
        changes = self._changes.room_events(after, upto)
        notifier = self._notifier
        # Those it had were woken for when added: this instance's own, mostly.
        fresh = {stored.event.room_id for stored in notifier.recent.add(changes.stored)}
        for room_id in changes.state_changed:
            self._kept.forget_room(room_id)
        if notifier.waiting():
            for room_id, targets in changes.rooms.items():
                if room_id in fresh:
                    notifier.notify_room(room_id, targets, recompute=False)
            notifier.notify_users(changes.invited)
            self.wakes += 1

    def _wake(self, stream: str, after: int, upto: int) -> None:
        """Else a stream no sync answers from (history, directory, auth chains)."""
        if stream == "receipts":
            rooms, users = self._changes.receipts(after, upto)
            for room_id in rooms:
                self._notifier.notify_room(room_id)
            self._notifier.notify_users(users)
            self.wakes += 1
        elif stream in PER_USER_STREAMS:
            self._wake_users(stream, self._changes.users(stream, after, upto))

    def _wake_users(self, stream: str, users: set[str]) -> None:
        if stream in SHARED_WITH_ROOMS:
            users = {shared for user_id in users for shared in self._sharing(user_id)}
        self._notifier.notify_users(users)
        self.wakes += 1
