"""User-interactive auth for a logged-in user's sensitive requests (spec: "User-Interactive
Authentication API"): deleting devices and replacing cross-signing keys. One stage,
`m.login.password`, against the user's own password.

Sessions live in the same expiring, capped set as registration's (registration.py), so a
flood of challenges cannot grow memory. A session is spent by the request it completes.
"""

from __future__ import annotations

from homeserver.accounts.registration import RegistrationSessions
from homeserver.accounts.service import AccountService
from homeserver.core.errors import Codes, MatrixError
from homeserver.core.requester import Requester

PASSWORD_FLOWS = [{"stages": ["m.login.password"]}]


class AuthRequired(MatrixError):
    """The 401 of the UIA API: flows and a session, and an errcode only after a failed
    attempt (a first challenge is not an error to show the user)."""

    def __init__(self, session: str, failure: MatrixError | None = None):
        super().__init__(
            401,
            failure.errcode if failure else Codes.UNAUTHORIZED,
            failure.error if failure else "Authentication required",
        )
        self.session = session
        self.failed = failure is not None

    def to_json(self) -> dict:
        body: dict = {"flows": PASSWORD_FLOWS, "params": {}, "session": self.session}
        if self.failed:
            body.update(errcode=self.errcode, error=self.error)
        return body


class UserInteractiveAuth:
    def __init__(self, sessions: RegistrationSessions, accounts: AccountService):
        self.sessions = sessions
        self.accounts = accounts

    def require_password(self, requester: Requester, auth: object) -> None:
        """Returns when `auth` proves the requester's password; raises AuthRequired (401)
        with a session to continue in otherwise."""
        if not isinstance(auth, dict) or "type" not in auth:
            session = auth.get("session") if isinstance(auth, dict) else None
            if isinstance(session, str) and session in self.sessions.uia:
                raise AuthRequired(session)
            raise AuthRequired(self.sessions.uia.new())
        session = auth.get("session")
        if session is not None and (
            not isinstance(session, str) or session not in self.sessions.uia
        ):
            raise AuthRequired(
                self.sessions.uia.new(), MatrixError(400, Codes.UNKNOWN, "Unknown session")
            )
        session = session or self.sessions.uia.new()
        if auth["type"] != "m.login.password":
            raise AuthRequired(session, MatrixError(401, Codes.UNKNOWN, "Unsupported stage"))
        if not self._password_ok(requester, auth):
            raise AuthRequired(session, MatrixError(401, Codes.FORBIDDEN, "Invalid password"))
        self.sessions.uia.take(session)

    def _password_ok(self, requester: Requester, auth: dict) -> bool:
        identifier = auth.get("identifier")
        user = auth.get("user")
        if isinstance(identifier, dict):
            if identifier.get("type") != "m.id.user":
                return False
            user = identifier.get("user")
        password = auth.get("password")
        if not isinstance(password, str) or (user is not None and not isinstance(user, str)):
            return False
        if user is not None:
            try:
                named = self.accounts.user_id_for(self.accounts.localpart_of(user))
            except MatrixError:
                return False
            if named != requester.user_id:
                return False
        return self.accounts.check_password(requester.user_id, password)
