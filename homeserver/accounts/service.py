"""Accounts: registration, login, access tokens and logout."""

from __future__ import annotations

import hashlib
import re
import secrets
import string
from dataclasses import dataclass
from typing import Callable

from homeserver.accounts.passwords import PasswordHasher
from homeserver.accounts.tokens import RequesterCache
from homeserver.core.clock import now_ms
from homeserver.core.errors import Codes, MatrixError, forbidden, invalid_param
from homeserver.core.requester import Requester
from homeserver.storage.accounts import AccountStore

# The user ID grammar for new users (spec: "Historical user IDs" are not accepted for new ones).
_LOCALPART = re.compile(r"[a-z0-9._=\-/+]+")  # whole string: fullmatch, as `$` allows a final "\n"
MAX_USER_ID_LENGTH = 255
_DEVICE_ALPHABET = string.ascii_uppercase


@dataclass(frozen=True)
class LoginResult:
    user_id: str
    device_id: str | None
    access_token: str | None


def hash_token(token: str) -> str:
    # Tokens are 256 random bits, so a fast hash is enough: nothing to brute-force.
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class AccountService:
    def __init__(self, store: AccountStore, server_name: str, hasher: PasswordHasher):
        self.store = store
        self.hasher = hasher
        self.server_name = server_name
        self._dummy_hash: str | None = None
        # Who each token in use belongs to (accounts/tokens.py): every change to a token
        # goes through this service, which forgets the cached answer.
        self.requesters = RequesterCache()
        # Called with a user ID and the device IDs when a device with keys is removed (e2ee:
        # a device list change).
        self._device_key_listeners: list[Callable[[str, list[str]], None]] = []

    def add_device_key_listener(self, listener: Callable[[str, list[str]], None]) -> None:
        self._device_key_listeners.append(listener)

    # --- identifiers -------------------------------------------------------------------

    def user_id_for(self, localpart: str) -> str:
        return f"@{localpart}:{self.server_name}"

    def validate_localpart(self, localpart: str) -> str:
        if not localpart or not _LOCALPART.fullmatch(localpart):
            raise MatrixError(
                400,
                Codes.INVALID_USERNAME,
                "User ID may only contain a-z, 0-9, '.', '_', '=', '-', '/' and '+'",
            )
        if len(self.user_id_for(localpart)) > MAX_USER_ID_LENGTH:
            raise MatrixError(400, Codes.INVALID_USERNAME, "User ID is too long")
        return localpart

    def localpart_of(self, user: str) -> str:
        """Accepts a bare localpart or a full user ID on this server."""
        if user.startswith("@"):
            localpart, _, server = user[1:].partition(":")
            if server != self.server_name:
                raise forbidden("Invalid username or password")
            return localpart.lower()
        return user.lower()

    def user_exists(self, user_id: str) -> bool:
        return self.store.get_user(user_id) is not None

    def is_available(self, localpart: str) -> bool:
        self.validate_localpart(localpart)
        return self.store.get_user(self.user_id_for(localpart)) is None

    # --- registration and login --------------------------------------------------------

    def register(
        self,
        localpart: str | None,
        password: str | None,
        *,
        admin: bool = False,
        device_id: str | None = None,
        display_name: str | None = None,
        inhibit_login: bool = False,
    ) -> LoginResult:
        password_hash = self.hasher.hash(password) if password else None
        if localpart is None:
            # No name asked for: pick a random one, as Synapse picks a numeric one.
            for _ in range(10):
                candidate = secrets.token_hex(6)
                if self.store.create_user(
                    self.user_id_for(candidate), password_hash, admin, now_ms()
                ):
                    localpart = candidate
                    break
            else:  # pragma: no cover - 48 random bits colliding ten times
                raise MatrixError(500, Codes.UNKNOWN, "Could not pick a free user ID")
        else:
            self.validate_localpart(localpart)
            if not self.store.create_user(
                self.user_id_for(localpart), password_hash, admin, now_ms()
            ):
                raise MatrixError(400, Codes.USER_IN_USE, "User ID already taken.")
        user_id = self.user_id_for(localpart)
        if inhibit_login:
            return LoginResult(user_id, None, None)
        return self._new_session(user_id, device_id, display_name)

    def login_with_password(
        self, user: str, password: str, device_id: str | None, display_name: str | None
    ) -> LoginResult:
        user_id = self.user_id_for(self.localpart_of(user))
        row = self.store.get_user(user_id)
        # Hash even for an unknown user, so timing does not reveal which accounts exist.
        ok = self.hasher.check(password, row.password_hash if row else self._unknown_user_hash())
        if row is None or not ok:
            raise forbidden("Invalid username or password")
        if row.deactivated:
            # Told only to whoever knows the password, as Synapse does.
            raise MatrixError(403, Codes.USER_DEACTIVATED, "This account has been deactivated")
        return self._new_session(user_id, device_id, display_name)

    def login_as(
        self, user_id: str, device_id: str | None, display_name: str | None
    ) -> LoginResult:
        """A session vouched for elsewhere (an appservice's as_token), no password."""
        row = self.store.get_user(user_id)
        if row is not None and row.deactivated:
            raise MatrixError(403, Codes.USER_DEACTIVATED, "This account has been deactivated")
        return self._new_session(user_id, device_id, display_name)

    def _unknown_user_hash(self) -> str:
        if self._dummy_hash is None:
            self._dummy_hash = self.hasher.hash(secrets.token_hex(16))
        return self._dummy_hash

    def _new_session(
        self, user_id: str, device_id: str | None, display_name: str | None
    ) -> LoginResult:
        if device_id is not None and not (0 < len(device_id) <= 255):
            raise invalid_param("device_id must be 1 to 255 characters")
        device_id = device_id or "".join(secrets.choice(_DEVICE_ALPHABET) for _ in range(10))
        token = "weir_" + secrets.token_urlsafe(32)
        try:
            self.store.add_device_token(
                user_id, device_id, display_name, hash_token(token), now_ms()
            )
        finally:
            # A login that names an existing device replaces that device's token. In
            # `finally`: the write may have committed even if this greenlet was killed.
            self.requesters.forget_devices(user_id, [device_id])
        return LoginResult(user_id, device_id, token)

    # --- tokens ------------------------------------------------------------------------

    def authenticate(self, token: str) -> Requester | None:
        token_hash = hash_token(token)
        requester = self.requesters.get(token_hash)
        if requester is not None:
            return requester
        generation = self.requesters.generation
        owner = self.store.token_owner(token_hash)
        if owner is None:
            return None
        requester = Requester(owner.user_id, owner.device_id, owner.admin, token_hash)
        self.requesters.put(requester, generation)
        return requester

    def forget_user_tokens(self, user_id: str) -> None:
        """To call when a user is deactivated or made or unmade an admin: the next request
        with any of their tokens reads its owner from the database again."""
        self.requesters.forget_user(user_id)

    def forget_revoked(self, user_id: str, device_id: str | None) -> None:
        """Another instance ended the device's tokens, or every one of the user's (None),
        or changed the user's admin flag (sync/cluster.py)."""
        if device_id is None:
            self.requesters.forget_user(user_id)
        else:
            self.requesters.forget_devices(user_id, [device_id])

    def check_password(self, user_id: str, password: str) -> bool:
        """The user's own password, checked as login does (user-interactive auth)."""
        row = self.store.get_user(user_id)
        ok = self.hasher.check(password, row.password_hash if row else self._unknown_user_hash())
        return ok and row is not None and not row.deactivated

    def change_password(
        self, requester: Requester, new_password: str, logout_devices: bool
    ) -> None:
        """Sets the password (hashed); with `logout_devices`, every other device of the user
        is removed with its tokens and keys, as the spec's `logout_devices` asks."""
        self.store.set_password_hash(requester.user_id, self.hasher.hash(new_password))
        if logout_devices:
            devices = self.store.device_ids(requester.user_id)
            self.remove_devices(requester.user_id, [d for d in devices if d != requester.device_id])

    def deactivate(self, user_id: str) -> None:
        """Marks the account deactivated: its tokens stop working at once (token_owner reads
        the flag) and a login is refused with M_USER_DEACTIVATED."""
        try:
            self.store.mark_deactivated(user_id)
        finally:
            self.forget_user_tokens(user_id)

    def remove_devices(self, user_id: str, device_ids: list[str]) -> None:
        """Logs the devices out and forgets their keys and pending to-device messages."""
        try:
            had_keys = self.store.remove_devices(user_id, device_ids)
        finally:
            self.requesters.forget_devices(user_id, device_ids)
        if had_keys:
            for listener in self._device_key_listeners:
                listener(user_id, list(device_ids))

    def logout(self, requester: Requester) -> None:
        self.remove_devices(requester.user_id, [requester.device_id])

    def logout_all(self, requester: Requester) -> None:
        self.remove_all_devices(requester.user_id)

    def remove_all_devices(self, user_id: str) -> None:
        self.remove_devices(user_id, self.store.device_ids(user_id))
