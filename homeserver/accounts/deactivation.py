"""Account deactivation (client-server spec, "Account deactivation"), after the user proved
their password: the account is marked deactivated first, so that no token works and no login
succeeds while the rest runs; then its devices go (tokens, keys: those who share a room hear
of the device list change), the profile if `erase`, its pushers, and the user leaves every
room.

The user row stays, so the name cannot be registered again (M_USER_IN_USE).
"""

from __future__ import annotations

from typing import Callable

from homeserver.accounts.service import AccountService
from homeserver.federation.admission import Caller
from homeserver.storage.profiles import MEMBER_FIELDS, ProfileStore

# (user_id, caller) -> the rooms it could not leave: rooms/departure.py, given by the
# runtime, since rooms sit above accounts. The caller's outbound slot is what a remote
# invite's rejection is admitted under.
LeaveRooms = Callable[[str, Caller], list[str]]
# user_id -> None: removes the user's pushers (sync/pushers.py, above accounts too).
RemovePushers = Callable[[str], None]


class AccountDeactivation:
    def __init__(
        self,
        accounts: AccountService,
        profiles: ProfileStore,
        leave_rooms: LeaveRooms,
        remove_pushers: RemovePushers,
    ):
        self.accounts = accounts
        self.profiles = profiles
        self.leave_rooms = leave_rooms
        self.remove_pushers = remove_pushers

    def deactivate(self, user_id: str, erase: bool, caller: Caller) -> list[str]:
        """Returns the rooms whose leave failed (logged; the deactivation stands)."""
        self.accounts.deactivate(user_id)
        self.accounts.remove_all_devices(user_id)
        if erase:
            # Straight from the store: the member events that would carry the change are
            # about to be followed by leaves.
            for field in MEMBER_FIELDS:
                self.profiles.delete_field(user_id, field)
        # Before the leaves, so that no notification follows a deactivation.
        self.remove_pushers(user_id)
        return self.leave_rooms(user_id, caller)
