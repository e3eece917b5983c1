"""The authorisation rules of room versions 10, 11 and 12, as pure functions.

Every function here takes an event and the state it is checked against, and touches nothing
else: the same code checks the events we create and PDUs received over federation, whether
against their auth events (`check_auth_events`) or against a room state
(`check_against_state`). Rule numbers in comments are those of the room version 12 page;
v10 and v11 lack its rule 2, so their later rules are numbered one lower. Rule 3.3 (an auth
event that was itself rejected) is the caller's: only accepted events may be passed in.

In v12 the create event is never listed in `auth_events`: the room ID names it. The rules
still need it, so the events to check against are those of `auth_event_ids_to_check`.
Power levels are `power_levels.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from nacl.exceptions import BadSignatureError
from signedjson.key import decode_verify_key_bytes
from signedjson.sign import SignatureVerifyException, verify_signed_json
from unpaddedbase64 import decode_base64

from homeserver.core.events import Event
from homeserver.core.identifiers import create_event_id_for_room, is_valid_user_id, server_of
from homeserver.rooms.power_levels import (
    PowerLevelsError,
    check_additional_creators,
    check_power_levels,
    named_level,
    required_power_level,
    user_power_level,
)
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
# The only types an auth event can have (server-server spec, "Auth events selection").
AUTH_EVENT_TYPES = frozenset({CREATE, MEMBER, POWER_LEVELS, JOIN_RULES, THIRD_PARTY_INVITE})


class AuthError(Exception):
    """The event is not allowed; the message says which rule refused it."""


# --- auth events selection (server-server spec) ------------------------------------------


def auth_types_for_event(
    version: RoomVersion, event_type: str, sender: str, state_key: str | None, content: dict
) -> list[StateKey]:
    """The (type, state_key) pairs of the state the auth rules look at for this event: its
    `auth_events`, and in v12 the create event too (see `select_auth_events`)."""
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
    """The events to list as a new event's `auth_events` (server-server spec, "Auth events
    selection"): never the create event in v12, whose room ID names it."""
    return [
        state[k]
        for k in auth_types_for_event(version, event_type, sender, state_key, content)
        if k in state and not (k == (CREATE, "") and version.room_id_is_create_event_id)
    ]


def auth_event_ids_to_check(version: RoomVersion, event: Event) -> list[str]:
    """The IDs of the events `check_auth_events` needs for `event`: its `auth_events`, and in
    v12 the create event its room ID names (none for a create event)."""
    ids = list(event.auth_event_ids)
    if version.room_id_is_create_event_id and event.type != CREATE:
        ids.append(create_event_id_for_room(event.room_id))
    return ids


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
    """Checks `event` against its auth events: `auth_events` are the events whose IDs
    `auth_event_ids_to_check` gives (in v12, those listed plus the room's create event)."""
    if event.type == CREATE:
        _check_create(version, event)
        return
    if version.room_id_is_create_event_id and any(
        e == create_event_id_for_room(event.room_id) for e in event.auth_event_ids
    ):
        raise AuthError("auth_events must not list the m.room.create event")  # 3.2
    by_key: dict[StateKey, Event] = {}
    for auth_event in auth_events:
        key = (auth_event.type, auth_event.state_key or "")
        if auth_event.state_key is None:
            raise AuthError("auth event is not a state event")
        if key in by_key:
            raise AuthError(f"duplicate auth event for {key}")  # 3.1
        by_key[key] = auth_event
    allowed = set(
        auth_types_for_event(version, event.type, event.sender, event.state_key, event.content)
    )
    for key, auth_event in by_key.items():
        if key not in allowed:
            raise AuthError(f"unexpected auth event {key}")  # 3.2
        if auth_event.room_id != event.room_id:
            raise AuthError("auth event from another room")  # 3.5
    if (CREATE, "") not in by_key:
        raise AuthError("no m.room.create among the auth events")  # v10 and v11 rule 2.4
    _check_room_id_names_create(version, event, by_key[(CREATE, "")])  # 2
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
    _check_room_id_names_create(version, event, state[(CREATE, "")])
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
    # Rule 1 (v11 drops the creator property, v12 the room ID and adds additional_creators).
    if event.prev_event_ids:
        raise AuthError("m.room.create must not have prev_events")  # 1.1
    if version.room_id_is_create_event_id:
        if "room_id" in event.pdu:  # 1.2: the create event's ID is the room ID
            raise AuthError("m.room.create must not have a room_id")
    elif server_of(event.room_id) != server_of(event.sender):
        raise AuthError("m.room.create sender and room ID are on different servers")
    if "room_version" in event.content and event.content["room_version"] not in KNOWN_ROOM_VERSIONS:
        raise AuthError(f"unknown room version {event.content['room_version']!r}")  # 1.3
    if not version.implicit_room_creator and "creator" not in event.content:
        raise AuthError("m.room.create has no creator")
    if version.creators_have_infinite_power and "additional_creators" in event.content:
        try:
            check_additional_creators(event.content["additional_creators"])  # 1.4
        except PowerLevelsError as e:
            raise AuthError(str(e)) from None


def _check_room_id_names_create(version: RoomVersion, event: Event, create: Event) -> None:
    # v12 rule 2: the room ID is the create event's ID, with `!` for `$`.
    if version.room_id_is_create_event_id and create.event_id != create_event_id_for_room(
        event.room_id
    ):
        raise AuthError("the room ID does not name this room's m.room.create event")


def _check_rules(
    version: RoomVersion,
    event: Event,
    auth: dict[StateKey, Event],
    verify_server_signature: SignatureCheck | None,
) -> None:
    if _allowed_before_membership(version, event, auth[(CREATE, "")]):
        return

    if event.type == MEMBER:
        _check_membership(version, event, auth, verify_server_signature)
        return

    sender_membership = _membership(auth, event.sender)
    if sender_membership != "join":
        raise AuthError(f"{event.sender} is not in the room")  # 6

    sender_level = user_power_level(version, event.sender, auth)
    if event.type == THIRD_PARTY_INVITE:  # 7
        if sender_level >= named_level(auth, "invite", 0):
            return
        raise AuthError("power level too low to invite")

    required = required_power_level(event.type, event.is_state, auth)
    if required > sender_level:  # 8
        raise AuthError(f"sending {event.type} needs power level {required}")

    if (
        event.state_key is not None
        and event.state_key.startswith("@")
        and event.state_key != event.sender
    ):  # 9
        raise AuthError("state keys starting with @ are reserved for that user")

    _check_type_rules(version, event, auth, sender_level)


def _check_type_rules(
    version: RoomVersion, event: Event, auth: dict[StateKey, Event], sender_level: int
) -> None:
    """Rule 10, power levels; in room versions 1 and 2, rule 11, redactions."""
    if event.type == POWER_LEVELS:
        try:
            check_power_levels(version, event, auth, sender_level)
        except PowerLevelsError as e:
            raise AuthError(str(e)) from None
    elif event.type == "m.room.redaction" and not version.event_id_is_reference_hash:
        # The redact level, or the same server in both IDs.
        redacts = event.pdu.get("redacts")
        same = isinstance(redacts, str) and server_of(redacts) == server_of(event.event_id)
        if not same and sender_level < named_level(auth, "redact", 50):
            raise AuthError("redacting another server's event needs the redact power level")


def _allowed_before_membership(version: RoomVersion, event: Event, create: Event) -> bool:
    """The rules before the membership rules: True if one allows the event outright."""
    # Rule 4 (3 before v12): m.federate false keeps other servers out.
    if create.content.get("m.federate", True) is False and server_of(event.sender) != server_of(
        create.sender
    ):
        raise AuthError("this room does not federate")
    if version.special_case_aliases and event.type == "m.room.aliases":  # v4 and v5: rule 4
        if event.state_key is None:
            raise AuthError("m.room.aliases needs a state_key")
        if event.state_key != server_of(event.sender):
            raise AuthError("m.room.aliases: the state key must be the sender's server")
        return True
    return False


@dataclass(frozen=True)
class _MemberEvent:
    """An m.room.member event that passed rules 5.1 and 5.2, with what rules 5.3 to 5.7 look
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
    if target is None or not isinstance(membership, str):  # 5.1
        raise AuthError("m.room.member needs a state_key and content.membership")
    _check_authorising_server(event, verify_server_signature)  # 5.2
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
        raise AuthError(f"unknown membership {membership!r}")  # 5.8
    rule(member)


def _check_authorising_server(event: Event, verify_server_signature: SignatureCheck | None) -> None:
    # Rule 5.2: a restricted join names a member who admitted it, and that member's server
    # must have signed the event.
    authoriser = event.content.get("join_authorised_via_users_server")
    if authoriser is None:
        return
    if not isinstance(authoriser, str) or not is_valid_user_id(authoriser):
        raise AuthError("join_authorised_via_users_server is not a user ID")
    if verify_server_signature is None or not verify_server_signature(event, server_of(authoriser)):
        raise AuthError("join not signed by the authorising server")


def _check_join(member: _MemberEvent) -> None:
    # Rule 5.3.
    event, auth, version = member.event, member.auth, member.version
    create = auth[(CREATE, "")]
    # Only the create event's sender: v12's additional creators join like anyone else.
    creator = create.sender if version.implicit_room_creator else create.content.get("creator")
    if event.prev_event_ids == [create.event_id] and member.target == creator:
        return  # 5.3.1: the creator's own first join
    if event.sender != member.target:  # 5.3.2
        raise AuthError("cannot join on behalf of another user")
    if member.sender_membership == "ban":  # 5.3.3
        raise AuthError("you are banned from this room")
    _check_join_rule(member)


def _check_join_rule(member: _MemberEvent) -> None:
    # Rules 5.3.4 to 5.3.7: what the room's join rule lets a (not banned) user do.
    version, join_rule = member.version, member.join_rule
    if join_rule in ("invite", "knock") and (
        join_rule == "invite" or version.knock_join_rule
    ):  # 5.3.4
        if member.sender_membership in ("invite", "join"):
            return
        raise AuthError("you are not invited to this room")
    if (join_rule == "restricted" and version.restricted_join_rule) or (
        join_rule == "knock_restricted" and version.knock_restricted_join_rule
    ):  # 5.3.5
        if member.sender_membership in ("join", "invite"):
            return
        authoriser = member.event.content.get("join_authorised_via_users_server")
        if (
            not isinstance(authoriser, str)
            or _membership(member.auth, authoriser) != "join"
            or member.level(authoriser) < named_level(member.auth, "invite", 0)
        ):
            raise AuthError("join is not authorised by a member who may invite")
        return
    if join_rule == "public":  # 5.3.6
        return
    raise AuthError(f"cannot join a room whose join rule is {join_rule!r}")  # 5.3.7


def _check_invite(member: _MemberEvent) -> None:
    # Rule 5.4.
    event, target_membership = member.event, member.target_membership
    if "third_party_invite" in event.content:  # 5.4.1
        _check_third_party_invite(event, member.auth, target_membership)
        return
    if member.sender_membership != "join":  # 5.4.2
        raise AuthError("you are not in the room")
    if target_membership in ("join", "ban"):  # 5.4.3
        raise AuthError(
            f"{member.target} is already "
            f"{'in the room' if target_membership == 'join' else 'banned'}"
        )
    if member.level(event.sender) >= named_level(member.auth, "invite", 0):  # 5.4.4
        return
    raise AuthError("power level too low to invite")


def _check_leave(member: _MemberEvent) -> None:
    # Rule 5.5: leaving, or (sent by another user) a kick or an unban.
    event, auth = member.event, member.auth
    if event.sender == member.target:  # 5.5.1
        if member.sender_membership in ("invite", "join", "knock"):
            return
        raise AuthError("you are not in the room")
    if member.sender_membership != "join":  # 5.5.2
        raise AuthError("you are not in the room")
    sender_level = member.level(event.sender)
    if member.target_membership == "ban" and sender_level < named_level(auth, "ban", 50):
        raise AuthError("power level too low to unban")  # 5.5.3
    if (
        sender_level >= named_level(auth, "kick", 50) and member.level(member.target) < sender_level
    ):  # 5.5.4
        return
    raise AuthError("power level too low to kick this user")


def _check_ban(member: _MemberEvent) -> None:
    # Rule 5.6.
    if member.sender_membership != "join":
        raise AuthError("you are not in the room")
    sender_level = member.level(member.event.sender)
    if (
        sender_level >= named_level(member.auth, "ban", 50)
        and member.level(member.target) < sender_level
    ):
        return
    raise AuthError("power level too low to ban this user")


def _check_knock(member: _MemberEvent) -> None:
    # Rule 5.7: only rooms whose join rule takes knocks, and only for oneself.
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
    # Rule 5.4.1: an invite that redeems an m.room.third_party_invite.
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


# --- membership lookups -----------------------------------------------------------------


def _membership(auth: Mapping[StateKey, Event], user_id: str) -> str | None:
    event = auth.get((MEMBER, user_id))
    return event.membership if event is not None else None


def _join_rule(auth: Mapping[StateKey, Event]) -> str | None:
    event = auth.get((JOIN_RULES, ""))
    return event.content.get("join_rule") if event is not None else None
