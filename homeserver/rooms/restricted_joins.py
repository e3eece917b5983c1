"""Restricted joins (room versions 8 and later): a user in one of the rooms a restricted room
admits may join it, and the server names which of its members, able to invite, authorised it
(`join_authorised_via_users_server`), and signs the join.

One set of checks for both ends of the handshake: `make_join` (and a local join) names the
authoriser, `send_join` checks a join that names one before we sign it. A join we sign is
one that needs it (the room is restricted now and the user is neither joined nor invited),
whose user we can see in an allowed room, and whose named authoriser is one of our members
who may invite. Errors are the spec's: 400 `M_UNABLE_TO_AUTHORISE_JOIN` when we are in none
of the allowed rooms, 403 when the user is in none of those we are in, 400
`M_UNABLE_TO_GRANT_JOIN` when none of our members may authorise it.
"""

from __future__ import annotations

from homeserver.core.errors import Codes, MatrixError, forbidden
from homeserver.core.events import Event
from homeserver.core.identifiers import server_of
from homeserver.rooms.power_levels import named_level, user_power_level
from homeserver.rooms.versions import RoomVersion
from homeserver.storage.rooms import RoomStore

AUTHORISER = "join_authorised_via_users_server"
RESTRICTED_RULES = ("restricted", "knock_restricted")
StateKey = tuple[str, str]


def authorise_restricted_join(
    store: RoomStore,
    version: RoomVersion,
    server_name: str,
    room_id: str,
    user_id: str,
    content: dict,
) -> None:
    """For a join that needs it, names in `content` the local member who may invite (the
    most powerful) as its authoriser; raises the spec's error if none can be named."""
    state = _state(store, room_id, user_id)
    if not _needs_authorisation(version, state, user_id):
        return
    _check_allowed(store, server_name, state, user_id)
    able = _able_to_invite(store, version, server_name, room_id, state)
    if not able:
        raise _unable_to_grant("No member of this server may admit you to the room")
    content[AUTHORISER] = max(able, key=lambda u: (able[u], u))


def check_countersignable(
    store: RoomStore,
    version: RoomVersion,
    server_name: str,
    room_id: str,
    user_id: str,
    authoriser: str,
) -> None:
    """Before we sign `user_id`'s join that names `authoriser`, one of our users (send_join):
    everything `make_join` checks holds now, and the named user may invite."""
    state = _state(store, room_id, user_id)
    if not _needs_authorisation(version, state, user_id):
        raise forbidden(f"This join needs no {AUTHORISER}; we sign only joins that do")
    _check_allowed(store, server_name, state, user_id)
    able = _able_to_invite(store, version, server_name, room_id, state)
    if authoriser not in able:
        raise _unable_to_grant(f"{authoriser} may not admit anyone to the room")


def _state(store: RoomStore, room_id: str, user_id: str) -> dict[StateKey, Event]:
    keys = [
        ("m.room.join_rules", ""),
        ("m.room.member", user_id),
        ("m.room.power_levels", ""),
        ("m.room.create", ""),
    ]
    return {k: s.event for k, s in store.current_state(room_id, keys).items()}


def _needs_authorisation(version: RoomVersion, state: dict, user_id: str) -> bool:
    """The room's join rule is restricted now, and the user is neither joined nor invited."""
    rules = state.get(("m.room.join_rules", ""))
    if not version.restricted_join_rule or rules is None:
        return False
    if rules.content.get("join_rule") not in RESTRICTED_RULES:
        return False
    member = state.get(("m.room.member", user_id))
    return member is None or member.membership not in ("join", "invite")


def _check_allowed(store: RoomStore, server_name: str, state: dict, user_id: str) -> None:
    """The user is joined to one of the allowed rooms that this server is in (the only ones
    whose membership we can vouch for)."""
    rules = state[("m.room.join_rules", "")]
    allowed: set[str] = {
        a["room_id"]
        for a in rules.content.get("allow") or []
        if isinstance(a, dict)
        and a.get("type") == "m.room_membership"
        and isinstance(a.get("room_id"), str)
    }
    known = {r for r in allowed if _resident(store, server_name, r)}
    if not known:
        raise MatrixError(
            400,
            Codes.UNABLE_TO_AUTHORISE_JOIN,
            "This server is in none of the rooms that admit members to this room",
        )
    if not known & set(store.rooms_for_user(user_id, "join")):
        raise forbidden("You are not in any of the rooms this room admits members of")


def _able_to_invite(
    store: RoomStore, version: RoomVersion, server_name: str, room_id: str, state: dict
) -> dict[str, int]:
    """Our joined members who may invite, with their power."""
    invite_level = named_level(state, "invite", 0)
    ours = [u for u in store.joined_users(room_id) if server_of(u) == server_name]
    powers = {u: user_power_level(version, u, state) for u in ours}
    return {u: p for u, p in powers.items() if p >= invite_level}


def _resident(store: RoomStore, server_name: str, room_id: str) -> bool:
    return any(server_of(u) == server_name for u in store.joined_users(room_id))


def _unable_to_grant(message: str) -> MatrixError:
    return MatrixError(400, Codes.UNABLE_TO_GRANT_JOIN, message)
