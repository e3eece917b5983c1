"""Room aliases, directory visibility and the public room list.

The federation endpoints (`/_matrix/federation/v1/publicRooms`, `/query/directory`) are thin
wrappers around `public_rooms` and `resolve_local_alias`. Lookups on other servers go to
`RemoteDirectory` (directory/remote.py), under the client outbound budget.
"""

from __future__ import annotations

import json

from unpaddedbase64 import decode_base64, encode_base64

from homeserver.core.clock import now_ms
from homeserver.core.errors import (
    Codes,
    MatrixError,
    forbidden,
    invalid_param,
    not_found,
)
from homeserver.core.identifiers import is_valid_server_name, parse_room_alias
from homeserver.core.requester import Requester
from homeserver.directory.remote import PublicRoomsQuery, RemoteDirectory
from homeserver.federation.admission import Caller
from homeserver.rooms.auth import CREATE
from homeserver.rooms.power_levels import required_power_level, user_power_level
from homeserver.rooms.service import RoomService
from homeserver.storage.directory import (
    Cursor,
    DirectoryStore,
    PublishedRoom,
    RoomFilter,
    Snapshot,
)

__all__ = ["DirectoryService", "RoomFilter", "VISIBILITIES"]

DEFAULT_PUBLIC_ROOMS_LIMIT = 100
# The most rooms one page may hold, whatever the client asks: a page costs a query over
# every published room, and its response size grows with the limit.
MAX_PUBLIC_ROOMS_LIMIT = 500

VISIBILITIES = ("public", "private")


def _encode_since(snapshot: Snapshot, cursor: Cursor, backwards: bool) -> str:
    raw = json.dumps(
        [
            int(backwards),
            snapshot.events_position,
            snapshot.directory_position,
            cursor.ranked_members,
            cursor.room_id,
        ],
        separators=(",", ":"),
    )
    return encode_base64(raw.encode("utf-8"), urlsafe=True)


def _decode_since(token: str) -> tuple[Snapshot, Cursor, bool]:
    try:
        backwards, events, directory, ranked, room_id = json.loads(
            decode_base64(token).decode("utf-8")
        )
        if not all(
            isinstance(n, int) for n in (backwards, events, directory, ranked)
        ) or not isinstance(room_id, str):
            raise ValueError(token)
    except (ValueError, TypeError, UnicodeDecodeError):
        raise invalid_param("since is not a valid pagination token") from None
    return Snapshot(events, directory), Cursor(ranked, room_id), bool(backwards)


def _chunk_entry(room: PublishedRoom) -> dict:
    entry = {
        "room_id": room.room_id,
        "num_joined_members": room.joined_members,
        "world_readable": room.history_visibility == "world_readable",
        "guest_can_join": room.guest_access == "can_join",
    }
    for key, value in (
        ("name", room.name),
        ("topic", room.topic),
        ("canonical_alias", room.canonical_alias),
        ("avatar_url", room.avatar_url),
        ("join_rule", room.join_rule),
        ("room_type", room.room_type),
    ):
        if value is not None:
            entry[key] = value
    return entry


class DirectoryService:
    def __init__(
        self, store: DirectoryStore, rooms: RoomService, server_name: str, remote: RemoteDirectory
    ):
        self.store = store
        self.rooms = rooms
        self.server_name = server_name
        self.remote = remote
        rooms.add_state_validator("m.room.canonical_alias", self._check_canonical_alias)

    # --- aliases ------------------------------------------------------------------------

    def parse_alias(self, alias: str) -> tuple[str, str]:
        parts = parse_room_alias(alias)
        if parts is None:
            raise invalid_param("Room alias invalid")
        return parts

    def is_local_alias(self, alias: str) -> bool:
        return self.parse_alias(alias)[1] == self.server_name

    def check_new_alias(self, alias: str, taken_errcode: str = Codes.UNKNOWN) -> str:
        """A valid, local, free alias, or the error for why it is not. PUT answers 409
        M_UNKNOWN for a taken alias; createRoom answers 400 M_ROOM_IN_USE."""
        if not self.is_local_alias(alias):
            raise invalid_param("Room alias must be on this server")
        if self.store.get_alias(alias) is not None:
            raise self._alias_taken(alias, taken_errcode)
        return alias

    @staticmethod
    def _alias_taken(alias: str, errcode: str) -> MatrixError:
        status = 409 if errcode == Codes.UNKNOWN else 400
        return MatrixError(status, errcode, f"Room alias {alias} already exists.")

    def alias_writer(self, alias: str, room_id: str, creator: str):
        """`fn(tx)` adding the alias within a room creation's transaction."""

        def write(tx):
            if not self.store.add_alias_in(tx, alias, room_id, creator, now_ms()):
                raise self._alias_taken(alias, Codes.ROOM_IN_USE)

        return write

    def resolve_alias(self, alias: str, caller: Caller) -> tuple[str, list[str]]:
        """(room_id, servers) for any alias: ours from the table, others' over federation."""
        localpart, server = self.parse_alias(alias)
        if server == self.server_name:
            return self.resolve_local_alias(alias)
        if not is_valid_server_name(server):
            raise invalid_param("Room alias has an invalid server name")
        return self.remote.resolve_alias(alias, server, caller)

    def resolve_alias_within(self, alias: str, deadline) -> tuple[str, list[str]]:
        """As `resolve_alias`, inside a caller's own slot and deadline (a remote join)."""
        _localpart, server = self.parse_alias(alias)
        if server == self.server_name:
            return self.resolve_local_alias(alias)
        if not is_valid_server_name(server):
            raise invalid_param("Room alias has an invalid server name")
        return self.remote.alias_within(alias, server, deadline)

    def resolve_local_alias(self, alias: str) -> tuple[str, list[str]]:
        found = self.store.get_alias(alias)
        if found is None:
            raise not_found(f"Room alias {alias} not found.")
        room_id = found[0]
        return room_id, self.rooms.joined_servers(room_id)

    def create_alias(self, requester: Requester, alias: str, room_id: str) -> None:
        self.check_new_alias(alias)
        if not self.rooms.room_exists(room_id):
            raise not_found("Unknown room")
        if not requester.is_admin and self.rooms.membership(room_id, requester.user_id) != "join":
            raise forbidden("You must be in the room to create an alias for it")
        if not self.store.add_alias(alias, room_id, requester.user_id, now_ms()):
            raise self._alias_taken(alias, Codes.UNKNOWN)

    def delete_alias(self, requester: Requester, alias: str) -> None:
        if not self.is_local_alias(alias):
            raise invalid_param("Room alias must be on this server")
        found = self.store.get_alias(alias)
        if found is None:
            raise not_found(f"Room alias {alias} not found.")
        room_id, creator = found
        if requester.user_id != creator and not self._is_moderator(requester, room_id):
            raise forbidden(
                "You may not delete this alias: you did not create it and lack"
                " the power to change the room's aliases"
            )
        if not self.store.delete_alias(alias):
            raise not_found(f"Room alias {alias} not found.")

    def room_aliases(self, requester: Requester, room_id: str) -> list[str]:
        # An unknown room is refused like one the user cannot see: 403 tells nobody which
        # rooms exist (the spec names 403 here, not 404).
        if not requester.is_admin and not self.rooms.can_peek(requester.user_id, room_id):
            raise forbidden("You are not a member of the room.")
        if not self.rooms.room_exists(room_id):
            raise not_found("Unknown room")
        return self.store.aliases_for_room(room_id)

    def _check_canonical_alias(self, room_id: str, content: dict, old: dict | None) -> None:
        """New aliases in m.room.canonical_alias must be valid and point to this room."""
        alias = content.get("alias")
        alt = content.get("alt_aliases", [])
        if alias is not None and not isinstance(alias, str):
            raise invalid_param("alias must be a string")
        if not isinstance(alt, list) or not all(isinstance(a, str) for a in alt):
            raise invalid_param("alt_aliases must be a list of strings")
        old = old or {}
        existing = {old.get("alias"), *(old.get("alt_aliases") or [])}
        for new_alias in [a for a in [alias, *alt] if a is not None and a not in existing]:
            # Only our own aliases are checked: checking another server's would be an
            # outbound call on the state-sending path, outside any admission budget.
            if not self.is_local_alias(new_alias):  # M_INVALID_PARAM if malformed
                continue
            pointed_at, _ = self.resolve_local_alias(new_alias)
            if pointed_at != room_id:
                raise MatrixError(400, Codes.BAD_ALIAS, f"{new_alias} points to another room")

    # --- visibility ---------------------------------------------------------------------

    def _is_moderator(self, requester: Requester, room_id: str) -> bool:
        """May this user manage the room's directory entry and aliases? Server admins may;
        otherwise joined members who could change the room's canonical alias."""
        if requester.is_admin:
            return True
        version = self.rooms.room_version(room_id)
        keys = [(CREATE, ""), ("m.room.power_levels", ""), ("m.room.member", requester.user_id)]
        state = {k: s.event for k, s in self.rooms.store.current_state(room_id, keys).items()}
        member = state.get(("m.room.member", requester.user_id))
        if member is None or member.membership != "join":
            return False
        needed = required_power_level("m.room.canonical_alias", True, state)
        return user_power_level(version, requester.user_id, state) >= needed

    def visibility(self, room_id: str) -> str:
        if not self.rooms.room_exists(room_id):
            raise not_found("Room not found")
        return "public" if self.store.is_published(room_id) else "private"

    def set_visibility(self, requester: Requester, room_id: str, visibility: str) -> None:
        if not self.rooms.room_exists(room_id):
            raise not_found("Room not found")
        if not self._is_moderator(requester, room_id):
            raise forbidden("You lack the power to change this room's directory visibility")
        if visibility == "public":
            self.store.publish(room_id, now_ms())
        else:
            self.store.unpublish(room_id)

    def publish_writer(self, room_id: str):
        """`fn(tx)` listing a new room within its creation's transaction."""
        return lambda tx: self.store.publish_in(tx, room_id, now_ms())

    def move_writer(self, old_room_id: str, new_room_id: str):
        """`fn(tx)` moving the old room's aliases and directory entry to its replacement,
        within the replacement's creation (rooms/upgrades.py)."""
        return lambda tx: self.store.move_room_in(tx, old_room_id, new_room_id, now_ms())

    # --- the public room list -----------------------------------------------------------

    def list_public_rooms(
        self,
        server: str | None,
        limit: int | None,
        since: str | None,
        room_filter: RoomFilter,
        include_all_networks: bool,
        third_party_instance_id: str | None,
        caller: Caller,
    ) -> dict:
        """GET/POST /publicRooms: ours, or another server's (under the outbound budget)."""
        if server is None or server == self.server_name:
            return self.public_rooms(
                limit, since, room_filter, include_all_networks, third_party_instance_id
            )
        if not is_valid_server_name(server):
            raise invalid_param("server is not a valid server name")
        query = PublicRoomsQuery(
            limit,
            since,
            room_filter.search_term,
            room_filter.room_types,
            include_all_networks,
            third_party_instance_id,
        )
        return self.remote.public_rooms(server, query, caller)

    def public_rooms(
        self,
        limit: int | None,
        since: str | None,
        room_filter: RoomFilter,
        include_all_networks: bool = False,
        third_party_instance_id: str | None = None,
    ) -> dict:
        """Our published rooms, largest first, in pages (see storage/directory.py)."""
        limit = min(limit or DEFAULT_PUBLIC_ROOMS_LIMIT, MAX_PUBLIC_ROOMS_LIMIT)
        if third_party_instance_id is not None and not include_all_networks:
            # No application service bridges networks here, so no room is in that network.
            return {"chunk": [], "total_room_count_estimate": 0}
        if since is None:
            snapshot, cursor, backwards = self.store.snapshot(), None, False
        else:
            snapshot, cursor, backwards = _decode_since(since)
        rows = self.store.public_rooms(snapshot, cursor, backwards, limit + 1, room_filter)
        more = len(rows) > limit
        rows = rows[:limit]
        if backwards:
            rows.reverse()
        body: dict = {
            "chunk": [_chunk_entry(r) for r in rows],
            "total_room_count_estimate": self.store.count_public_rooms(room_filter),
        }
        if rows:
            first = Cursor(rows[0].ranked_members, rows[0].room_id)
            last = Cursor(rows[-1].ranked_members, rows[-1].room_id)
            if backwards or more:
                body["next_batch"] = _encode_since(snapshot, last, False)
            if (backwards and more) or (not backwards and cursor is not None):
                body["prev_batch"] = _encode_since(snapshot, first, True)
        return body
