"""Registration's user-interactive auth, and registration tokens (client-server spec,
"Token-authenticated registration"; the admin side in Synapse's admin API shape).

Without `registration.requires_token` the one flow is `m.login.dummy`. With it, the flow is
`m.login.registration_token` then `m.login.dummy`, as Synapse offers it: the token stage
makes the session a pending use of the token (storage/registration_tokens.py), the dummy
stage registers, and the use is completed. A session that never registers gives its use
back after a session's life (accounts/registration.py, SESSION_TTL_SECONDS).
"""

from __future__ import annotations

import re
import secrets
import string

from homeserver.accounts.registration import SESSION_TTL_SECONDS, RegistrationSessions
from homeserver.core.clock import now_ms
from homeserver.core.errors import Codes, MatrixError, invalid_param, not_found
from homeserver.storage.registration_tokens import RegistrationToken, RegistrationTokenStore

TOKEN_STAGE = "m.login.registration_token"
DUMMY_STAGE = "m.login.dummy"
# The spec's token grammar: at most 64 of these characters.
_TOKEN = re.compile(r"[A-Za-z0-9._~-]{1,64}")
_ALPHABET = string.ascii_letters + string.digits + "._~-"
MAX_INT = 2**53  # JSON numbers clients agree on


class RegistrationAuthRequired(MatrixError):
    """The 401 of registration's UIA: flows, the session, the stages done, and an errcode
    only after a failed attempt."""

    def __init__(self, flows: list, session: str, completed: list[str], failure: str | None = None):
        super().__init__(401, Codes.FORBIDDEN if failure else Codes.UNAUTHORIZED, failure or "")
        self.flows = flows
        self.session = session
        self.completed = completed
        self.failed = failure is not None

    def to_json(self) -> dict:
        body: dict = {"flows": self.flows, "params": {}, "session": self.session}
        if self.completed:
            body["completed"] = self.completed
        if self.failed:
            body.update(errcode=self.errcode, error=self.error)
        return body


class RegistrationAuth:
    def __init__(
        self, store: RegistrationTokenStore, sessions: RegistrationSessions, requires_token: bool
    ):
        self.store = store
        self.sessions = sessions
        self.requires_token = requires_token

    @property
    def flows(self) -> list:
        stages = [TOKEN_STAGE, DUMMY_STAGE] if self.requires_token else [DUMMY_STAGE]
        return [{"stages": stages}]

    def check(self, auth: dict) -> str:
        """Returns the session once every stage is done (call `completed` after the account
        is made); raises RegistrationAuthRequired (401) with the session to go on in."""
        session = auth.get("session")
        stage = auth.get("type")
        if session is None and stage == DUMMY_STAGE and not self.requires_token:
            return ""  # a dummy stage needs no earlier request: nothing to continue
        if not isinstance(session, str) or session not in self.sessions.uia:
            raise RegistrationAuthRequired(self.flows, self.sessions.uia.new(), [])
        token_done = self.requires_token and self.store.session_token(session) is not None
        done = [TOKEN_STAGE] if token_done else []
        if stage == TOKEN_STAGE and self.requires_token and not token_done:
            token = auth.get("token")
            now = now_ms()
            if not isinstance(token, str) or not self.store.take_pending(
                session, token, now, _stale_before(now)
            ):
                raise RegistrationAuthRequired(
                    self.flows, session, done, "Invalid registration token"
                )
            raise RegistrationAuthRequired(self.flows, session, [TOKEN_STAGE])
        if stage != DUMMY_STAGE or (self.requires_token and not token_done):
            raise RegistrationAuthRequired(self.flows, session, done)
        if not self.sessions.uia.take(session):  # a racing request spent it
            raise RegistrationAuthRequired(self.flows, self.sessions.uia.new(), [])
        return session

    def completed(self, session: str) -> None:
        """The account is made: the session's token use is completed. (Had making it
        failed, the use stays pending until the session's life is over.)"""
        if self.requires_token and session:
            self.store.complete(session)

    def token_valid(self, token: str) -> bool:
        now = now_ms()
        found = self.store.get(token, _stale_before(now)) if _TOKEN.fullmatch(token) else None
        return found is not None and found.valid_at(now)


class RegistrationTokens:
    """The admins' side: list, make, change and delete tokens."""

    def __init__(self, store: RegistrationTokenStore):
        self.store = store

    def list(self, valid: bool | None) -> list[RegistrationToken]:
        now = now_ms()
        tokens = self.store.list(_stale_before(now))
        return [t for t in tokens if valid is None or t.valid_at(now) == valid]

    def get(self, token: str) -> RegistrationToken:
        found = self.store.get(token, _stale_before(now_ms()))
        if found is None:
            raise not_found("No such registration token")
        return found

    def create(self, body: dict) -> RegistrationToken:
        uses_allowed = _count_or_none(body, "uses_allowed")
        expiry_time = _expiry_or_none(body)
        token = body.get("token")
        if token is None:
            length = body.get("length", 16)
            if isinstance(length, bool) or not isinstance(length, int) or not 0 < length <= 64:
                raise invalid_param("length must be an integer from 1 to 64")
            for _ in range(10):
                token = "".join(secrets.choice(_ALPHABET) for _ in range(length))
                if self.store.create(token, uses_allowed, expiry_time):
                    return self.get(token)
            raise MatrixError(500, Codes.UNKNOWN, "Could not pick a free token")
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            raise invalid_param("token must be 1 to 64 of A-Z, a-z, 0-9, '.', '_', '~', '-'")
        if not self.store.create(token, uses_allowed, expiry_time):
            raise invalid_param("Token already in use")
        return self.get(token)

    def update(self, token: str, body: dict) -> RegistrationToken:
        changes = {}
        if "uses_allowed" in body:
            changes["uses_allowed"] = _count_or_none(body, "uses_allowed")
        if "expiry_time" in body:
            changes["expiry_time"] = _expiry_or_none(body)
        found = self.store.update(token, changes)
        if found is None:
            raise not_found("No such registration token")
        return found

    def delete(self, token: str) -> None:
        if not self.store.delete(token):
            raise not_found("No such registration token")


def _stale_before(now: int) -> int:
    """Sessions started before this have lived out their time (accounts/registration.py)."""
    return now - SESSION_TTL_SECONDS * 1000


def _count_or_none(body: dict, key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_INT:
        raise invalid_param(f"{key} must be a non-negative integer or null")
    return value


def _expiry_or_none(body: dict) -> int | None:
    value = _count_or_none(body, "expiry_time")
    if value is not None and value < now_ms():
        raise invalid_param("expiry_time must not be in the past")
    return value
