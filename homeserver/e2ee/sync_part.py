"""What end-to-end encryption adds to /sync: `to_device`, `device_lists`,
`device_one_time_keys_count` and `device_unused_fallback_key_types`.

Device list changes are those of users who share a room with the syncing user now (and
their own), plus everyone in a room the user joined since the token; `left` are users
who left a shared room since the token, or were in a room the user left, and share none
now. `/keys/changes` gives the same between two tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from homeserver.core.concurrency import GatheredReads
from homeserver.core.requester import Requester
from homeserver.storage.e2ee import E2eeStore

TO_DEVICE_LIMIT = 100  # per response; the rest follows in the next sync at once


# A device's one-time key counts and unused fallback key types (E2eeStore.key_counts).
Counts = tuple[dict[str, int], list[str]]


class KeyCounts(NamedTuple):
    """A device's one-time key counts and unused fallback key types, and
    E2eeStore.key_writes just before they were read (a parked sync keeps them)."""

    one_time: dict
    unused_fallback: list[str]
    read_at: int


@dataclass
class E2eeSyncPart:
    to_device: list[dict] = field(default_factory=list)
    to_device_position: int = 0
    changed: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    one_time_key_counts: dict = field(default_factory=dict)
    unused_fallback_key_types: list[str] = field(default_factory=list)
    keys_read_at: int = -1  # E2eeStore.key_writes just before the two above were read

    @property
    def key_counts(self) -> KeyCounts:
        return KeyCounts(
            self.one_time_key_counts, self.unused_fallback_key_types, self.keys_read_at
        )

    @property
    def has_updates(self) -> bool:
        return bool(self.to_device or self.changed or self.left)

    def fields(self) -> dict:
        return {
            "to_device": {"events": self.to_device},
            "device_lists": {"changed": self.changed, "left": self.left},
            # signed_curve25519 is listed even at 0: some clients read its absence as
            # "no count sent" and never upload.
            "device_one_time_keys_count": {"signed_curve25519": 0, **self.one_time_key_counts},
            "device_unused_fallback_key_types": self.unused_fallback_key_types,
        }


@dataclass(frozen=True)
class Range:
    """(after, up_to] in the events, device list and to-device streams; `after` None
    for an initial sync."""

    events_after: int | None
    events_up_to: int
    lists_after: int
    lists_up_to: int
    to_device_after: int
    to_device_up_to: int


class E2eeSync:
    def __init__(self, store: E2eeStore):
        self.store = store
        # The counts of the devices whose syncs one message woke, read together.
        self._woken_counts: GatheredReads[tuple[str, str], Counts] = GatheredReads(
            lambda devices: store.key_counts_of(devices), lambda device: store.key_counts(*device)
        )

    def part(
        self, requester: Requester, span: Range, member_moves: list | None = None
    ) -> E2eeSyncPart:
        """`member_moves`: `membership_changes` over the span's events in the user's rooms,
        if the caller has read them already (a sync's snapshot has)."""
        user_id, device_id = requester.user_id, requester.device_id
        incremental = span.events_after is not None and span.to_device_after
        keys_read_at = self.store.key_writes
        read = self.store.device_sync_read(
            user_id,
            device_id,
            span.to_device_after if incremental else None,
            (span.to_device_after, span.to_device_up_to),
            TO_DEVICE_LIMIT,
        )
        if read.acknowledged_held:
            self.store.forget_to_device(user_id, device_id, span.to_device_after)
        messages = read.to_device
        part = E2eeSyncPart(
            to_device=[
                {"sender": m.sender, "type": m.type, "content": m.content} for m in messages
            ],
            to_device_position=(
                messages[-1].position if len(messages) == TO_DEVICE_LIMIT else span.to_device_up_to
            ),
            one_time_key_counts=read.one_time_key_counts,
            unused_fallback_key_types=read.unused_fallback_key_types,
            keys_read_at=keys_read_at,
        )
        if span.events_after is not None:
            part.changed, part.left = self.changes(user_id, span, member_moves)
        return part

    def key_counts(self, requester: Requester, known: KeyCounts | None) -> KeyCounts:
        """The device's key counts for a sync in which nothing else of this part is new: a
        woken sync answering from room events (sync/woken.py). `known`: counts read
        before, kept if no key was written since."""
        if known is not None and self.store.keys_unchanged_since(known.read_at):
            return known
        read_at = self.store.key_writes
        device = (requester.user_id, requester.device_id)
        return KeyCounts(*self._woken_counts.get(device), read_at)

    def changes(
        self, user_id: str, span: Range, moves: list | None = None
    ) -> tuple[list[str], list[str]]:
        """(changed, left) for `user_id` over the span (events_after must be set)."""
        assert span.events_after is not None
        if moves is None:
            rooms = self.store.rooms_of(user_id)
            moves = self.store.membership_changes(rooms, span.events_after, span.events_up_to)
        if span.lists_up_to <= span.lists_after and not moves:
            # Nothing to tell, and the usual case of a woken sync (a message was sent): the
            # users sharing a room are as many as the members of the user's rooms, so
            # reading them for every sync that one event wakes costs members squared.
            return [], []
        sharing = self.store.users_sharing_a_room(user_id)
        changed = set()
        if span.lists_up_to > span.lists_after:
            changed = self.store.changed_users(span.lists_after, span.lists_up_to, sorted(sharing))
        gone: set[str] = set()
        for room_id, member, membership in moves:
            if member == user_id:
                members = self.store.members_ever(room_id)
                (changed if membership == "join" else gone).update(members)
            elif membership == "join":
                changed.add(member)
            elif membership in ("leave", "ban"):
                gone.add(member)
        left = {u for u in gone if u not in sharing}
        return sorted(changed & sharing), sorted(left)
