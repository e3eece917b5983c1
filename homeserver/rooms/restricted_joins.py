"""Restricted joins (room versions 8 and later): a user in one of the rooms a restricted room
admits may join it, and the server names which of its members, able to invite, authorised it
(`join_authorised_via_users_server`)."""

from __future__ import annotations

from homeserver.core.errors import forbidden
from homeserver.core.identifiers import server_of
from homeserver.rooms.power_levels import user_power_level
from homeserver.rooms.versions import RoomVersion
from homeserver.storage.rooms import RoomStore


def authorise_restricted_join(
    store: RoomStore,
    version: RoomVersion,
    server_name: str,
    room_id: str,
    user_id: str,
    content: dict,
) -> None:
    """For a restricted room, names a local member who may invite as the authoriser of a
    join by someone who is in one of the allowed rooms (room version 8+ rules)."""
    keys = [
        ("m.room.join_rules", ""),
        ("m.room.member", user_id),
        ("m.room.power_levels", ""),
        ("m.room.create", ""),
    ]
    state = {k: s.event for k, s in store.current_state(room_id, keys).items()}
    rules = state.get(("m.room.join_rules", ""))
    rule = rules.content.get("join_rule") if rules else None
    if rules is None or rule not in ("restricted", "knock_restricted"):
        return
    member = state.get(("m.room.member", user_id))
    if member is not None and member.membership in ("join", "invite"):
        return
    allowed = {
        a.get("room_id")
        for a in rules.content.get("allow") or []
        if isinstance(a, dict) and a.get("type") == "m.room_membership"
    }
    if not allowed & set(store.rooms_for_user(user_id, "join")):
        raise forbidden("You are not in any of the rooms this room admits members of")
    invite_level = (
        state[("m.room.power_levels", "")].content.get("invite", 0)
        if ("m.room.power_levels", "") in state
        else 0
    )
    candidates = [u for u in store.joined_users(room_id) if server_of(u) == server_name]
    powers = {u: user_power_level(version, u, state) for u in candidates}
    able = [u for u in candidates if powers[u] >= invite_level]
    if not able:
        raise forbidden("No member of this server may admit you to the room")
    content["join_authorised_via_users_server"] = max(able, key=lambda u: (powers[u], u))
