"""The end of an invite or a knock of our user in a room this server is not in, as the
room sends it: a leave (or ban) by someone else of the room, in a transaction.

We hold none of the room's state, so the auth rules cannot be applied. What we can check
(as Synapse does for a rescinded invite): the event is signed by its sender's server
(pdu_checks.py), and it answers our kept invite or knock, which is among its auth events
(a member event's auth events hold its target's current membership). An invite may be
rescinded so, by its inviter only; a knock refused (a kick of the knocker) by anyone who
signs it. The spec leaves how the room
tells the knocking server unsaid; a server that does not send it leaves the knock shown
until our user rescinds it.
"""

from __future__ import annotations

from typing import Callable, Iterable

from homeserver.core.events import Event, referenced_ids
from homeserver.rooms.versions import KNOWN_ROOM_VERSIONS, RoomVersion
from homeserver.storage.remote_invites import RemoteInvite, RemoteInviteStore

_ENDS = ("leave", "ban")


class OutOfRoomEnds:
    def __init__(self, kept: RemoteInviteStore, wake_users: Callable[[Iterable[str]], None]):
        self._kept = kept
        self._wake_users = wake_users

    def _answered(self, pdu: dict) -> RemoteInvite | None:
        """The kept invite or knock this PDU ends, if it is such an end."""
        content = pdu.get("content")
        target, room_id = pdu.get("state_key"), pdu.get("room_id")
        if (
            pdu.get("type") != "m.room.member"
            or not isinstance(content, dict)
            or content.get("membership") not in _ENDS
            or not isinstance(target, str)
            or not isinstance(room_id, str)
            or pdu.get("sender") == target  # our user's own leave is ours to make
        ):
            return None
        kept = self._kept.get(room_id, target)
        if kept is None or kept.membership not in ("invite", "knock"):
            return None
        if kept.membership == "invite" and pdu.get("sender") != kept.event.sender:
            return None  # who else may rescind it we cannot tell without the room's state
        auth_events = pdu.get("auth_events")
        if not isinstance(auth_events, list) or not all(
            isinstance(a, (str, list)) and a for a in auth_events
        ):
            return None
        if kept.event.event_id not in referenced_ids(auth_events):
            return None
        return kept

    def version_for(self, pdu: dict) -> RoomVersion | None:
        """The room version to check the PDU in, if it ends a kept invite or knock."""
        kept = self._answered(pdu)
        return KNOWN_ROOM_VERSIONS.get(kept.room_version) if kept else None

    def receive(self, event: Event) -> bool:
        """Records the end, checked (signatures, hash) by the caller; False if it ends
        nothing kept (any more)."""
        kept = self._answered(event.pdu)
        if kept is None:
            return False
        self._kept.put(kept.room_version, event, [], "leave")
        self._wake_users([kept.user_id])
        return True
