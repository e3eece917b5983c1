"""Spaces: the room hierarchy under a space, for clients (`GET /_matrix/client/v1/rooms/
{roomId}/hierarchy`) and for other servers (`GET /_matrix/federation/v1/hierarchy/{roomId}`).

A breadth-first walk over the `m.space.child` state events of rooms we know. A room is shown
to whom the spec's room summary rules allow: members, world-readable rooms, and rooms whose
join rule lets anyone ask to enter (public, knock, restricted...). Rooms no user of ours is
in are asked of the servers their link names (rooms/hierarchy_remote.py, under the client
outbound budget); the walk shows what it could reach.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from unpaddedbase64 import decode_base64, encode_base64

from homeserver.core.errors import forbidden, invalid_param, not_found
from homeserver.core.identifiers import is_valid_room_id, server_of
from homeserver.federation.admission import Caller
from homeserver.rooms.hierarchy_remote import RemoteAsker, RemoteHierarchy
from homeserver.rooms.server_acl import ServerAcls
from homeserver.storage.rooms import RoomStore, StoredEvent

DEFAULT_LIMIT = 50
MAX_LIMIT = 50
# Bounds the walk however deep or wide the graph is: each room costs a few state queries.
MAX_ROOMS_WALKED = 500
MAX_DEPTH = 50

# Join rules under which a non-member may see a room's summary (spec: room summaries).
_PEEKABLE_JOIN_RULES = ("public", "knock", "knock_restricted", "restricted")
_SUMMARY_STATE = [
    ("m.room.create", ""),
    ("m.room.name", ""),
    ("m.room.topic", ""),
    ("m.room.canonical_alias", ""),
    ("m.room.avatar", ""),
    ("m.room.join_rules", ""),
    ("m.room.history_visibility", ""),
    ("m.room.guest_access", ""),
]


@dataclass(frozen=True)
class HierarchyRequest:
    room_id: str
    suggested_only: bool
    max_depth: int | None
    limit: int
    from_token: str | None


def _content(state: dict, key: tuple[str, str]) -> dict:
    found = state.get(key)
    content = found.event.content if found is not None else None
    return content if isinstance(content, dict) else {}


def _is_order(order: str) -> bool:
    # The spec's `order`: printable ASCII only (0x20 to 0x7E), at most 50 characters.
    return all(" " <= ch <= "~" for ch in order)


def _child_vias(stored: StoredEvent) -> list[str] | None:
    """The child's `via` servers, or None when the link is not valid (no via: removed)."""
    via = stored.event.content.get("via") if isinstance(stored.event.content, dict) else None
    if not isinstance(via, list) or not via or not all(isinstance(v, str) for v in via):
        return None
    return via


def _encode_from(room_id: str, params: list, offset: int) -> str:
    raw = json.dumps([room_id, params, offset], separators=(",", ":"))
    return encode_base64(raw.encode("utf-8"), urlsafe=True)


def _decode_from(token: str) -> tuple[str, list, int]:
    try:
        room_id, params, offset = json.loads(decode_base64(token).decode("utf-8"))
        if not isinstance(room_id, str) or not isinstance(params, list):
            raise ValueError(token)
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(token)
    except (ValueError, TypeError, UnicodeDecodeError):
        raise invalid_param("from is not a valid pagination token") from None
    return room_id, params, offset


class SpaceHierarchy:
    def __init__(self, store: RoomStore, acls: ServerAcls, remote: RemoteHierarchy):
        self.store = store
        self.acls = acls
        self.remote = remote

    # --- what one room looks like ---------------------------------------------------

    def _known(self, room_id: str) -> bool:
        return is_valid_room_id(room_id) and self.store.get_room(room_id) is not None

    def _children_state(self, room_id: str) -> list[tuple[dict, list[str]]]:
        """(stripped m.space.child event, via) of each valid link, ordered as the spec says:
        by `order`, then by the link's timestamp, then by room id."""
        links = []
        for stored in self.store.current_state(room_id, event_type="m.space.child").values():
            via = _child_vias(stored)
            if via is None:
                continue
            event = stored.event
            order = event.content.get("order")
            valid_order = isinstance(order, str) and len(order) <= 50 and _is_order(order)
            links.append(
                (
                    (0 if valid_order else 1, order if valid_order else "", event.origin_server_ts),
                    event.state_key,
                    {
                        "type": event.type,
                        "state_key": event.state_key,
                        "sender": event.sender,
                        "content": event.content,
                        "origin_server_ts": event.origin_server_ts,
                    },
                    via,
                )
            )
        links.sort(key=lambda link: (link[0], link[1]))
        return [(stripped, via) for _k, _id, stripped, via in links]

    def _summary(self, room_id: str, state: dict) -> dict:
        create = _content(state, ("m.room.create", ""))
        history = _content(state, ("m.room.history_visibility", ""))
        summary: dict = {
            "room_id": room_id,
            "num_joined_members": len(self.store.joined_users(room_id)),
            "world_readable": history.get("history_visibility") == "world_readable",
            "guest_can_join": _content(state, ("m.room.guest_access", "")).get("guest_access")
            == "can_join",
            "join_rule": _content(state, ("m.room.join_rules", "")).get("join_rule", "invite"),
        }
        for key, event_type, field in (
            ("name", "m.room.name", "name"),
            ("topic", "m.room.topic", "topic"),
            ("canonical_alias", "m.room.canonical_alias", "alias"),
            ("avatar_url", "m.room.avatar", "url"),
        ):
            value = _content(state, (event_type, "")).get(field)
            if isinstance(value, str) and value:
                summary[key] = value
        room_type = create.get("type")
        if isinstance(room_type, str):
            summary["room_type"] = room_type
        version = create.get("room_version", "1")
        if isinstance(version, str):
            summary["room_version"] = version
        return summary

    def _visible(self, state: dict, member_state: str | None) -> bool:
        if member_state == "join":
            return True
        if (
            _content(state, ("m.room.history_visibility", "")).get("history_visibility")
            == "world_readable"
        ):
            return True
        rule = _content(state, ("m.room.join_rules", "")).get("join_rule")
        return member_state == "invite" or rule in _PEEKABLE_JOIN_RULES

    def _user_view(self, room_id: str, user_id: str) -> dict | None:
        """The summary of a room we know, if `user_id` may see it."""
        state = self.store.current_state(room_id, [*_SUMMARY_STATE, ("m.room.member", user_id)])
        member = state.get(("m.room.member", user_id))
        if not self._visible(state, member.event.membership if member else None):
            return None
        return self._summary(room_id, state)

    def _server_view(self, room_id: str, origin: str) -> dict | None:
        """The summary of a room we know, if server `origin` may see it: its ACL allows it,
        and one of its users is joined or the room is open to it."""
        if not self.acls.allows(room_id, origin):
            return None
        state = self.store.current_state(room_id, _SUMMARY_STATE)
        joined = any(server_of(u) == origin for u in self.store.joined_users(room_id))
        if not self._visible(state, "join" if joined else None):
            return None
        return self._summary(room_id, state)

    # --- the client walk -----------------------------------------------------------

    def client_hierarchy(self, user_id: str, req: HierarchyRequest, caller: Caller) -> dict:
        # An unknown root is refused like a hidden one: the spec names 403 only, and a
        # different answer would tell anyone which rooms exist here.
        if not self._known(req.room_id) or self._user_view(req.room_id, user_id) is None:
            raise forbidden("You may not see this space")
        params = [req.suggested_only, req.max_depth]
        offset = 0
        if req.from_token is not None:
            room_id, token_params, offset = _decode_from(req.from_token)
            if room_id != req.room_id or token_params != params:
                raise invalid_param("from does not belong to this request")
        with self.remote.asker(caller, req.suggested_only) as asker:
            rooms = self._walk(user_id, req, asker)
        page = rooms[offset : offset + req.limit]
        body: dict = {"rooms": page}
        if offset + req.limit < len(rooms):
            body["next_batch"] = _encode_from(req.room_id, params, offset + req.limit)
        return body

    def _is_ours(self, room_id: str) -> bool:
        """A room some user of ours is in: its state here is current."""
        return self._known(room_id) and bool(self.store.joined_users(room_id))

    def _room_for_user(
        self, room_id: str, via: list[str], user_id: str, asker: RemoteAsker
    ) -> tuple[dict | None, list[tuple[dict, list[str]]]]:
        """(summary, children links) of a room the user may see; (None, []) otherwise."""
        if self._is_ours(room_id):
            summary = self._user_view(room_id, user_id)
            return summary, self._children_state(room_id) if summary is not None else []
        remote = asker.summary(room_id, via)
        # The remote shows us what any server may see; a user of ours may see no more than
        # the spec lets a non-member see.
        if remote is None or not (
            remote.get("world_readable") is True or remote.get("join_rule") in _PEEKABLE_JOIN_RULES
        ):
            return None, []
        links = []
        for stripped in remote.pop("children_state"):
            content = stripped["content"]
            via_list = content.get("via")
            if (
                isinstance(via_list, list)
                and via_list
                and all(isinstance(v, str) for v in via_list)
            ):
                links.append((stripped, via_list))
        return dict(remote), links

    def _walk(self, user_id: str, req: HierarchyRequest, asker: RemoteAsker) -> list[dict]:
        """Every visible room under the root, breadth first, each once. Paging recomputes
        the walk and skips: the token stays small and needs no server-side session."""
        max_depth = MAX_DEPTH if req.max_depth is None else min(req.max_depth, MAX_DEPTH)
        queue: list[tuple[str, int, list[str]]] = [(req.room_id, 0, [])]
        seen = {req.room_id}
        shown: list[dict] = []
        while queue and len(seen) <= MAX_ROOMS_WALKED:
            room_id, depth, via = queue.pop(0)
            summary, children = self._room_for_user(room_id, via, user_id, asker)
            if summary is None:
                continue
            if req.suggested_only:
                children = [c for c in children if c[0]["content"].get("suggested") is True]
            summary["children_state"] = [stripped for stripped, _via in children]
            shown.append(summary)
            if depth >= max_depth:
                continue
            asker.prefetch(
                [
                    (stripped["state_key"], via)
                    for stripped, via in children
                    if stripped["state_key"] not in seen
                    and not self._is_ours(stripped["state_key"])
                ]
            )
            for stripped, child_via in children:
                child = stripped["state_key"]
                if child not in seen:
                    seen.add(child)
                    queue.append((child, depth + 1, child_via))
        return shown

    # --- for other servers ------------------------------------------------------------

    def federation_hierarchy(self, origin: str, room_id: str, suggested_only: bool) -> dict:
        if not self._known(room_id):
            raise not_found("Unknown room")
        root = self._server_view(room_id, origin)
        if root is None:
            raise not_found("Room is not accessible to your server")
        children_state = self._children_state(room_id)
        if suggested_only:
            children_state = [c for c in children_state if c[0]["content"].get("suggested") is True]
        root["children_state"] = [stripped for stripped, _via in children_state]
        children, inaccessible = [], []
        for stripped, _via in children_state:
            child = stripped["state_key"]
            if not self._known(child):
                continue
            summary = self._server_view(child, origin)
            if summary is None:
                inaccessible.append(child)
                continue
            summary["children_state"] = [s for s, _v in self._children_state(child)]
            children.append(summary)
        return {"room": root, "children": children, "inaccessible_children": inaccessible}
