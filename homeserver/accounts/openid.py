"""OpenID tokens (client-server spec, "OpenID"; server-server spec, "OpenID"): a user asks
for a short-lived token and hands it to a third party (a widget, an integration manager),
which asks this server's federation listener whose it is. The token proves that much only:
it is no access token, and it is kept hashed like one."""

from __future__ import annotations

import secrets

from homeserver.accounts.service import hash_token
from homeserver.core.clock import now_ms
from homeserver.core.errors import Codes, MatrixError, forbidden
from homeserver.core.requester import Requester
from homeserver.storage.openid import OpenIdStore

# An hour, as Synapse gives: long enough for a widget to check it, short enough to leak little.
OPENID_TOKEN_SECONDS = 3600


class OpenIdTokens:
    def __init__(self, store: OpenIdStore, server_name: str):
        self.store = store
        self.server_name = server_name

    def issue(self, requester: Requester, user_id: str) -> dict:
        if user_id != requester.user_id:
            raise forbidden("You may only request an OpenID token for yourself")
        token = secrets.token_urlsafe(32)
        now = now_ms()
        expires = now + OPENID_TOKEN_SECONDS * 1000
        self.store.add(hash_token(token), user_id, expires, now)
        return {
            "access_token": token,
            "token_type": "Bearer",
            "matrix_server_name": self.server_name,
            "expires_in": OPENID_TOKEN_SECONDS,
        }

    def user_of(self, token: str | None) -> str:
        """The user the token was issued to; 401 for a missing, unknown or expired one."""
        if not token:
            raise MatrixError(401, Codes.MISSING_TOKEN, "Missing access_token")
        user_id = self.store.owner(hash_token(token), now_ms())
        if user_id is None:
            raise MatrixError(401, Codes.UNKNOWN_TOKEN, "Access token unknown or expired")
        return user_id
