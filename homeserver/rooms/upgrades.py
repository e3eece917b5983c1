"""Room upgrades: `POST /rooms/{roomId}/upgrade` replaces a room with a new one of another
version (client-server spec, "Room Upgrades"; what moves over follows Synapse's choices).

The new room is planned like a createRoom (rooms/creation.py): its create event names the
old room as `predecessor`, it takes over the old room's transferable state and its bans, and
its creation's transaction moves our aliases and directory entry to it. Then the old room
gets its `m.room.tombstone`, loses our aliases from its canonical alias event, and has its
`events_default` and `invite` levels raised so ordinary members can no longer talk there.
Members follow the tombstone themselves; the federation sender takes it to other servers.

Before v12 the create event's `predecessor` also names the tombstone, so the tombstone is
built first, and stored once the new room is (`RoomService.append_built_first`). In v12 the
room ID is the create event's, so the new room comes first and the tombstone names it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from homeserver.core.errors import Codes, MatrixError, invalid_param, not_found
from homeserver.core.events import Event
from homeserver.core.identifiers import is_valid_user_id, new_room_id, server_of
from homeserver.core.requester import Requester
from homeserver.rooms.creation import CreateRoomRequest, plan_room, supported_version
from homeserver.rooms.planned import PlannedEvent
from homeserver.rooms.power_levels import (
    CREATOR_POWER_LEVEL,
    POWER_LEVELS,
    as_int,
    is_level,
    user_power_level,
)
from homeserver.rooms.service import RoomService
from homeserver.rooms.versions import RoomVersion

log = logging.getLogger(__name__)

CREATE = "m.room.create"
TOMBSTONE = "m.room.tombstone"
CANONICAL_ALIAS = "m.room.canonical_alias"
SPACE_CHILD = "m.space.child"
# The state a replacement room takes over (Synapse's list).
COPIED_STATE = (
    "m.room.join_rules",
    "m.room.name",
    "m.room.topic",
    "m.room.history_visibility",
    "m.room.guest_access",
    "m.room.avatar",
    "m.room.encryption",
    "m.room.server_acl",
    POWER_LEVELS,
)
_REPLACED = "This room has been replaced"


@dataclass(frozen=True)
class OldRoom:
    """What an upgrade reads of the room it replaces."""

    room_id: str
    version: RoomVersion
    state: dict  # (type, state_key) -> Event: the copied state, the create and alias events
    bans: list[Event]


@dataclass(frozen=True)
class Levels:
    """The new room's power levels: `start`, which lets the upgrader copy everything, and
    `end`, the old room's, put back once it has. None: the old room had none."""

    start: dict | None
    end: dict | None


@dataclass(frozen=True)
class Upgrade:
    old: OldRoom
    version: RoomVersion  # the new room's
    requester: Requester
    creators: tuple[str, ...]  # the new room's, when its version has creators above all
    levels: Levels


class RoomUpgrader:
    def __init__(self, rooms: RoomService, directory, server_name: str):
        self.rooms = rooms
        # directory/service.py's DirectoryService (a layer above): moves aliases and listing.
        self.directory = directory
        self.server_name = server_name
        self._upgrading: set[str] = set()

    def upgrade(
        self,
        requester: Requester,
        room_id: str,
        new_version: str,
        additional_creators: tuple[str, ...] = (),
    ) -> str:
        """The replacement room's ID. 400 for an unknown version, 404 unless the user is
        joined, 403 unless they may send the tombstone (the auth rules decide)."""
        version = supported_version(new_version)
        user_id = requester.user_id
        if not self.rooms.room_exists(room_id) or self.rooms.membership(room_id, user_id) != "join":
            raise not_found("Unknown room")
        creators = new_creators(version, user_id, additional_creators)
        # Built and checked, never stored: may this user send the tombstone?
        self.rooms.prepare_event(room_id, PlannedEvent(user_id, TOMBSTONE, {}, ""))
        if room_id in self._upgrading:
            raise MatrixError(400, Codes.UNKNOWN, "An upgrade of this room is under way")
        self._upgrading.add(room_id)
        try:
            old = self._read(room_id)
            levels = new_room_levels(old, version, user_id, creators)
            upgrade = Upgrade(old, version, requester, creators, levels)
            new_room = self._replace(upgrade)
            self._after_tombstone(upgrade, new_room)
            return new_room
        finally:
            self._upgrading.discard(room_id)

    def _read(self, room_id: str) -> OldRoom:
        store = self.rooms.store
        keys = [(t, "") for t in (CREATE, CANONICAL_ALIAS, *COPIED_STATE)]
        state = {k: s.event for k, s in store.current_state(room_id, keys).items()}
        if state[(CREATE, "")].content.get("type") == "m.space":
            # A space's children move with it (an emptied link is a removed child).
            children = store.current_state(room_id, event_type=SPACE_CHILD)
            state.update({k: s.event for k, s in children.items() if s.event.content})
        bans = [s.event for s in store.current_bans(room_id)]
        return OldRoom(room_id, self.rooms.room_version(room_id), state, bans)

    def _replace(self, upgrade: Upgrade) -> str:
        """Creates the replacement room and sends the old room's tombstone."""
        old, user_id = upgrade.old, upgrade.requester.user_id
        predecessor = {"room_id": old.room_id}
        if upgrade.version.room_id_is_create_event_id:
            new_room = self._create(upgrade, predecessor, None)
            content = {"body": _REPLACED, "replacement_room": new_room}
            self.rooms.set_state(upgrade.requester, old.room_id, TOMBSTONE, "", content)
            return new_room
        chosen = new_room_id(self.server_name)

        def create(tombstone: Event) -> None:
            self._create(upgrade, {**predecessor, "event_id": tombstone.event_id}, chosen)

        content = {"body": _REPLACED, "replacement_room": chosen}
        self.rooms.append_built_first(
            old.room_id, PlannedEvent(user_id, TOMBSTONE, content, ""), create
        )
        return chosen

    def _create(self, upgrade: Upgrade, predecessor: dict, chosen_id: str | None) -> str:
        old, version, user_id = upgrade.old, upgrade.version, upgrade.requester.user_id
        initial = [
            {"type": t, "state_key": k, "content": e.content}
            for (t, k), e in old.state.items()
            if t != POWER_LEVELS and (t in COPIED_STATE or t == SPACE_CHILD)
        ]
        if upgrade.levels.start is not None:  # None: the old room had none, plan_room's own
            initial.append({"type": POWER_LEVELS, "state_key": "", "content": upgrade.levels.start})
        ours, _ = self._split_aliases(old)
        if ours:
            initial.append({"type": CANONICAL_ALIAS, "state_key": "", "content": ours})
        request = CreateRoomRequest(
            # The preset only fills in join rules, history visibility or guest access that
            # the old room never set.
            preset="private_chat",
            creation_content=creation_content(old, version, predecessor, upgrade.creators),
            initial_state=tuple(initial),
        )
        planned = plan_room(version, user_id, request, None)
        planned += [
            PlannedEvent(user_id, "m.room.member", {**ban.content, "membership": "ban"}, target)
            for ban in old.bans
            if (target := ban.state_key) is not None and may_ban(upgrade, target)
        ]
        return self.rooms.create_room(
            version,
            user_id,
            planned,
            lambda new_room: [self.directory.move_writer(old.room_id, new_room)],
            chosen_id,
        )

    def _split_aliases(self, old: OldRoom) -> tuple[dict, dict]:
        """The canonical alias content split in two: our aliases (for the new room) and the
        others (left to the old room). Both empty without a canonical alias event."""
        event = old.state.get((CANONICAL_ALIAS, ""))
        if event is None:
            return {}, {}
        ours, rest = {}, dict(event.content)
        alias = event.content.get("alias")
        if isinstance(alias, str) and self._is_ours(alias):
            ours["alias"] = rest.pop("alias")
        alt = event.content.get("alt_aliases")
        if isinstance(alt, list):
            ours_alt = [a for a in alt if isinstance(a, str) and self._is_ours(a)]
            if ours_alt:
                ours["alt_aliases"] = ours_alt
            rest["alt_aliases"] = [a for a in alt if a not in ours_alt]
            if not rest["alt_aliases"]:
                del rest["alt_aliases"]
        return ours, rest

    def _is_ours(self, alias: str) -> bool:
        return ":" in alias and server_of(alias) == self.server_name

    def _after_tombstone(self, upgrade: Upgrade, new_room: str) -> None:
        """The old room keeps no alias of ours and silences its ordinary members; the new
        room gets the old power levels back. The upgrade has happened by now: a step the
        rules refuse (an upgrader who may send the tombstone but not change power levels)
        is logged, as Synapse does, and the others still go."""
        old = upgrade.old
        ours, rest = self._split_aliases(old)
        steps = [(old.room_id, CANONICAL_ALIAS, rest)] if ours else []
        old_levels = old.state.get((POWER_LEVELS, ""))
        restricted = restrict_levels(old_levels.content) if old_levels is not None else None
        if restricted is not None:
            steps.append((old.room_id, POWER_LEVELS, restricted))
        levels = upgrade.levels
        if levels.end is not None and levels.end != levels.start:
            steps.append((new_room, POWER_LEVELS, levels.end))
        for room_id, event_type, content in steps:
            try:
                self.rooms.set_state(upgrade.requester, room_id, event_type, "", content)
            except MatrixError as e:
                log.warning("upgrade: %s not sent in %s: %s", event_type, room_id, e)


def new_creators(version: RoomVersion, user_id: str, additional: tuple[str, ...]) -> tuple:
    """The new room's creators where the version makes them all-powerful: the upgrader and
    the `additional_creators` asked for (the old room's are not carried over, as the spec
    says). Other versions ignore `additional_creators`."""
    if not version.creators_have_infinite_power:
        return ()
    for user in additional:
        if not is_valid_user_id(user):
            raise invalid_param(f"Not a valid user ID in additional_creators: {user}")
    return tuple(dict.fromkeys([user_id, *additional]))


def creation_content(
    old: OldRoom, version: RoomVersion, predecessor: dict, creators: tuple
) -> dict:
    """The new create event's content (room_version and creator are plan_room's): the
    predecessor, the new room's other creators, and the old room's type and m.federate."""
    content: dict = {"predecessor": predecessor}
    if creators[1:]:
        content["additional_creators"] = list(creators[1:])
    old_create = old.state[(CREATE, "")].content
    if "type" in old_create:
        content["type"] = old_create["type"]
    if old_create.get("m.federate", True) is False:
        content["m.federate"] = False
    return content


def integer_levels(version: RoomVersion, content: dict) -> dict:
    """A power levels content as integers: older versions allowed numeric strings, newer
    ones refuse them; anything that is no level is left out."""
    fixed: dict = {}
    for key, value in content.items():
        if isinstance(value, dict):
            fixed[key] = {k: as_int(v) for k, v in value.items() if is_level(version, v)}
        elif is_level(version, value):
            fixed[key] = as_int(value)
    return fixed


def new_room_levels(old: OldRoom, version: RoomVersion, user_id: str, creators: tuple) -> Levels:
    """The old room's levels for the new room, with the upgrader raised, while the new room
    is set up, to the most any state event or a ban needs. Where creators are above every
    level they may not be listed; where they are not, an old room's creator keeps that top
    level for good, as a number."""
    event = old.state.get((POWER_LEVELS, ""))
    if event is None:
        return Levels(None, None)
    end = integer_levels(old.version, event.content)
    users = {k: v for k, v in end.get("users", {}).items() if k not in creators}
    events = end.get("events", {})
    needed = max(end.get("state_default", 50), end.get("ban", 50), *events.values())
    had = user_power_level(old.version, user_id, old.state)
    if had >= CREATOR_POWER_LEVEL and not creators:
        users[user_id] = max(100, needed)
    end = {**end, "users": users}
    if creators or users.get(user_id, end.get("users_default", 0)) >= needed:
        return Levels(end, end)
    return Levels({**end, "users": {**users, user_id: needed}}, end)


def restrict_levels(content: dict) -> dict | None:
    """The old room's levels with `events_default` and `invite` raised to at least 50, and
    above `users_default` (as Synapse does), or None when they are that high already."""
    restricted_level = max(50, as_int(content.get("users_default", 0)) + 1)
    raised = {
        key: restricted_level
        for key in ("events_default", "invite")
        if as_int(content.get(key, 0)) < restricted_level
    }
    return {**content, **raised} if raised else None


def may_ban(upgrade: Upgrade, target: str) -> bool:
    """Whether the upgrader can carry a ban over: the auth rules refuse a ban of a creator,
    or of a user at or above the upgrader's level."""
    user_id = upgrade.requester.user_id
    if target == user_id or target in upgrade.creators:
        return False
    if upgrade.creators:
        return True
    levels = upgrade.levels.start
    if levels is None:
        return True  # plan_room's defaults: the upgrader at 100, everyone else at 0
    users, default = levels.get("users", {}), levels.get("users_default", 0)
    return users.get(target, default) < users.get(user_id, default)
