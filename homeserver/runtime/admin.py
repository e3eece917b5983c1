"""The runtime's registration and admin components, beside the domain services they use
(runtime/__init__.py builds those; this file keeps that one under its size)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from homeserver.accounts.registration_tokens import RegistrationAuth, RegistrationTokens
from homeserver.core.components import component
from homeserver.runtime.infrastructure import Infrastructure
from homeserver.storage.registration_tokens import RegistrationTokenStore

if TYPE_CHECKING:
    from homeserver.accounts.registration import RegistrationSessions


class AdminComponents(Infrastructure):
    if TYPE_CHECKING:  # built by HomeserverRuntime, which derives from this class
        registration_sessions: RegistrationSessions

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
