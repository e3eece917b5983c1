"""Power levels: who has which level, what an event type needs, and the authorisation rule
for m.room.power_levels events (rule 9 of the v10 and v11 pages, rule 10 of v12's).

Room version 12 makes the room's creators (the create event's sender and its content's
`additional_creators`) infinitely powerful: `CREATOR_POWER_LEVEL` stands for infinity, and
power levels may not list a creator in `users`.
"""

from __future__ import annotations

import re
from typing import Mapping

from homeserver.core.events import Event
from homeserver.core.identifiers import is_valid_user_id
from homeserver.rooms.versions import RoomVersion

StateKey = tuple[str, str]

CREATE = "m.room.create"
POWER_LEVELS = "m.room.power_levels"

# Above every level an event can carry (canonical JSON integers stop at 2**53 - 1), so it
# compares as infinity does: two creators are equal, a creator outranks everyone else.
CREATOR_POWER_LEVEL = 2**53

_PL_INT_KEYS = (
    "users_default",
    "events_default",
    "state_default",
    "ban",
    "redact",
    "kick",
    "invite",
)
_PL_MAP_KEYS = ("events", "notifications")


class PowerLevelsError(Exception):
    """A power levels event that breaks rule 10 (the auth rules turn it into AuthError)."""


# --- creators ---------------------------------------------------------------------------


def room_creators(version: RoomVersion, create: Event) -> frozenset[str]:
    """The room's creators: the create event's sender (or, before v11, its `creator`), and
    in v12 the users in `additional_creators`."""
    creator = create.sender if version.implicit_room_creator else create.content.get("creator")
    creators = {creator} if isinstance(creator, str) else set()
    if version.creators_have_infinite_power:
        extra = create.content.get("additional_creators")
        if isinstance(extra, list):
            creators.update(u for u in extra if isinstance(u, str))
    return frozenset(creators)


def check_additional_creators(value) -> None:
    """v12 rule 1.4: `additional_creators` is an array of valid user IDs."""
    if not isinstance(value, list) or not all(
        isinstance(u, str) and is_valid_user_id(u) for u in value
    ):
        raise PowerLevelsError("additional_creators must be an array of user IDs")


# --- lookups ----------------------------------------------------------------------------


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Before v10 a level may be a string holding an integer ("50", " -5 ").
_INTEGER_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*")


def is_level(version: RoomVersion, value) -> bool:
    """A power level value the version allows: an integer, or before v10 its text too."""
    if is_int(value):
        return True
    return not version.integer_power_levels and (
        isinstance(value, str) and _INTEGER_TEXT.fullmatch(value) is not None
    )


def as_int(value) -> int:
    """A power level value; older room versions allowed numeric strings."""
    if is_int(value):
        return value
    if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value):
        return int(value)
    return 0


def named_level(state: Mapping[StateKey, Event], name: str, default: int) -> int:
    """The invite, kick, ban or redact level."""
    event = state.get((POWER_LEVELS, ""))
    if event is None or name not in event.content:
        return default
    return as_int(event.content[name])


def user_power_level(version: RoomVersion, user_id: str, state: Mapping[StateKey, Event]) -> int:
    create = state.get((CREATE, ""))
    creators = room_creators(version, create) if create is not None else frozenset()
    if version.creators_have_infinite_power and user_id in creators:
        return CREATOR_POWER_LEVEL
    power_levels = state.get((POWER_LEVELS, ""))
    if power_levels is not None:
        users = power_levels.content.get("users") or {}
        if isinstance(users, dict) and user_id in users:
            return as_int(users[user_id])
        return as_int(power_levels.content.get("users_default", 0))
    # No power levels yet: the creator has 100, everyone else 0.
    return 100 if user_id in creators else 0


def required_power_level(event_type: str, is_state: bool, state: Mapping[StateKey, Event]) -> int:
    power_levels = state.get((POWER_LEVELS, ""))
    if power_levels is None:
        return 0  # state_default is 0, not 50, when there is no power levels event at all
    content = power_levels.content
    events = content.get("events") or {}
    if isinstance(events, dict) and event_type in events:
        return as_int(events[event_type])
    if is_state:
        return as_int(content.get("state_default", 50))
    return as_int(content.get("events_default", 0))


# --- the m.room.power_levels rule -------------------------------------------------------


def check_power_levels(
    version: RoomVersion, event: Event, state: Mapping[StateKey, Event], sender_level: int
) -> None:
    """Rule 10 (v12 numbering; 9 before it). Raises PowerLevelsError."""
    new = event.content
    _check_format(version, new)  # 10.1 to 10.3
    if version.creators_have_infinite_power:  # 10.4
        listed = set(new.get("users") or {}) & room_creators(version, state[(CREATE, "")])
        if listed:
            raise PowerLevelsError(f"power levels: creators may not be listed in users: {listed}")
    old_event = state.get((POWER_LEVELS, ""))
    if old_event is None:  # 10.5
        return
    old = old_event.content
    _check_named_level_changes(old, new, sender_level)  # 10.6
    _check_level_map_changes(version, old, new, sender_level)  # 10.7, 10.8
    _check_user_level_changes(old, new, event.sender, sender_level)  # 10.9, 10.10


def _check_format(version: RoomVersion, new: dict) -> None:
    if version.integer_power_levels:
        for key in _PL_INT_KEYS:
            if key in new and not is_int(new[key]):
                raise PowerLevelsError(f"power levels: {key} must be an integer")
        for key in _PL_MAP_KEYS:
            if key in new and not (
                isinstance(new[key], dict) and all(is_int(v) for v in new[key].values())
            ):
                raise PowerLevelsError(f"power levels: {key} must map to integers")
    users = new.get("users", {})
    if not isinstance(users, dict) or not all(
        is_valid_user_id(u) and is_level(version, v) for u, v in users.items()
    ):
        raise PowerLevelsError("power levels: users must map user IDs to integers")


def _check_named_level_changes(old: dict, new: dict, sender_level: int) -> None:
    for key in _PL_INT_KEYS:
        if old.get(key) != new.get(key):
            for value in (old.get(key), new.get(key)):
                if value is not None and as_int(value) > sender_level:
                    raise PowerLevelsError(
                        f"power levels: cannot change {key} above your own level"
                    )


def _check_level_map_changes(version: RoomVersion, old: dict, new: dict, sender_level: int) -> None:
    # `notifications` is checked from v6 on; before, anyone allowed to send power levels
    # could change it.
    for key in _PL_MAP_KEYS if version.notifications_power_levels else ("events",):
        old_map, new_map = old.get(key) or {}, new.get(key) or {}
        for name in set(old_map) | set(new_map):
            if old_map.get(name) == new_map.get(name):
                continue
            if name in old_map and as_int(old_map[name]) > sender_level:
                raise PowerLevelsError(f"power levels: cannot change {key}.{name}")
            if name in new_map and as_int(new_map[name]) > sender_level:
                raise PowerLevelsError(f"power levels: cannot raise {key}.{name} above your level")


def _check_user_level_changes(old: dict, new: dict, sender: str, sender_level: int) -> None:
    users = new.get("users", {})
    old_users = old.get("users") or {}
    for user in set(old_users) | set(users):
        if old_users.get(user) == users.get(user):
            continue
        if user != sender and user in old_users and as_int(old_users[user]) >= sender_level:
            raise PowerLevelsError(f"power levels: cannot change the level of {user}")
        if user in users and as_int(users[user]) > sender_level:
            raise PowerLevelsError("power levels: cannot give a level above your own")
