"""User profiles: displayname, avatar_url and any other profile field, one row per field."""

from __future__ import annotations

import json

from canonicaljson import encode_canonical_json

from homeserver.storage.database import Database
from homeserver.storage.user_directory import index_local_user

# The fields a member event carries (client-server spec, "Events on Change of Profile
# Information").
MEMBER_FIELDS = ("displayname", "avatar_url")


class ProfileTooLarge(Exception):
    """Storing the field would take the profile over its size limit."""


class ProfileStore:
    def __init__(self, db: Database):
        self.db = db

    def profile(self, user_id: str) -> dict:
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT field, value FROM profile_fields WHERE user_id = ? ORDER BY field",
                (user_id,),
            )
        )
        return {field: json.loads(value) for field, value in rows}

    def member_fields(self, user_id: str) -> dict:
        """The fields a member event of this user carries: those set to a non-empty string."""
        marks = ", ".join("?" for _ in MEMBER_FIELDS)
        rows = self.db.read(
            lambda tx: tx.fetchall(
                f"SELECT field, value FROM profile_fields WHERE user_id = ? AND field IN ({marks})",
                (user_id, *MEMBER_FIELDS),
            )
        )
        values = {field: json.loads(value) for field, value in rows}
        return {k: v for k, v in values.items() if isinstance(v, str) and v}

    def set_field(self, user_id: str, field: str, value, max_profile_bytes: int) -> None:
        """Sets one field. Raises ProfileTooLarge, writing nothing, if the profile as a JSON
        object would then be larger than `max_profile_bytes`."""

        def write(tx):
            rows = tx.fetchall(
                "SELECT field, value FROM profile_fields WHERE user_id = ?", (user_id,)
            )
            profile = {f: json.loads(v) for f, v in rows}
            profile[field] = value
            if len(encode_canonical_json(profile)) > max_profile_bytes:
                raise ProfileTooLarge(field)
            tx.execute(
                "INSERT INTO profile_fields (user_id, field, value) VALUES (?, ?, ?)"
                " ON CONFLICT (user_id, field) DO UPDATE SET value = excluded.value",
                (user_id, field, json.dumps(value, separators=(",", ":"))),
            )
            if field in MEMBER_FIELDS:
                index_local_user(tx, user_id)

        self.db.write(write)

    def delete_field(self, user_id: str, field: str) -> None:
        def write(tx):
            tx.execute(
                "DELETE FROM profile_fields WHERE user_id = ? AND field = ?", (user_id, field)
            )
            if field in MEMBER_FIELDS:
                index_local_user(tx, user_id)

        self.db.write(write)
