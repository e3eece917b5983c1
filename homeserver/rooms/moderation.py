"""A room's members as its moderators and members manage them: kick, ban and unban (member
events built and checked like any other, through the room service, so the auth rules decide
and the event federates), forgetting a room one has left, and the joined members' list.
"""

from __future__ import annotations

from homeserver.core.clock import now_ms
from homeserver.core.concurrency import in_turns
from homeserver.core.errors import Codes, MatrixError, forbidden
from homeserver.core.requester import Requester
from homeserver.rooms.service import RoomService
from homeserver.storage.sync import SyncStore


def _reason(reason: str | None) -> dict:
    return {"reason": reason} if reason is not None else {}


class RoomModeration:
    def __init__(self, rooms: RoomService, sync_store: SyncStore):
        self.rooms = rooms
        self.sync_store = sync_store

    def kick(self, requester: Requester, room_id: str, target: str, reason: str | None) -> str:
        self.rooms.room_version(room_id)
        if self.rooms.membership(room_id, target) not in ("join", "invite", "knock"):
            raise forbidden(f"{target} is not in the room")
        return self.rooms.update_membership(
            requester.user_id, room_id, target, "leave", _reason(reason)
        )

    def ban(self, requester: Requester, room_id: str, target: str, reason: str | None) -> str:
        """Bans anyone, in the room or not, of this server or another: the auth rules ask
        for the ban power level and a higher level than the target's."""
        self.rooms.room_version(room_id)
        return self.rooms.update_membership(
            requester.user_id, room_id, target, "ban", _reason(reason)
        )

    def unban(self, requester: Requester, room_id: str, target: str, reason: str | None) -> str:
        """Leave from ban; only a banned user can be unbanned (403 M_BAD_STATE otherwise, as
        Synapse answers), so an unban cannot be used to kick."""
        self.rooms.room_version(room_id)
        membership = self.rooms.membership(room_id, target)
        if membership != "ban":
            raise MatrixError(
                403, Codes.BAD_STATE, f"{target} is not banned (membership: {membership})"
            )
        return self.rooms.update_membership(
            requester.user_id, room_id, target, "leave", _reason(reason)
        )

    def forget(self, requester: Requester, room_id: str) -> None:
        """Hides a room the user has left or been banned from from their /sync, until their
        membership changes again (storage/sync.py). Refused with 400 M_UNKNOWN while they are
        joined, invited or knocking, as Synapse does; a room they were never in is a no-op."""
        membership = self.sync_store.forget_room(requester.user_id, room_id, now_ms())
        if membership in ("join", "invite", "knock"):
            raise MatrixError(
                400, Codes.UNKNOWN, f"{requester.user_id} is in {room_id} ({membership})"
            )

    def joined_members(self, requester: Requester, room_id: str) -> dict:
        """{user_id: {display_name, avatar_url}} of the room's joined members, from their
        current member events; for a joined member only (403 otherwise, unknown rooms too)."""
        if (
            not self.rooms.room_exists(room_id)
            or self.rooms.membership(room_id, requester.user_id) != "join"
        ):
            raise forbidden("You aren't a member of the room")
        state = self.rooms.store.current_state(room_id, event_type="m.room.member")
        joined = {}
        for stored in in_turns(state.values(), 500):
            event = stored.event
            if event.membership != "join" or not isinstance(event.state_key, str):
                continue
            member = {}
            for ours, theirs in (("display_name", "displayname"), ("avatar_url", "avatar_url")):
                value = event.content.get(theirs)
                if isinstance(value, str):
                    member[ours] = value
            joined[event.state_key] = member
        return joined
