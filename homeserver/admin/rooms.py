"""Rooms for server admins: the list, a room's details, members and state, and deleting a
room (Synapse's admin API shapes, which synadm prints).

Deleting runs in a greenlet of its own, as Synapse's v2 API does, and its status is kept
in memory for synadm to poll (`delete_status`): every local member leaves (the leave goes
to the room's other servers like any event), the local aliases and the directory listing
go, the room is blocked if asked, and its rows purged if asked, once the leaves are sent.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import gevent

from homeserver.core.clock import now_ms
from homeserver.core.errors import Codes, MatrixError, invalid_param, not_found
from homeserver.core.identifiers import is_valid_user_id, server_of
from homeserver.core.requester import Requester
from homeserver.rooms.creation import CreateRoomRequest, RoomCreator
from homeserver.rooms.format import client_event
from homeserver.rooms.service import RoomService
from homeserver.storage.admin import ORDERINGS, AdminRoomRow, AdminStore
from homeserver.storage.directory import DirectoryStore

log = logging.getLogger(__name__)
MAX_PAGE = 1000
MAX_KEPT_DELETIONS = 1000  # statuses kept for polling; the oldest forgotten first
# How long a purge waits for the room's leaves to reach its other servers.
OUTBOX_DRAIN_SECONDS = 30.0
OUTBOX_POLL_SECONDS = 0.25
# Synapse's defaults for the room the members are moved to.
NEW_ROOM_NAME = "Content Violation Notification"
NEW_ROOM_MESSAGE = (
    "Sharing illegal content on this server is not permitted and rooms in violation will be"
    " blocked."
)


@dataclass(frozen=True)
class Deletion:
    block: bool = False
    purge: bool = True
    new_room_user_id: str | None = None
    room_name: str | None = None
    message: str | None = None


class AdminRooms:
    def __init__(
        self,
        rooms: RoomService,
        creator: RoomCreator,
        store: AdminStore,
        directory: DirectoryStore,
    ):
        self.rooms = rooms
        self.creator = creator
        self.store = store
        self.directory = directory
        self.server_name = rooms.server_name
        self._deletions: OrderedDict[str, dict] = OrderedDict()

    # --- reading -------------------------------------------------------------------------

    def list(
        self, offset: int, limit: int, order_by: str, backwards: bool, term: str | None
    ) -> dict:
        if offset < 0 or not 0 < limit <= MAX_PAGE:
            raise invalid_param(f"from must be 0 or more, limit 1 to {MAX_PAGE}")
        if order_by not in ORDERINGS:
            raise invalid_param(f"order_by must be one of {', '.join(sorted(ORDERINGS))}")
        rows, total = self.store.list_rooms(offset, limit, order_by, backwards, term)
        page: dict = {
            "rooms": [self._summary(r) for r in rows],
            "offset": offset,
            "total_rooms": total,
        }
        if offset + len(rows) < total:
            page["next_batch"] = offset + len(rows)
        if offset > 0:
            page["prev_batch"] = max(0, offset - limit)
        return page

    def _summary(self, row: AdminRoomRow) -> dict:
        keys = [("m.room.create", ""), ("m.room.encryption", "")]
        state = self.rooms.store.current_state(row.room_id, keys)
        create = state.get(keys[0])
        encryption = state.get(keys[1])
        return {
            "room_id": row.room_id,
            "name": row.name,
            "canonical_alias": row.canonical_alias,
            "joined_members": row.joined_members,
            "joined_local_members": row.joined_local_members,
            "version": row.version,
            "creator": row.creator,
            "encryption": encryption.event.content.get("algorithm") if encryption else None,
            "federatable": create.event.content.get("m.federate", True) is not False
            if create
            else True,
            "public": row.public,
            "join_rules": row.join_rules,
            "guest_access": row.guest_access,
            "history_visibility": row.history_visibility,
            "state_events": row.state_events,
            "room_type": row.room_type,
        }

    def _row(self, room_id: str) -> AdminRoomRow:
        row = self.store.room(room_id)
        if row is None:
            raise not_found("Room not found")
        return row

    def details(self, room_id: str) -> dict:
        row = self._row(room_id)
        return {
            **self._summary(row),
            "topic": row.topic,
            "avatar": row.avatar,
            "invited_members": row.invited_members,
            "blocked": self.rooms.store.is_blocked(room_id),
        }

    def members(self, room_id: str) -> dict:
        self._row(room_id)
        members = self.rooms.store.current_state(room_id, event_type="m.room.member")
        joined = sorted(k[1] for k, s in members.items() if s.event.membership == "join")
        return {"members": joined, "total": len(joined)}

    def state(self, room_id: str) -> dict:
        self._row(room_id)
        state = self.rooms.store.current_state(room_id)
        now = now_ms()
        return {"state": [client_event(s, now) for s in state.values()]}

    # --- deleting ------------------------------------------------------------------------

    def delete(self, admin: Requester, room_id: str, how: Deletion) -> str:
        """Starts the deletion; returns its delete_id."""
        if not self.rooms.room_exists(room_id):
            raise not_found("Room not found")
        if how.new_room_user_id is not None and not (
            is_valid_user_id(how.new_room_user_id)
            and server_of(how.new_room_user_id) == self.server_name
        ):
            raise invalid_param("new_room_user_id must be a user ID of this server")
        if any(
            d["room_id"] == room_id and d["status"] == "active" for d in self._deletions.values()
        ):
            raise MatrixError(400, Codes.UNKNOWN, "This room is being deleted already")
        delete_id = secrets.token_urlsafe(12)
        status = {
            "delete_id": delete_id,
            "room_id": room_id,
            "status": "active",
            "shutdown_room": {
                "kicked_users": [],
                "failed_to_kick_users": [],
                "local_aliases": [],
                "new_room_id": None,
            },
        }
        self._deletions[delete_id] = status
        while len(self._deletions) > MAX_KEPT_DELETIONS:
            self._deletions.popitem(last=False)
        gevent.spawn(self._run_deletion, admin.user_id, status, how)
        return delete_id

    def _run_deletion(self, admin: str, status: dict, how: Deletion) -> None:
        room_id = status["room_id"]
        result = status["shutdown_room"]
        try:
            if how.block:
                self.store.block_room(room_id, admin, now_ms())
            if how.new_room_user_id is not None:
                result["new_room_id"] = self._notice_room(how)
            self._local_members_leave(room_id, result)
            if result["new_room_id"] is not None:
                self._move_members(result["kicked_users"], result["new_room_id"])
            for alias in self.directory.aliases_for_room(room_id):
                if server_of(alias) == self.server_name:
                    self.directory.delete_alias(alias)
                    result["local_aliases"].append(alias)
            self.directory.unpublish(room_id)
            if how.purge:
                self._purge(room_id)
            status["status"] = "complete"
            log.info("admin %s deleted room %s (%s)", admin, room_id, how)
        except Exception as e:
            log.exception("deleting room %s failed", room_id)
            status.update(status="failed", error=str(e))

    def _notice_room(self, how: Deletion) -> str:
        """A public room, made by `new_room_user_id` (registered now if need be), whose
        only voice is that user's message: where the members go."""
        user_id = how.new_room_user_id
        assert user_id is not None
        accounts = self.rooms.accounts
        if not accounts.user_exists(user_id):
            accounts.register(user_id[1:].partition(":")[0], None, inhibit_login=True)
        request = CreateRoomRequest(
            preset="public_chat",
            name=how.room_name or NEW_ROOM_NAME,
            power_level_content_override={"users_default": -10},
        )
        room_id = self.creator.create(user_id, request)
        sender = Requester(user_id, "", False, "")
        content = {"msgtype": "m.text", "body": how.message or NEW_ROOM_MESSAGE}
        self.rooms.send_message(sender, room_id, "m.room.message", content, secrets.token_hex(8))
        return room_id

    def _move_members(self, user_ids: Iterable[str], new_room_id: str) -> None:
        for user_id in user_ids:
            try:
                self.rooms.update_membership(user_id, new_room_id, user_id, "join")
            except MatrixError as e:
                log.warning("could not move %s to %s: %s", user_id, new_room_id, e)

    def _local_members_leave(self, room_id: str, result: dict) -> None:
        members = self.rooms.store.current_state(room_id, event_type="m.room.member")
        for (_, user_id), member in sorted(members.items()):
            if server_of(user_id) != self.server_name:
                continue
            if member.event.membership not in ("join", "invite", "knock"):
                continue
            try:
                self.rooms.update_membership(user_id, room_id, user_id, "leave")
                result["kicked_users"].append(user_id)
            except MatrixError as e:
                log.warning("deleting room %s: %s could not leave: %s", room_id, user_id, e)
                result["failed_to_kick_users"].append(user_id)

    def _purge(self, room_id: str) -> None:
        # The leaves are read from the events table as they are sent: wait for them first.
        deadline = time.monotonic() + OUTBOX_DRAIN_SECONDS
        while self.store.outbox_rows(room_id) and time.monotonic() < deadline:
            gevent.sleep(OUTBOX_POLL_SECONDS)
        if self.store.outbox_rows(room_id):
            log.warning("purging %s with events other servers were not sent", room_id)
        self.store.purge_room(room_id)

    def delete_status(self, delete_id: str) -> dict:
        status = self._deletions.get(delete_id)
        if status is None:
            raise not_found("delete id not found")
        return {k: v for k, v in status.items() if k not in ("delete_id", "room_id")}

    def delete_statuses(self, room_id: str) -> dict:
        found = [
            {k: v for k, v in s.items() if k != "room_id"}
            for s in self._deletions.values()
            if s["room_id"] == room_id
        ]
        if not found:
            raise not_found("No delete task for room")
        return {"results": found}
