"""Server-side key backups (client-server spec, "Server-side key backups").

A user's devices store their megolm session keys here, encrypted to a backup key the server
never sees, and read them back on a new device. The server keeps what it is given: it checks
shapes and sizes, keeps the better of two keys for one session by the spec's rule, and never
interprets `auth_data` or `session_data`. In particular it does not check the signatures in
`auth_data`: the spec asks clients to decide whether they trust a backup, not the server.
"""

from __future__ import annotations

import re
from typing import Iterator

from homeserver.core.errors import (
    Codes,
    MatrixError,
    bad_json,
    invalid_param,
    missing_param,
    not_found,
)
from homeserver.core.identifiers import is_valid_room_id
from homeserver.core.requester import Requester
from homeserver.storage.key_backup import (
    BackupVersion,
    KeyBackupStore,
    KeysChanged,
    NotCurrentVersion,
    RoomKey,
    UnknownVersion,
)

# The one algorithm the spec defines. Others (a newer MSC's) are stored as given, as Synapse
# does: the server never reads the data either way.
MEGOLM_BACKUP_V1 = "m.megolm_backup.v1.curve25519-aes-sha2"
MAX_ALGORITHM_LENGTH = 255
MAX_ID_LENGTH = 255  # a room or session ID; megolm session IDs are 43 characters
# One upload names at most this many sessions: clients upload in batches of a few hundred,
# and one request is one database transaction.
MAX_SESSIONS_PER_REQUEST = 1000
# JSON integers a client may send (the spec's canonical JSON range).
MAX_JSON_INT = 2**53 - 1
# Version numbers are 1, 2, 3...; anything else names no version.
_VERSION = re.compile(r"[1-9][0-9]{0,15}")


def keep_new(stored: RoomKey, uploaded: RoomKey) -> bool:
    """Whether an uploaded key replaces the stored key for the same session. The spec's
    order: a verified key beats an unverified one; then the lower first_message_index (it
    decrypts more of the session); then the lower forwarded_count. A tie keeps the stored
    key, so an upload of the same key changes nothing."""

    def rank(key: RoomKey) -> tuple[int, int, int]:
        return (0 if key.is_verified else 1, key.first_message_index, key.forwarded_count)

    return rank(uploaded) < rank(stored)


def parse_version(version: str) -> int | None:
    return int(version) if _VERSION.fullmatch(version) else None


def _check_algorithm(body: dict) -> str:
    algorithm = body.get("algorithm")
    if algorithm is None:
        raise missing_param("Missing parameter: algorithm")
    if not isinstance(algorithm, str) or not 0 < len(algorithm) <= MAX_ALGORITHM_LENGTH:
        raise bad_json(f"algorithm must be a string of 1 to {MAX_ALGORITHM_LENGTH} characters")
    return algorithm


def _check_auth_data(body: dict) -> dict:
    auth_data = body.get("auth_data")
    if auth_data is None:
        raise missing_param("Missing parameter: auth_data")
    if not isinstance(auth_data, dict):
        raise bad_json("auth_data must be an object")
    return auth_data


def _integer(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_JSON_INT:
        raise bad_json(f"{where} must be a non-negative integer")
    return value


def parse_room_key(value, where: str) -> RoomKey:
    """A KeyBackupData object from a client, checked field by field."""
    if not isinstance(value, dict):
        raise bad_json(f"{where} must be an object")
    for field in ("first_message_index", "forwarded_count", "is_verified", "session_data"):
        if field not in value:
            raise missing_param(f"Missing parameter: {where}.{field}")
    if not isinstance(value["is_verified"], bool):
        raise bad_json(f"{where}.is_verified must be a boolean")
    if not isinstance(value["session_data"], dict):
        raise bad_json(f"{where}.session_data must be an object")
    return RoomKey(
        _integer(value["first_message_index"], f"{where}.first_message_index"),
        _integer(value["forwarded_count"], f"{where}.forwarded_count"),
        value["is_verified"],
        value["session_data"],
    )


def _check_id(value: str, what: str) -> None:
    if not value or len(value) > MAX_ID_LENGTH:
        raise invalid_param(f"{what} must be 1 to {MAX_ID_LENGTH} characters")


def check_room_id(room_id: str) -> None:
    _check_id(room_id, "room ID")
    if not is_valid_room_id(room_id):
        raise invalid_param(f"Not a valid room ID: {room_id}")


def _sessions(value, where: str) -> dict[str, RoomKey]:
    if not isinstance(value, dict):
        raise bad_json(f"{where} must be an object")
    if "sessions" not in value:
        raise missing_param(f"Missing parameter: {where}.sessions")
    sessions = value["sessions"]
    if not isinstance(sessions, dict):
        raise bad_json(f"{where}.sessions must be an object")
    parsed = {}
    for session_id, key in sessions.items():
        _check_id(session_id, "session ID")
        parsed[session_id] = parse_room_key(key, f"{where}.sessions.{session_id}")
    return parsed


def parse_rooms(body: dict) -> dict[str, dict[str, RoomKey]]:
    """The `rooms` of a PUT /room_keys/keys body."""
    if "rooms" not in body:
        raise missing_param("Missing parameter: rooms")
    rooms = body["rooms"]
    if not isinstance(rooms, dict):
        raise bad_json("rooms must be an object")
    parsed = {}
    for room_id, room in rooms.items():
        check_room_id(room_id)
        parsed[room_id] = _sessions(room, f"rooms.{room_id}")
    return parsed


def parse_room(body: dict) -> dict[str, RoomKey]:
    """The `sessions` of a PUT /room_keys/keys/{roomId} body."""
    return _sessions(body, "body")


def wrong_version(current: int) -> MatrixError:
    return MatrixError(
        403,
        Codes.WRONG_ROOM_KEYS_VERSION,
        "Keys can only be written to the current backup version",
        current_version=str(current),
    )


def version_json(found: BackupVersion) -> dict:
    return {
        "version": str(found.version),
        "algorithm": found.algorithm,
        "auth_data": found.auth_data,
        "etag": str(found.etag),
        "count": found.count,
    }


def changed_json(changed: KeysChanged) -> dict:
    return {"etag": str(changed.etag), "count": changed.count}


class KeyBackupService:
    def __init__(self, store: KeyBackupStore):
        self.store = store

    # --- versions --------------------------------------------------------------------------

    def create_version(self, requester: Requester, body: dict) -> dict:
        algorithm, auth_data = _check_algorithm(body), _check_auth_data(body)
        version = self.store.create_version(requester.user_id, algorithm, auth_data)
        return {"version": str(version)}

    def get_version(self, requester: Requester, version: str | None) -> dict:
        """The named version, or the current one when `version` is None."""
        number = None if version is None else parse_version(version)
        found = None
        if version is None or number is not None:
            found = self.store.version(requester.user_id, number)
        if found is None:
            raise not_found("No backup found" if version is None else "Unknown backup version")
        return version_json(found)

    def update_version(self, requester: Requester, version: str, body: dict) -> dict:
        """Replaces auth_data; the algorithm stays what it was (spec: PUT
        /room_keys/version/{version})."""
        algorithm, auth_data = _check_algorithm(body), _check_auth_data(body)
        if "version" in body and body["version"] != version:
            raise invalid_param("The version in the body does not match the path")
        number = parse_version(version)
        found = None if number is None else self.store.version(requester.user_id, number)
        if found is None:
            raise not_found("Unknown backup version")
        if found.algorithm != algorithm:
            raise invalid_param("The algorithm does not match the backup's algorithm")
        if not self.store.update_version(requester.user_id, found.version, auth_data):
            raise not_found("Unknown backup version")
        return {}

    def delete_version(self, requester: Requester, version: str) -> dict:
        """Deletes the version and its keys; deleting it again succeeds (spec)."""
        number = parse_version(version)
        if number is None or not self.store.delete_version(requester.user_id, number):
            raise not_found("Unknown backup version")
        return {}

    # --- keys ------------------------------------------------------------------------------

    def put_keys(
        self, requester: Requester, version: str, rooms: dict[str, dict[str, RoomKey]]
    ) -> dict:
        total = sum(len(sessions) for sessions in rooms.values())
        if total > MAX_SESSIONS_PER_REQUEST:
            raise MatrixError(
                413,
                Codes.TOO_LARGE,
                f"At most {MAX_SESSIONS_PER_REQUEST} sessions in one request",
            )
        number = self._number(version)
        try:
            changed = self.store.put_keys(requester.user_id, number, rooms, keep_new)
        except UnknownVersion:
            raise not_found(f"Unknown backup version: {version}") from None
        except NotCurrentVersion as e:
            raise wrong_version(e.current) from None
        return changed_json(changed)

    def delete_keys(
        self,
        requester: Requester,
        version: str,
        room_id: str | None = None,
        session_id: str | None = None,
    ) -> dict:
        number = self._number(version)
        try:
            changed = self.store.delete_keys(requester.user_id, number, room_id, session_id)
        except UnknownVersion:
            raise not_found(f"Unknown backup version: {version}") from None
        return changed_json(changed)

    def keys(
        self,
        requester: Requester,
        version: str,
        room_id: str | None = None,
        session_id: str | None = None,
    ) -> Iterator[tuple[str, str, RoomKey]]:
        """The version's keys, page by page from the store; 404 first if the version is not
        live, so that a refusal comes before any of the answer."""
        number = self._number(version)
        if not self.store.has_version(requester.user_id, number):
            raise not_found(f"Unknown backup version: {version}")
        return self.store.key_pages(requester.user_id, number, room_id, session_id)

    def key(self, requester: Requester, version: str, room_id: str, session_id: str) -> dict:
        for _, _, key in self.keys(requester, version, room_id, session_id):
            return key.to_json()
        raise not_found("No key for this session in the backup")

    @staticmethod
    def _number(version: str | None) -> int:
        if version is None or version == "":
            raise missing_param("Missing parameter: version")
        number = parse_version(version)
        if number is None:
            raise not_found(f"Unknown backup version: {version}")
        return number
