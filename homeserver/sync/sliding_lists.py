"""A sliding sync's room lists (MSC4186, "Lists"): the user's rooms, most recent activity
first, filtered per list, and the rooms of each list's ranges.

A room's place is its `activity`: the stream position of the latest event the user may
see in it, of any type (the MSC: lists are by last activity, not by `bump_stamp`, which
counts only some types: sliding_rooms.py). In a joined room that is the room's latest event
shown to clients; in a room the user was invited to, knocked on, left or was banned from,
their membership event (what came after it is not theirs to see). Rooms left by the user's
own hand are listed only if the connection sent them before (the MSC: they know they left);
kicks and bans always.

A connection keeps its list in memory (`Listing`, on sliding_connections.py's state). Its
next request brings it up to date from the events stored since (`advance`, from the
notifier's recent events, as sync/woken.py answers a woken /sync) when those only moved
rooms up: new events in rooms the user is joined to, none of them state, no member event
about the user, no room forgotten. It reads the whole list again otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from homeserver.storage.rooms import StoredEvent
from homeserver.storage.sliding_sync import RoomFacts, SlidingSyncStore
from homeserver.storage.sync import TAG_TYPE, SyncSnapshot
from homeserver.sync.sliding_request import ListConfig, ListFilters, RoomConfig

DIRECT_TYPE = "m.direct"
NO_FILTERS = ListFilters()


@dataclass(slots=True)  # a connection keeps one for each of its user's rooms
class ListedRoom:
    room_id: str
    membership: str
    activity: int  # its place in the lists: the latest event's position (see above)
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


@dataclass(frozen=True, eq=False)
class Listing:
    """The user's rooms as listed at events position `position`, with the user's forgotten
    rooms as `forgets` (storage/sliding_sync.py) said then. Shared, never changed."""

    position: int
    forgets: tuple[int, int]
    rooms: list[ListedRoom]  # most recent first
    own_leaves: frozenset[str]  # left by the user's own hand and unsent: out of the lists
    by_id: dict[str, ListedRoom]


def _listing(position: int, forgets, rooms: list[ListedRoom], own_leaves) -> Listing:
    return Listing(position, forgets, rooms, frozenset(own_leaves), {r.room_id: r for r in rooms})


@dataclass
class ListsResult:
    counts: dict[str, int]
    matched: dict[str, Matched]
    rooms: dict[str, ListedRoom]  # every room of the user's list, matched or not


class RoomLists:
    def __init__(self, store: SlidingSyncStore):
        self.store = store

    def rooms(
        self,
        user_id: str,
        snapshot: SyncSnapshot,
        sent_before: set[str],
        forgets: tuple[int, int] = (0, 0),
    ) -> Listing:
        """The user's rooms as of the snapshot, most recent first; those the lists leave
        out (`in_lists`) among them. `forgets`: read before the snapshot."""
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
        listed.sort(key=lambda r: (-r.activity, r.room_id))
        return _listing(up_to, forgets, listed, unlisted)

    def advance(
        self,
        user_id: str,
        kept: Listing,
        run: list[StoredEvent],
        up_to: int,
        forgets: tuple[int, int],
        sent_before: set[str],
    ) -> Listing | None:
        """`kept` brought up to `up_to` by `run`, the events stored after its position
        (RecentEvents.after); None when they change more than which rooms lead, or a room
        was forgotten: the whole list is read again."""
        if forgets != kept.forgets:
            return None
        bumped: dict[str, int] = {}
        for stored in run:
            if stored.stream_ordering > up_to:
                break  # stored after the positions were read: the next request has it
            event = stored.event
            if event.type == "m.room.member" and event.state_key == user_id:
                return None
            room = kept.by_id.get(event.room_id)
            if room is None:
                continue  # not the user's, or forgotten
            if event.is_state:
                return None  # a filter's or a header's facts may have changed
            if not stored.soft_failed and room.membership == "join":
                bumped[event.room_id] = stored.stream_ordering
        sent = kept.own_leaves & sent_before
        if not bumped and not sent:
            return replace(kept, position=max(up_to, kept.position))
        # Every new activity is past the kept position, every kept one at or before it.
        moved = sorted(
            (replace(kept.by_id[r], activity=at) for r, at in bumped.items()),
            key=lambda r: (-r.activity, r.room_id),
        )
        listed = moved + [r for r in kept.rooms if r.room_id not in bumped]
        if sent:  # sent since (by a subscription): in the lists from now on
            listed = [replace(r, in_lists=True) if r.room_id in sent else r for r in listed]
        return _listing(max(up_to, kept.position), forgets, listed, kept.own_leaves - sent)

    def _kicked(self, user_id: str, left: list[str], sent_before: set[str]) -> set[str]:
        unsent = [r for r in left if r not in sent_before]
        if not unsent:
            return set()
        senders = self.store.member_senders(user_id, unsent)
        return {room_id for room_id, sender in senders.items() if sender != user_id}

    def match(self, user_id: str, listing: Listing, lists: tuple[ListConfig, ...]) -> ListsResult:
        """Each list's count, and the rooms within its ranges."""
        listed, by_id = listing.rooms, listing.by_id
        result = ListsResult({}, {}, by_id)
        needs = _Lookups(self.store, user_id, lists, result.rooms)
        in_lists = [room for room in listed if room.in_lists]
        for config in lists:
            if config.filters == NO_FILTERS:
                kept = in_lists
            else:
                kept = [room for room in in_lists if needs.keeps(config.filters, room)]
            if config.ranges is None:
                picked: list[int] | range = range(len(kept))
            else:
                last = len(kept) - 1
                picked = sorted(
                    {i for lo, hi in config.ranges for i in range(lo, min(hi, last) + 1)}
                )
            for index in picked:
                room = kept[index]
                found = result.matched.get(room.room_id)
                if found is None:
                    result.matched[room.room_id] = Matched(config.config, [config.name])
                else:
                    found.config = found.config.merged(config.config)
                    found.lists.append(config.name)
            result.counts[config.name] = len(kept)
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
