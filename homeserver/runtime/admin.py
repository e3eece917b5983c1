"""The runtime's registration and admin components, beside the domain services they use
(runtime/__init__.py builds those; this file keeps that one under its size)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from homeserver.accounts.registration_tokens import RegistrationAuth, RegistrationTokens
from homeserver.admin.media import AdminMedia
from homeserver.admin.rooms import AdminRooms
from homeserver.admin.users import AdminUsers
from homeserver.core.components import component
from homeserver.runtime.media import MediaComponents
from homeserver.storage.admin import AdminMediaStore, AdminStore
from homeserver.storage.registration_tokens import RegistrationTokenStore

if TYPE_CHECKING:
    from homeserver.accounts.deactivation import AccountDeactivation
    from homeserver.accounts.profile import ProfileService
    from homeserver.accounts.registration import RegistrationSessions
    from homeserver.accounts.service import AccountService
    from homeserver.directory.service import DirectoryService
    from homeserver.rooms.creation import RoomCreator
    from homeserver.rooms.service import RoomService


class AdminComponents(MediaComponents):
    if TYPE_CHECKING:  # built by HomeserverRuntime, which derives from this class
        registration_sessions: RegistrationSessions
        accounts: AccountService
        profiles: ProfileService
        rooms: RoomService
        room_creator: RoomCreator
        directory: DirectoryService
        deactivation: AccountDeactivation

    @component
    def registration_token_store(self) -> RegistrationTokenStore:
        return RegistrationTokenStore(self.db)

    @component
    def registration_auth(self) -> RegistrationAuth:
        """Registration's user-interactive auth, with the token stage when required."""
        return RegistrationAuth(
            self.registration_token_store,
            self.registration_sessions,
            self.config.registration.requires_token,
        )

    @component
    def registration_tokens(self) -> RegistrationTokens:
        """The admins' registration tokens."""
        return RegistrationTokens(self.registration_token_store)

    @component
    def admin_store(self) -> AdminStore:
        return AdminStore(self.db, self.server_name)

    @component
    def admin_users(self) -> AdminUsers:
        """Users for server admins; deactivation leaves rooms through the room service."""
        return AdminUsers(self.accounts, self.profiles, self.rooms, self.deactivation)

    @component
    def admin_rooms(self) -> AdminRooms:
        """The room list, details and deletion for server admins."""
        return AdminRooms(self.rooms, self.room_creator, self.admin_store, self.directory.store)

    @component
    def admin_media(self) -> AdminMedia:
        """Quarantine and media lists for server admins."""
        return AdminMedia(AdminMediaStore(self.db, self.server_name), self.rooms, self.accounts)
