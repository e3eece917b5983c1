"""Which events of a room a user may see (client-server spec, "History visibility").

Local rooms are linear, so "the state at an event" is the latest state change at or before
its stream position. `HistoryView` answers for one user and one room from two timelines:
the user's memberships and the room's history_visibility settings.
"""

from __future__ import annotations

import bisect

from homeserver.storage.rooms import StoredEvent

WORLD_READABLE = "world_readable"
SHARED = "shared"
INVITED = "invited"
JOINED = "joined"
_PERMISSIVENESS = {WORLD_READABLE: 3, SHARED: 2, INVITED: 1, JOINED: 0}


def _visibility_of(event: StoredEvent) -> str:
    value = event.event.content.get("history_visibility")
    return value if value in _PERMISSIVENESS else SHARED


class HistoryView:
    def __init__(
        self,
        user_id: str,
        memberships: list[tuple[int, StoredEvent]],
        visibilities: list[tuple[int, StoredEvent]],
    ):
        """`memberships`: the user's member events, `visibilities`: the room's
        history_visibility events, each as (stream position, event), oldest first."""
        self.user_id = user_id
        self._member_positions = [p for p, _ in memberships]
        self._memberships = [e.event.membership for _, e in memberships]
        self._visibility_positions = [p for p, _ in visibilities]
        self._visibilities = [_visibility_of(e) for _, e in visibilities]

    @property
    def current_membership(self) -> str | None:
        return self._memberships[-1] if self._memberships else None

    @property
    def leave_position(self) -> int | None:
        """Where a user who was in the room and is no longer lost sight of it."""
        if self.current_membership in ("leave", "ban") and "join" in self._memberships:
            return self._member_positions[-1]
        return None

    def memberships_between(self, after: int, up_to: int) -> list[str | None]:
        """The memberships the user was given with `after < position <= up_to`, in order."""
        low = bisect.bisect_right(self._member_positions, after)
        high = bisect.bisect_right(self._member_positions, up_to)
        return self._memberships[low:high]

    def last_membership_change(self, position: int) -> int | None:
        """Where the user's membership was last set, at or before `position`."""
        i = bisect.bisect_right(self._member_positions, position)
        return self._member_positions[i - 1] if i else None

    def membership_after(self, position: int) -> str | None:
        i = bisect.bisect_right(self._member_positions, position)
        return self._memberships[i - 1] if i else None

    def visibility_before(self, position: int) -> str:
        i = bisect.bisect_left(self._visibility_positions, position)
        if i:
            return self._visibilities[i - 1]
        # History stored behind the timeline (negative positions, storage/history.py) is
        # read with the oldest setting we know: the one we joined under, not the default.
        return self._visibilities[0] if position < 0 and self._visibilities else SHARED

    @property
    def world_readable_now(self) -> bool:
        return bool(self._visibilities) and self._visibilities[-1] == WORLD_READABLE

    def can_see(self, stored: StoredEvent) -> bool:
        position, event = stored.stream_ordering, stored.event
        visibility = self.visibility_before(position)
        departed_before = self.leave_position is not None and position > self.leave_position
        if event.type == "m.room.history_visibility" and event.state_key == "":
            # A change of visibility is judged by the more permissive of old and new.
            new = _visibility_of(stored)
            if _PERMISSIVENESS[new] > _PERMISSIVENESS[visibility]:
                visibility = new
        if visibility == WORLD_READABLE:
            return True
        if departed_before:
            return False  # nothing after you left, unless the world may read it
        if event.type == "m.room.member" and event.state_key == self.user_id:
            # Your own membership changes: joins and invites, and leaving after either.
            before = self.membership_after(position - 1)
            if event.membership in ("join", "invite") or before in ("join", "invite"):
                return True
        membership = self.membership_after(position)
        if membership == "join":
            return True
        if visibility == SHARED and (
            self.current_membership == "join" or self.leave_position is not None
        ):
            return True  # shared history is for members, past ones included
        return visibility == INVITED and membership == "invite"
