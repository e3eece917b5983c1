"""The authorisation rules of room versions 10 and 11, as pure functions.

Every function here takes an event and the state it is checked against, and touches nothing
else: the same code checks the events we create and, later, PDUs received over federation,
whether against their listed `auth_events` (`check_auth_events`) or against a room state
(`check_against_state`). Rule numbers in comments are those of the room version pages.
Rule 2.3 (an auth event that was itself rejected) is the caller's: only accepted events may
be passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from nacl.exceptions import BadSignatureError
from signedjson.key import decode_verify_key_bytes
from signedjson.sign import SignatureVerifyException, verify_signed_json
from unpaddedbase64 import decode_base64

from homeserver.core.events import Event
from homeserver.core.identifiers import is_valid_user_id, server_of
from homeserver.rooms.versions import KNOWN_ROOM_VERSIONS, RoomVersion

StateKey = tuple[str, str]
StateMap = Mapping[StateKey, Event]
# verify_server_signature(event, server_name) -> bool: is the event validly signed by that
# server? Needed only for restricted joins (`join_authorised_via_users_server`).
SignatureCheck = Callable[[Event, str], bool]

CREATE = "m.room.create"
MEMBER = "m.room.member"
POWER_LEVELS = "m.room.power_levels"
JOIN_RULES = "m.room.join_rules"
THIRD_PARTY_INVITE = "m.room.third_party_invite"

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


class AuthError(Exception):
    """The event is not allowed; the message says which rule refused it."""


# --- auth events selection (server-server spec) ------------------------------------------


def auth_types_for_event(
    version: RoomVersion, event_type: str, sender: str, state_key: str | None, content: dict
) -> list[StateKey]:
    """The (type, state_key) pairs whose current events are this event's `auth_events`."""
    if event_type == CREATE:
        return []
    wanted: list[StateKey] = [(CREATE, ""), (POWER_LEVELS, ""), (MEMBER, sender)]
    if event_type == MEMBER:
        membership = content.get("membership")
        if state_key is not None and state_key != sender:
            wanted.append((MEMBER, state_key))
        if membership in ("join", "invite", "knock"):
            wanted.append((JOIN_RULES, ""))
        if membership == "invite":
            token = _third_party_token(content)
            if token is not None:
                wanted.append((THIRD_PARTY_INVITE, token))
        authoriser = content.get("join_authorised_via_users_server")
        if (
            membership == "join"
            and version.restricted_join_rule
            and isinstance(authoriser, str)
            and authoriser not in (sender, state_key)
        ):
            wanted.append((MEMBER, authoriser))
    return wanted


def select_auth_events(
    version: RoomVersion,
    event_type: str,
    sender: str,
    state_key: str | None,
    content: dict,
    state: StateMap,
) -> list[Event]:
    return [
        state[k]
        for k in auth_types_for_event(version, event_type, sender, state_key, content)
        if k in state
    ]


def _third_party_token(content: dict) -> str | None:
    invite = content.get("third_party_invite")
    if isinstance(invite, dict) and isinstance(invite.get("signed"), dict):
        token = invite["signed"].get("token")
        return token if isinstance(token, str) else None
    return None


# --- entry points -----------------------------------------------------------------------


def check_auth_events(
    version: RoomVersion,
    event: Event,
    auth_events: Iterable[Event],
    verify_server_signature: SignatureCheck | None = None,
) -> None:
    """Checks `event` against the events it lists as `auth_events` (rules 1 to 10)."""
    if event.type == CREATE:
        _check_create(version, event)
        return
    by_key: dict[StateKey, Event] = {}
    for auth_event in auth_events:
        key = (auth_event.type, auth_event.state_key or "")
        if auth_event.state_key is None:
            raise AuthError("auth event is not a state event")
        if key in by_key:
            raise AuthError(f"duplicate auth event for {key}")  # 2.1
        by_key[key] = auth_event
    allowed = set(
        auth_types_for_event(version, event.type, event.sender, event.state_key, event.content)
    )
    for key, auth_event in by_key.items():
        if key not in allowed:
            raise AuthError(f"unexpected auth event {key}")  # 2.2
        if auth_event.room_id != event.room_id:
            raise AuthError("auth event from another room")  # 2.5
    if (CREATE, "") not in by_key:
        raise AuthError("no m.room.create among the auth events")  # 2.4
    _check_rules(version, event, by_key, verify_server_signature)


def check_against_state(
    version: RoomVersion,
    event: Event,
    state: StateMap,
    verify_server_signature: SignatureCheck | None = None,
) -> None:
    """Checks `event` against a room state (the state before it, or the current state)."""
    if event.type == CREATE:
        _check_create(version, event)
        return
    if (CREATE, "") not in state:
        raise AuthError("the room has no m.room.create event")
    auth = {
        k: state[k]
        for k in auth_types_for_event(
            version, event.type, event.sender, event.state_key, event.content
        )
        if k in state
    }
    _check_rules(version, event, auth, verify_server_signature)


# --- the rules --------------------------------------------------------------------------


def _check_create(version: RoomVersion, event: Event) -> None:
    # Rule 1 (v11 drops 1.4, the creator property).
    if event.prev_event_ids:
        raise AuthError("m.room.create must not have prev_events")
    if server_of(event.room_id) != server_of(event.sender):
        raise AuthError("m.room.create sender and room ID are on different servers")
    if "room_version" in event.content and event.content["room_version"] not in KNOWN_ROOM_VERSIONS:
        raise AuthError(f"unknown room version {event.content['room_version']!r}")
    if not version.implicit_room_creator and "creator" not in event.content:
        raise AuthError("m.room.create has no creator")


def _check_rules(
    version: RoomVersion,
    event: Event,
    auth: dict[StateKey, Event],
    verify_server_signature: SignatureCheck | None,
) -> None:
    create = auth[(CREATE, "")]
    # Rule 3: m.federate false keeps other servers out.
    if create.content.get("m.federate", True) is False and server_of(event.sender) != server_of(
        create.sender
    ):
        raise AuthError("this room does not federate")

    if event.type == MEMBER:
        _check_membership(version, event, auth, verify_server_signature)
        return

    sender_membership = _membership(auth, event.sender)
    if sender_membership != "join":
        raise AuthError(f"{event.sender} is not in the room")  # 5

    sender_level = user_power_level(version, event.sender, auth)
    if event.type == THIRD_PARTY_INVITE:  # 6
        if sender_level >= _named_level(auth, "invite", 0):
            return
        raise AuthError("power level too low to invite")

    required = required_power_level(event.type, event.is_state, auth)
    if required > sender_level:  # 7
        raise AuthError(f"sending {event.type} needs power level {required}")

    if (
        event.state_key is not None
        and event.state_key.startswith("@")
        and event.state_key != event.sender
    ):  # 8
        raise AuthError("state keys starting with @ are reserved for that user")

    if event.type == POWER_LEVELS:  # 9
        _check_power_levels(version, event, auth, sender_level)


@dataclass(frozen=True)
class _MemberEvent:
    """An m.room.member event that passed rules 4.1 and 4.2, with what rules 4.3 to 4.7 look
    up about it in the auth state."""

    version: RoomVersion
    event: Event
    auth: dict[StateKey, Event]
    target: str
    sender_membership: str | None
    target_membership: str | None
    join_rule: str | None

    def level(self, user_id: str) -> int:
        """A user's power level in the auth state."""
        return user_power_level(self.version, user_id, self.auth)


def _check_membership(
    version: RoomVersion,
    event: Event,
    auth: dict[StateKey, Event],
    verify_server_signature: SignatureCheck | None,
) -> None:
    target = event.state_key
    membership = event.content.get("membership")
    if target is None or not isinstance(membership, str):  # 4.1
        raise AuthError("m.room.member needs a state_key and content.membership")
    _check_authorising_server(event, verify_server_signature)  # 4.2
    member = _MemberEvent(
        version,
        event,
        auth,
        target,
        _membership(auth, event.sender),
        _membership(auth, target),
        _join_rule(auth),
    )
    rule = _MEMBERSHIP_RULES.get(membership)
    if rule is None:
        raise AuthError(f"unknown membership {membership!r}")  # 4.8
    rule(member)


def _check_authorising_server(event: Event, verify_server_signature: SignatureCheck | None) -> None:
    # Rule 4.2: a restricted join names a member who admitted it, and that member's server
    # must have signed the event.
    authoriser = event.content.get("join_authorised_via_users_server")
    if authoriser is None:
        return
    if not isinstance(authoriser, str) or not is_valid_user_id(authoriser):
        raise AuthError("join_authorised_via_users_server is not a user ID")
    if verify_server_signature is None or not verify_server_signature(event, server_of(authoriser)):
        raise AuthError("join not signed by the authorising server")


def _check_join(member: _MemberEvent) -> None:
    # Rule 4.3.
    event, auth, version = member.event, member.auth, member.version
    create = auth[(CREATE, "")]
    creator = create.sender if version.implicit_room_creator else create.content.get("creator")
    if event.prev_event_ids == [create.event_id] and member.target == creator:
        return  # 4.3.1: the creator's own first join
    if event.sender != member.target:  # 4.3.2
        raise AuthError("cannot join on behalf of another user")
    if member.sender_membership == "ban":  # 4.3.3
        raise AuthError("you are banned from this room")
    _check_join_rule(member)


def _check_join_rule(member: _MemberEvent) -> None:
    # Rules 4.3.4 to 4.3.7: what the room's join rule lets a (not banned) user do.
    version, join_rule = member.version, member.join_rule
    if join_rule in ("invite", "knock") and (
        join_rule == "invite" or version.knock_join_rule
    ):  # 4.3.4
        if member.sender_membership in ("invite", "join"):
            return
        raise AuthError("you are not invited to this room")
    if (join_rule == "restricted" and version.restricted_join_rule) or (
        join_rule == "knock_restricted" and version.knock_restricted_join_rule
    ):  # 4.3.5
        if member.sender_membership in ("join", "invite"):
            return
        authoriser = member.event.content.get("join_authorised_via_users_server")
        if (
            not isinstance(authoriser, str)
            or _membership(member.auth, authoriser) != "join"
            or member.level(authoriser) < _named_level(member.auth, "invite", 0)
        ):
            raise AuthError("join is not authorised by a member who may invite")
        return
    if join_rule == "public":  # 4.3.6
        return
    raise AuthError(f"cannot join a room whose join rule is {join_rule!r}")  # 4.3.7


def _check_invite(member: _MemberEvent) -> None:
    # Rule 4.4.
    event, target_membership = member.event, member.target_membership
    if "third_party_invite" in event.content:  # 4.4.1
        _check_third_party_invite(event, member.auth, target_membership)
        return
    if member.sender_membership != "join":  # 4.4.2
        raise AuthError("you are not in the room")
    if target_membership in ("join", "ban"):  # 4.4.3
        raise AuthError(
            f"{member.target} is already "
            f"{'in the room' if target_membership == 'join' else 'banned'}"
        )
    if member.level(event.sender) >= _named_level(member.auth, "invite", 0):  # 4.4.4
        return
    raise AuthError("power level too low to invite")


def _check_leave(member: _MemberEvent) -> None:
    # Rule 4.5: leaving, or (sent by another user) a kick or an unban.
    event, auth = member.event, member.auth
    if event.sender == member.target:  # 4.5.1
        if member.sender_membership in ("invite", "join", "knock"):
            return
        raise AuthError("you are not in the room")
    if member.sender_membership != "join":  # 4.5.2
        raise AuthError("you are not in the room")
    sender_level = member.level(event.sender)
    if member.target_membership == "ban" and sender_level < _named_level(auth, "ban", 50):
        raise AuthError("power level too low to unban")  # 4.5.3
    if (
        sender_level >= _named_level(auth, "kick", 50)
        and member.level(member.target) < sender_level
    ):  # 4.5.4
        return
    raise AuthError("power level too low to kick this user")


def _check_ban(member: _MemberEvent) -> None:
    # Rule 4.6.
    if member.sender_membership != "join":
        raise AuthError("you are not in the room")
    sender_level = member.level(member.event.sender)
    if (
        sender_level >= _named_level(member.auth, "ban", 50)
        and member.level(member.target) < sender_level
    ):
        return
    raise AuthError("power level too low to ban this user")


def _check_knock(member: _MemberEvent) -> None:
    # Rule 4.7: only rooms whose join rule takes knocks, and only for oneself.
    version = member.version
    knock_rules = ["knock"] if version.knock_join_rule else []
    if version.knock_restricted_join_rule:
        knock_rules.append("knock_restricted")
    if member.join_rule not in knock_rules:
        raise AuthError("this room does not accept knocks")
    if member.event.sender != member.target:
        raise AuthError("cannot knock on behalf of another user")
    if member.sender_membership not in ("ban", "invite", "join"):
        return
    raise AuthError("you cannot knock on this room")


_MEMBERSHIP_RULES: dict[str, Callable[[_MemberEvent], None]] = {
    "join": _check_join,
    "invite": _check_invite,
    "leave": _check_leave,
    "ban": _check_ban,
    "knock": _check_knock,
}


def _check_third_party_invite(
    event: Event, auth: dict[StateKey, Event], target_membership: str | None
) -> None:
    # Rule 4.4.1: an invite that redeems an m.room.third_party_invite.
    if target_membership == "ban":
        raise AuthError("the invited user is banned")
    signed = _third_party_signed(event)
    tpi = auth.get((THIRD_PARTY_INVITE, signed["token"]))
    if tpi is None:
        raise AuthError("no matching m.room.third_party_invite")
    if tpi.sender != event.sender:
        raise AuthError("third_party_invite was sent by another user")
    signatures = signed.get("signatures")
    if not isinstance(signatures, dict):
        raise AuthError("third_party_invite.signed has no signatures")
    if not _signed_by_any(signed, signatures, _third_party_public_keys(tpi)):
        raise AuthError("no valid signature on third_party_invite")


def _third_party_signed(event: Event) -> dict:
    """The invite's `signed` block, once it is known to be for this event's target."""
    invite = event.content["third_party_invite"]
    signed = invite.get("signed") if isinstance(invite, dict) else None
    if not isinstance(signed, dict):
        raise AuthError("third_party_invite has no signed block")
    mxid, token = signed.get("mxid"), signed.get("token")
    if not isinstance(mxid, str) or not isinstance(token, str):
        raise AuthError("third_party_invite.signed needs mxid and token")
    if mxid != event.state_key:
        raise AuthError("third_party_invite is for another user")
    return signed


def _third_party_public_keys(tpi: Event) -> list[str]:
    # The m.room.third_party_invite's `public_key`, then those listed in `public_keys`.
    keys = []
    if isinstance(tpi.content.get("public_key"), str):
        keys.append(tpi.content["public_key"])
    for entry in tpi.content.get("public_keys") or []:
        if isinstance(entry, dict) and isinstance(entry.get("public_key"), str):
            keys.append(entry["public_key"])
    return keys


def _signed_by_any(signed: dict, signatures: dict, keys: list[str]) -> bool:
    """Does any signature on `signed` verify with any of the public keys?"""
    for server, server_sigs in signatures.items():
        if not isinstance(server_sigs, dict):
            continue
        for key_id in server_sigs:
            for public_key in keys:
                try:
                    verify_key = decode_verify_key_bytes(key_id, decode_base64(public_key))
                    verify_signed_json(signed, server, verify_key)
                    return True
                except (SignatureVerifyException, BadSignatureError, ValueError):
                    continue
    return False


def _check_power_levels(
    version: RoomVersion, event: Event, auth: dict[StateKey, Event], sender_level: int
) -> None:
    new = event.content
    _check_power_levels_format(version, new)  # 9.1 to 9.3
    old_event = auth.get((POWER_LEVELS, ""))
    if old_event is None:  # 9.4
        return
    old = old_event.content
    _check_named_level_changes(old, new, sender_level)  # 9.5
    _check_level_map_changes(old, new, sender_level)  # 9.6, 9.7
    _check_user_level_changes(old, new, event.sender, sender_level)  # 9.8, 9.9


def _check_power_levels_format(version: RoomVersion, new: dict) -> None:
    if version.integer_power_levels:
        for key in _PL_INT_KEYS:  # 9.1
            if key in new and not _is_int(new[key]):
                raise AuthError(f"power levels: {key} must be an integer")
        for key in _PL_MAP_KEYS:  # 9.2
            if key in new and not (
                isinstance(new[key], dict) and all(_is_int(v) for v in new[key].values())
            ):
                raise AuthError(f"power levels: {key} must map to integers")
    users = new.get("users", {})
    if not isinstance(users, dict) or not all(
        is_valid_user_id(u) and _is_int(v) for u, v in users.items()
    ):  # 9.3
        raise AuthError("power levels: users must map user IDs to integers")


def _check_named_level_changes(old: dict, new: dict, sender_level: int) -> None:
    for key in _PL_INT_KEYS:  # 9.5
        if old.get(key) != new.get(key):
            for value in (old.get(key), new.get(key)):
                if value is not None and _as_int(value) > sender_level:
                    raise AuthError(f"power levels: cannot change {key} above your own level")


def _check_level_map_changes(old: dict, new: dict, sender_level: int) -> None:
    for key in _PL_MAP_KEYS:
        old_map, new_map = old.get(key) or {}, new.get(key) or {}
        for name in set(old_map) | set(new_map):
            if old_map.get(name) == new_map.get(name):
                continue
            if name in old_map and _as_int(old_map[name]) > sender_level:  # 9.6
                raise AuthError(f"power levels: cannot change {key}.{name}")
            if name in new_map and _as_int(new_map[name]) > sender_level:  # 9.7
                raise AuthError(f"power levels: cannot raise {key}.{name} above your level")


def _check_user_level_changes(old: dict, new: dict, sender: str, sender_level: int) -> None:
    users = new.get("users", {})
    old_users = old.get("users") or {}
    for user in set(old_users) | set(users):
        if old_users.get(user) == users.get(user):
            continue
        if user != sender and user in old_users and _as_int(old_users[user]) >= sender_level:  # 9.8
            raise AuthError(f"power levels: cannot change the level of {user}")
        if user in users and _as_int(users[user]) > sender_level:  # 9.9
            raise AuthError("power levels: cannot give a level above your own")


# --- power levels and membership lookups ------------------------------------------------


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_int(value) -> int:
    """A power level value; older room versions allowed numeric strings."""
    if _is_int(value):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        return 0


def _membership(auth: Mapping[StateKey, Event], user_id: str) -> str | None:
    event = auth.get((MEMBER, user_id))
    return event.membership if event is not None else None


def _join_rule(auth: Mapping[StateKey, Event]) -> str | None:
    event = auth.get((JOIN_RULES, ""))
    return event.content.get("join_rule") if event is not None else None


def _named_level(auth: Mapping[StateKey, Event], name: str, default: int) -> int:
    """The invite, kick, ban or redact level."""
    event = auth.get((POWER_LEVELS, ""))
    if event is None or name not in event.content:
        return default
    return _as_int(event.content[name])


def user_power_level(version: RoomVersion, user_id: str, state: Mapping[StateKey, Event]) -> int:
    power_levels = state.get((POWER_LEVELS, ""))
    if power_levels is not None:
        users = power_levels.content.get("users") or {}
        if isinstance(users, dict) and user_id in users:
            return _as_int(users[user_id])
        return _as_int(power_levels.content.get("users_default", 0))
    # No power levels yet: the creator has 100, everyone else 0.
    create = state.get((CREATE, ""))
    if create is None:
        return 0
    creator = create.sender if version.implicit_room_creator else create.content.get("creator")
    return 100 if user_id == creator else 0


def required_power_level(event_type: str, is_state: bool, state: Mapping[StateKey, Event]) -> int:
    power_levels = state.get((POWER_LEVELS, ""))
    if power_levels is None:
        return 0  # state_default is 0, not 50, when there is no power levels event at all
    content = power_levels.content
    events = content.get("events") or {}
    if isinstance(events, dict) and event_type in events:
        return _as_int(events[event_type])
    if is_state:
        return _as_int(content.get("state_default", 50))
    return _as_int(content.get("events_default", 0))
