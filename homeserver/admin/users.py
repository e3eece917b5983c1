"""Users for server admins: list, read, create or change, deactivate, reset a password,
sessions and joined rooms, in the shapes of Synapse's admin API, which tools such as synadm
read."""

from __future__ import annotations

import json
import logging

from homeserver.accounts.deactivation import AccountDeactivation
from homeserver.accounts.profile import ProfileService
from homeserver.accounts.service import AccountService
from homeserver.core.errors import Codes, MatrixError, invalid_param, not_found
from homeserver.core.identifiers import is_valid_user_id, server_of
from homeserver.core.requester import Requester
from homeserver.federation.admission import Caller
from homeserver.rooms.service import RoomService

log = logging.getLogger(__name__)
MAX_PAGE = 1000


class AdminUsers:
    def __init__(
        self,
        accounts: AccountService,
        profiles: ProfileService,
        rooms: RoomService,
        deactivation: AccountDeactivation,
    ):
        self.accounts = accounts
        self.store = accounts.store
        self.profiles = profiles
        self.rooms = rooms
        self.deactivation = deactivation

    def _local(self, user_id: str) -> str:
        if not is_valid_user_id(user_id) or server_of(user_id) != self.accounts.server_name:
            raise MatrixError(400, Codes.INVALID_PARAM, "Only local users can be managed here")
        return user_id

    def _existing(self, user_id: str) -> None:
        if not self.accounts.user_exists(self._local(user_id)):
            raise not_found("User not found")

    def list(self, offset: int, limit: int, name: str | None, deactivated: bool) -> dict:
        if offset < 0 or not 0 < limit <= MAX_PAGE:
            raise invalid_param(f"from must be 0 or more, limit 1 to {MAX_PAGE}")
        rows, total = self.store.list_users(offset, limit, name, deactivated)
        users = [
            {
                "name": r.user_id,
                "user_type": None,
                "is_guest": False,
                "admin": r.admin,
                "deactivated": r.deactivated,
                "shadow_banned": False,
                "displayname": json.loads(r.displayname_json) if r.displayname_json else None,
                "avatar_url": None,
                "creation_ts": r.created_ts,
                "locked": False,
                "erased": False,
            }
            for r in rows
        ]
        page: dict = {"users": users, "total": total}
        if offset + len(rows) < total:
            page["next_token"] = str(offset + len(rows))
        return page

    def details(self, user_id: str) -> dict:
        self._existing(user_id)
        row = self.store.get_user(user_id)
        assert row is not None
        profile = self.profiles.profile(user_id)
        return {
            "name": user_id,
            "admin": row.admin,
            "deactivated": row.deactivated,
            "displayname": profile.get("displayname"),
            "avatar_url": profile.get("avatar_url"),
            "creation_ts": self.store.created_ts(user_id),
            "is_guest": False,
            "user_type": None,
            "threepids": [],
            "external_ids": [],
            "shadow_banned": False,
            "locked": False,
            "erased": False,
            "appservice_id": None,
        }

    def put(self, admin: Requester, user_id: str, body: dict, caller: Caller) -> tuple[dict, bool]:
        """Creates the user, or changes what the body names; (details, created)."""
        self._local(user_id)
        password = _optional(body, "password", str)
        displayname = _optional(body, "displayname", str)
        make_admin = _optional(body, "admin", bool)
        deactivated = _optional(body, "deactivated", bool)
        logout = _optional(body, "logout_devices", bool)
        if password is not None and not 0 < len(password) <= 512:
            raise invalid_param("The password must be 1 to 512 characters")
        existing = self.store.get_user(user_id)
        if existing and existing.deactivated and deactivated is False and password is None:
            raise invalid_param("Reactivating a user needs a password")  # before any change
        created = existing is None
        if created:
            localpart = user_id[1:].partition(":")[0]
            self.accounts.register(localpart, password, admin=bool(make_admin), inhibit_login=True)
        elif password is not None:
            self.reset_password(user_id, password, logout is not False)
        if make_admin is not None and not created:
            self.store.set_admin(user_id, make_admin)
            self.accounts.forget_user_tokens(user_id)
        if displayname is not None:
            self.profiles.set_field(admin, user_id, "displayname", displayname)
        row = self.store.get_user(user_id)
        assert row is not None
        if deactivated is True and not row.deactivated:
            self.deactivate(user_id, False, caller)
        elif deactivated is False and row.deactivated:
            self.store.reactivate(user_id)  # the password was set above
        return self.details(user_id), created

    def reset_password(self, user_id: str, password: str, logout_devices: bool) -> None:
        self._existing(user_id)
        if not password or len(password) > 512:
            raise invalid_param("The password must be 1 to 512 characters")
        self.store.set_password_hash(user_id, self.accounts.hasher.hash(password))
        if logout_devices:
            self.accounts.remove_devices(user_id, self.store.device_ids(user_id))

    def deactivate(self, user_id: str, erase: bool, caller: Caller) -> None:
        """As the user's own deactivation does (accounts/deactivation.py): logins refused,
        every device logged out, every room left through the membership service."""
        self._existing(user_id)
        self.deactivation.deactivate(user_id, erase, caller)

    def whois(self, user_id: str) -> dict:
        self._existing(user_id)
        devices = {
            device_id: {"sessions": [{"connections": [{"last_seen": last_seen}]}]}
            for device_id, _, last_seen in self.store.devices(user_id)
        }
        return {"user_id": user_id, "devices": devices}

    def joined_rooms(self, user_id: str) -> dict:
        self._existing(user_id)
        rooms = self.rooms.joined_rooms(user_id)
        return {"joined_rooms": rooms, "total": len(rooms)}


def _optional(body: dict, key: str, kind: type):
    value = body.get(key)
    if value is not None and not isinstance(value, kind):
        raise invalid_param(f"{key} must be a {kind.__name__}")
    return value
