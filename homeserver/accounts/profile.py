"""Profiles (client-server spec, "Profiles"): reading and setting fields, and carrying
displayname and avatar_url into the user's member events in every joined room."""

from __future__ import annotations

import re

from homeserver.core.errors import Codes, MatrixError, bad_json, forbidden, not_found
from homeserver.core.identifiers import is_valid_user_id, server_of
from homeserver.storage.profiles import MEMBER_FIELDS, ProfileStore, ProfileTooLarge

# The spec's limits: a whole profile, as JSON, is under 64 KiB; a key at most 255 bytes.
MAX_PROFILE_BYTES = 64 * 1024
MAX_KEY_BYTES = 255
# Our own caps on the fields copied into member events: a member event is at most 64 KiB, and
# a name longer than this is no use to anyone reading a room.
MAX_DISPLAYNAME_LENGTH = 256
MAX_AVATAR_URL_LENGTH = 1024
# Known fields, or custom ones in the common namespaced identifier grammar.
# Used with fullmatch: `$` would also match before a final newline.
_KEY = re.compile(r"avatar_url|displayname|m\.tz|[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")
_MXC = re.compile(r"mxc://[^/\s]+/[^/\s]+")


class ProfileService:
    def __init__(self, store: ProfileStore, accounts, rooms, server_name: str):
        self.store = store
        self.accounts = accounts
        self.rooms = rooms
        self.server_name = server_name

    def _existing_user(self, user_id: str) -> None:
        if not is_valid_user_id(user_id):
            raise MatrixError(400, Codes.INVALID_PARAM, f"Not a valid user ID: {user_id}")
        if server_of(user_id) != self.server_name:
            # Asking the user's server needs federation queries, which are not built yet.
            raise not_found("Profiles of users on other servers are not available yet")
        if not self.accounts.user_exists(user_id):
            raise not_found("No such user")

    @staticmethod
    def _check_key(key: str) -> None:
        if len(key.encode("utf-8")) > MAX_KEY_BYTES:
            raise MatrixError(
                400, Codes.KEY_TOO_LARGE, f"Profile keys are at most {MAX_KEY_BYTES} bytes"
            )
        if not _KEY.fullmatch(key):
            raise MatrixError(400, Codes.INVALID_PARAM, f"Not a valid profile key: {key}")

    def _check_may_change(self, requester, user_id: str) -> None:
        if requester.user_id != user_id and not requester.is_admin:
            raise forbidden("You can only change your own profile")
        self._existing_user(user_id)

    # --- reading ------------------------------------------------------------------------

    def profile(self, user_id: str) -> dict:
        self._existing_user(user_id)
        return self.store.profile(user_id)

    def field(self, user_id: str, key: str) -> dict:
        self._check_key(key)
        profile = self.profile(user_id)
        if key not in profile:
            raise not_found(f"No {key} in this profile")
        return {key: profile[key]}

    # --- writing ------------------------------------------------------------------------

    def set_field(self, requester, user_id: str, key: str, value) -> None:
        self._check_key(key)
        self._check_may_change(requester, user_id)
        if key == "displayname" and not (
            isinstance(value, str) and len(value) <= MAX_DISPLAYNAME_LENGTH
        ):
            raise bad_json(
                f"displayname must be a string of at most {MAX_DISPLAYNAME_LENGTH} characters"
            )
        if key == "avatar_url" and not (
            isinstance(value, str)
            and len(value) <= MAX_AVATAR_URL_LENGTH
            and (value == "" or _MXC.fullmatch(value))
        ):
            raise bad_json("avatar_url must be an mxc:// URI")
        if key == "m.tz" and not isinstance(value, str):
            raise bad_json("m.tz must be a string")
        try:
            self.store.set_field(user_id, key, value, MAX_PROFILE_BYTES)
        except ProfileTooLarge:
            raise MatrixError(
                400, Codes.PROFILE_TOO_LARGE, f"A profile is at most {MAX_PROFILE_BYTES} bytes"
            ) from None
        if key in MEMBER_FIELDS:
            self.rooms.update_member_profile(user_id)

    def delete_field(self, requester, user_id: str, key: str) -> None:
        self._check_key(key)
        self._check_may_change(requester, user_id)
        self.store.delete_field(user_id, key)
        if key in MEMBER_FIELDS:
            self.rooms.update_member_profile(user_id)
