"""Leaving every room at once, for a deactivated account (client-server spec, "Account
deactivation": the server leaves the user's rooms and rejects their invites).

Each room goes through the membership service (rooms/remote_membership.py), so a room other
servers share hears of the leave as of any other: a local leave event the federation sender
delivers, or, for an invite or knock in a room none of our users is in, make_leave/send_leave
through the room's server under the client's outbound slot. A leave that fails (a server
that does not answer, a full budget, a room that refuses) is logged and the next room goes
on: one unreachable server must not keep an account from being deactivated.
"""

from __future__ import annotations

import logging

import gevent

from homeserver.core.errors import MatrixError
from homeserver.federation.admission import Caller
from homeserver.logs import with_request_context
from homeserver.rooms.remote_membership import RemoteMembership
from homeserver.storage.remote_invites import RemoteInviteStore

log = logging.getLogger(__name__)

# The memberships a deactivated user must not keep: a ban is the room's to lift, and "leave"
# is already gone.
_ENDED_BY_LEAVING = ("join", "invite", "knock")


class RoomDeparture:
    def __init__(self, membership: RemoteMembership, remote_invites: RemoteInviteStore):
        self.membership = membership
        self.remote_invites = remote_invites

    def rooms_to_leave(self, user_id: str) -> list[str]:
        store = self.membership.rooms.store
        rooms = [r for m in _ENDED_BY_LEAVING for r in store.rooms_for_user(user_id, m)]
        return list(dict.fromkeys([*rooms, *self.remote_invites.pending_rooms(user_id)]))

    def leave_all(self, user_id: str, caller: Caller) -> list[str]:
        """Leaves, rejects or rescinds in every room; returns the rooms where that failed.

        In a greenlet of its own, under the caller's client key but without its hang-up
        watch: the account can no longer ask again, so a client that hangs up while one
        server is slow must not leave the rest of its rooms joined."""
        detached = Caller(caller.client_key)
        return gevent.spawn(with_request_context(self._leave_each), user_id, detached).get()

    def _leave_each(self, user_id: str, caller: Caller) -> list[str]:
        failed = []
        for room_id in self.rooms_to_leave(user_id):
            try:
                self.membership.leave(user_id, room_id, caller, {})
            except MatrixError as e:
                log.warning("deactivation of %s: could not leave %s: %s", user_id, room_id, e)
                failed.append(room_id)
        return failed
