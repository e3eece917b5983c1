"""Server-side key backups (client-server spec, "Server-side key backups"): /room_keys/version
and /room_keys/keys at each level. The service is e2ee/key_backup.py."""

from __future__ import annotations

import json
from typing import Iterable, Iterator

from flask import Blueprint, Response, request

from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import runtime
from homeserver.e2ee.key_backup import check_room_id, parse_room, parse_room_key, parse_rooms
from homeserver.http.parsing import json_object
from homeserver.http.responses import json_response
from homeserver.storage.key_backup import RoomKey

bp = Blueprint("key_backup", __name__, url_prefix="/_matrix/client/v3/room_keys")

# A version's auth_data is a public key and a few signatures.
MAX_VERSION_BODY_BYTES = 64 * 1024
# One session's key is about a kilobyte; a batch holds a few hundred (and at most
# MAX_SESSIONS_PER_REQUEST, which the service checks).
MAX_SESSION_BODY_BYTES = 64 * 1024
MAX_KEYS_BODY_BYTES = 2 * 1024 * 1024
# A streamed answer is sent in pieces of about this size.
CHUNK_BYTES = 64 * 1024


def _version() -> str:
    return request.args.get("version", "")


# --- versions ------------------------------------------------------------------------------


@bp.post("/version")
@requires_auth
def create_version():
    body = json_object(max_bytes=MAX_VERSION_BODY_BYTES)
    return json_response(runtime().key_backup.create_version(current_requester(), body))


@bp.get("/version")
@requires_auth
def current_version():
    return json_response(runtime().key_backup.get_version(current_requester(), None))


@bp.get("/version/<version>")
@requires_auth
def get_version(version: str):
    return json_response(runtime().key_backup.get_version(current_requester(), version))


@bp.put("/version/<version>")
@requires_auth
def update_version(version: str):
    body = json_object(max_bytes=MAX_VERSION_BODY_BYTES)
    return json_response(runtime().key_backup.update_version(current_requester(), version, body))


@bp.delete("/version/<version>")
@requires_auth
def delete_version(version: str):
    return json_response(runtime().key_backup.delete_version(current_requester(), version))


# --- keys ----------------------------------------------------------------------------------


@bp.put("/keys")
@requires_auth
def put_all():
    rooms = parse_rooms(json_object(max_bytes=MAX_KEYS_BODY_BYTES))
    return json_response(runtime().key_backup.put_keys(current_requester(), _version(), rooms))


@bp.put("/keys/<room_id>")
@requires_auth
def put_room(room_id: str):
    check_room_id(room_id)
    sessions = parse_room(json_object(max_bytes=MAX_KEYS_BODY_BYTES))
    rooms = {room_id: sessions}
    return json_response(runtime().key_backup.put_keys(current_requester(), _version(), rooms))


@bp.put("/keys/<room_id>/<session_id>")
@requires_auth
def put_session(room_id: str, session_id: str):
    check_room_id(room_id)
    key = parse_room_key(json_object(max_bytes=MAX_SESSION_BODY_BYTES), "body")
    rooms = {room_id: {session_id: key}}
    return json_response(runtime().key_backup.put_keys(current_requester(), _version(), rooms))


@bp.get("/keys")
@requires_auth
def get_all():
    keys = runtime().key_backup.keys(current_requester(), _version())
    return _streamed(_rooms_json(keys))


@bp.get("/keys/<room_id>")
@requires_auth
def get_room(room_id: str):
    check_room_id(room_id)
    keys = runtime().key_backup.keys(current_requester(), _version(), room_id)
    return _streamed(_sessions_json(keys))


@bp.get("/keys/<room_id>/<session_id>")
@requires_auth
def get_session(room_id: str, session_id: str):
    check_room_id(room_id)
    key = runtime().key_backup.key(current_requester(), _version(), room_id, session_id)
    return json_response(key)


@bp.delete("/keys")
@requires_auth
def delete_all():
    return json_response(runtime().key_backup.delete_keys(current_requester(), _version()))


@bp.delete("/keys/<room_id>")
@requires_auth
def delete_room(room_id: str):
    check_room_id(room_id)
    changed = runtime().key_backup.delete_keys(current_requester(), _version(), room_id)
    return json_response(changed)


@bp.delete("/keys/<room_id>/<session_id>")
@requires_auth
def delete_session(room_id: str, session_id: str):
    check_room_id(room_id)
    changed = runtime().key_backup.delete_keys(current_requester(), _version(), room_id, session_id)
    return json_response(changed)


# --- streamed answers ----------------------------------------------------------------------
# A whole backup may hold tens of thousands of keys: its JSON is written as the store's pages
# arrive, never built in memory.


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _rooms_json(keys: Iterable[tuple[str, str, RoomKey]]) -> Iterator[str]:
    """`{"rooms": {room_id: {"sessions": {session_id: key}}}}`"""
    yield '{"rooms":{'
    room = None
    for room_id, session_id, key in keys:
        if room_id != room:
            yield ("}}," if room is not None else "") + _dumps(room_id) + ':{"sessions":{'
        else:
            yield ","
        room = room_id
        yield _dumps(session_id) + ":" + _dumps(key.to_json())
    yield ("}}" if room is not None else "") + "}}"


def _sessions_json(keys: Iterable[tuple[str, str, RoomKey]]) -> Iterator[str]:
    """`{"sessions": {session_id: key}}`"""
    yield '{"sessions":{'
    for i, (_, session_id, key) in enumerate(keys):
        yield ("," if i else "") + _dumps(session_id) + ":" + _dumps(key.to_json())
    yield "}}"


def _chunks(parts: Iterator[str]) -> Iterator[bytes]:
    buffer: list[str] = []
    size = 0
    for part in parts:
        buffer.append(part)
        size += len(part)
        if size >= CHUNK_BYTES:
            yield "".join(buffer).encode("utf-8")
            buffer, size = [], 0
    yield "".join(buffer).encode("utf-8")


def _streamed(parts: Iterator[str]) -> Response:
    return Response(_chunks(parts), mimetype="application/json")
