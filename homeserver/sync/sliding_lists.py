"""A sliding sync's room lists (MSC4186, "Lists"): the user's rooms, most recent activity
first, filtered per list, and the rooms of each list's ranges.

A room's place is its `bump_stamp`: the stream position of the latest event the user may
see in it. In a joined room that is the room's latest event shown to clients; in a room
the user was invited to, knocked on, left or was banned from, their membership event (what
came after it is not theirs to see). Rooms left by the user's own hand are listed only if
the connection sent them before (the MSC: they know they left); kicks and bans always.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from homeserver.storage.sliding_sync import RoomFacts, SlidingSyncStore
from homeserver.storage.sync import TAG_TYPE, SyncSnapshot
from homeserver.sync.sliding_request import ListConfig, ListFilters, RoomConfig

DIRECT_TYPE = "m.direct"


@dataclass
class ListedRoom:
    room_id: str
    membership: str
    bump_stamp: int
    membership_at: int  # where the user's membership was set
    facts: RoomFacts | None  # None for a room this server has no state of (a remote invite)
    stripped: list | None = None  # a remote invite's or knock's stripped state
    in_lists: bool = True  # False: only a subscription may name it


@dataclass
class Matched:
    """A room the response may carry: the combined config of every rule that matched it,
    and the lists it is in."""

    config: RoomConfig
    lists: list[str] = field(default_factory=list)


@dataclass
class ListsResult:
    counts: dict[str, int]
    matched: dict[str, Matched]
    rooms: dict[str, ListedRoom]  # every room of the user's list, matched or not


class RoomLists:
    def __init__(self, store: SlidingSyncStore):
        self.store = store

    def rooms(
        self, user_id: str, snapshot: SyncSnapshot, sent_before: set[str]
    ) -> list[ListedRoom]:
        """The user's rooms as of the snapshot, most recent first; those the lists leave
        out (`in_lists`) among them."""
        up_to = snapshot.positions.events
        kept: list[tuple[str, str, int]] = []
        left: list[str] = []
        for room_id, membership, at in snapshot.memberships:
            if at > up_to:
                continue  # set after the positions were read: the next request has it
            if membership == "leave" and room_id not in snapshot.out_of_room:
                left.append(room_id)
            kept.append((room_id, membership, at))
        kicked = self._kicked(user_id, left, sent_before)
        # Left by their own hand and never sent: out of the lists, still theirs to
        # subscribe to (they were in it).
        unlisted = {
            r for r, m, _ in kept if m == "leave" and r not in kicked and r not in sent_before
        }
        local = [r for r, _, _ in kept if r not in snapshot.out_of_room]
        facts = self.store.room_facts(local)
        joined = [r for r, m, _ in kept if m == "join"]
        latest = self.store.latest_positions(joined, up_to) if joined else {}
        listed = []
        for room_id, membership, at in kept:
            remote = snapshot.out_of_room.get(room_id)
            stripped = remote if isinstance(remote, list) else None
            if remote is not None and stripped is None and room_id not in sent_before:
                continue  # a remote invite rejected before this connection saw it
            stamp = latest.get(room_id, at) if membership == "join" else at
            room = ListedRoom(room_id, membership, stamp, at, facts.get(room_id), stripped)
            room.in_lists = room_id not in unlisted
            listed.append(room)
        listed.sort(key=lambda r: (-r.bump_stamp, r.room_id))
        return listed

    def _kicked(self, user_id: str, left: list[str], sent_before: set[str]) -> set[str]:
        unsent = [r for r in left if r not in sent_before]
        if not unsent:
            return set()
        senders = self.store.member_senders(user_id, unsent)
        return {room_id for room_id, sender in senders.items() if sender != user_id}

    def match(
        self, user_id: str, listed: list[ListedRoom], lists: tuple[ListConfig, ...]
    ) -> ListsResult:
        """Each list's count, and the rooms within its ranges."""
        result = ListsResult({}, {}, {r.room_id: r for r in listed})
        needs = _Lookups(self.store, user_id, lists, result.rooms)
        for config in lists:
            index = 0
            for room in listed:
                if not room.in_lists or not needs.keeps(config.filters, room):
                    continue
                if config.in_range(index):
                    found = result.matched.get(room.room_id)
                    if found is None:
                        result.matched[room.room_id] = Matched(config.config, [config.name])
                    else:
                        found.config = found.config.merged(config.config)
                        found.lists.append(config.name)
                index += 1
            result.counts[config.name] = index
        return result


class _Lookups:
    """What the lists' filters need beyond the rooms themselves, read once if any asks."""

    def __init__(self, store, user_id: str, lists, rooms: dict[str, ListedRoom]):
        filters = [c.filters for c in lists]
        self.direct: set[str] = set()
        self.tags: dict[str, set] = {}
        self.space_children: set[str] = set()
        if any(f.is_dm is not None for f in filters):
            content = store.account_data_of_type(user_id, DIRECT_TYPE).get("", {})
            for room_ids in content.values() if isinstance(content, dict) else ():
                if isinstance(room_ids, list):
                    self.direct.update(r for r in room_ids if isinstance(r, str))
        if any(f.tags is not None or f.not_tags for f in filters):
            for room_id, content in store.account_data_of_type(user_id, TAG_TYPE).items():
                tags = content.get("tags")
                self.tags[room_id] = set(tags) if isinstance(tags, dict) else set()
        for f in filters:
            for space in f.spaces or ():
                room = rooms.get(space)
                # Only spaces the user is joined to count (the MSC), and only their children.
                if room is not None and room.membership == "join" and room.facts is not None:
                    self.space_children.update(room.facts.space_children)

    def keeps(self, f: ListFilters, room: ListedRoom) -> bool:
        if f.is_invite is not None and (room.membership == "invite") != f.is_invite:
            return False
        if f.is_dm is not None and (room.room_id in self.direct) != f.is_dm:
            return False
        room_type, encrypted = _type_and_encryption(room)
        if f.is_encrypted is not None and encrypted != f.is_encrypted:
            return False
        if f.room_types is not None and room_type not in f.room_types:
            return False
        if room_type in f.not_room_types:
            return False
        if f.spaces is not None and room.room_id not in self.space_children:
            return False
        tags = self.tags.get(room.room_id, set())
        if f.tags is not None and not tags.intersection(f.tags):
            return False
        return not tags.intersection(f.not_tags)


def _type_and_encryption(room: ListedRoom) -> tuple[str | None, bool]:
    if room.facts is not None:
        return room.facts.room_type, room.facts.encrypted
    room_type, encrypted = None, False
    for event in room.stripped or ():
        if event.get("type") == "m.room.create":
            found = event.get("content", {}).get("type")
            room_type = found if isinstance(found, str) else None
        elif event.get("type") == "m.room.encryption":
            encrypted = True
    return room_type, encrypted
