"""Shared-secret registration, in Synapse's shape, because provisioning tools speak it: a
nonce, then an HMAC-SHA1 over nonce, name, password and admin flag keyed by the secret."""

from __future__ import annotations

import hashlib
import hmac
import re

from homeserver.accounts.registration import RegistrationSessions
from homeserver.accounts.service import AccountService, LoginResult
from homeserver.core.errors import Codes, MatrixError, forbidden, invalid_param

_HEX = re.compile(r"[0-9a-fA-F]*")


def expected_mac(
    shared_secret: str, nonce: str, username: str, password: str, admin: bool, user_type: str | None
) -> str:
    mac = hmac.new(shared_secret.encode("utf-8"), digestmod=hashlib.sha1)
    parts = [nonce, username, password, "admin" if admin else "notadmin"]
    if user_type:
        parts.append(user_type)
    mac.update(b"\x00".join(p.encode("utf-8") for p in parts))
    return mac.hexdigest()


class SharedSecretRegistration:
    def __init__(
        self, shared_secret: str, sessions: RegistrationSessions, accounts: AccountService
    ):
        self._secret = shared_secret
        self._sessions = sessions
        self._accounts = accounts

    def require_enabled(self) -> str:
        if not self._secret:
            raise MatrixError(400, Codes.UNKNOWN, "Shared secret registration is not enabled")
        return self._secret

    def new_nonce(self) -> str:
        self.require_enabled()
        return self._sessions.admin_nonces.new()

    def register(
        self, nonce: str, username: str, password: str, admin: bool, user_type: str | None, mac: str
    ) -> LoginResult:
        secret = self.require_enabled()
        if not _HEX.fullmatch(mac):  # fullmatch: `$` would let a final newline through
            raise invalid_param("mac must be a hex digest")
        if not self._sessions.admin_nonces.take(nonce):
            raise MatrixError(400, Codes.UNKNOWN, "unrecognised nonce")
        want = expected_mac(secret, nonce, username, password, admin, user_type)
        if not hmac.compare_digest(want, mac.lower()):
            raise forbidden("HMAC incorrect")
        return self._accounts.register(username.lower(), password, admin=admin)
