"""Relationships over the client-server API (v1): an event's children, `GET /relations`,
and a room's threads, `GET /threads` (rooms/relations.py)."""

from __future__ import annotations

from flask import Blueprint

from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import runtime
from homeserver.core.errors import invalid_param
from homeserver.http.parsing import query_int, query_str
from homeserver.http.responses import json_response
from homeserver.rooms.relations import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    THREADS_DEFAULT_LIMIT,
    RelationsRequest,
)

bp = Blueprint("relations", __name__, url_prefix="/_matrix/client/v1")


def _recurse() -> bool | None:
    raw = query_str("recurse")
    if raw is None:
        return None
    if raw not in ("true", "false"):
        raise invalid_param("recurse must be true or false")
    return raw == "true"


@bp.get("/rooms/<room_id>/relations/<event_id>")
@bp.get("/rooms/<room_id>/relations/<event_id>/<rel_type>")
@bp.get("/rooms/<room_id>/relations/<event_id>/<rel_type>/<event_type>")
@requires_auth
def relations(room_id: str, event_id: str, rel_type: str | None = None, event_type=None):
    direction = query_str("dir") or "b"
    if direction not in ("b", "f"):
        raise invalid_param("dir must be b or f")
    req = RelationsRequest(
        room_id,
        event_id,
        rel_type,
        event_type,
        query_str("from"),
        query_str("to"),
        direction == "b",
        query_int("limit", DEFAULT_LIMIT, minimum=0, maximum=MAX_LIMIT),
        _recurse(),
    )
    return json_response(runtime().relations.relations(current_requester(), req))


@bp.get("/rooms/<room_id>/threads")
@requires_auth
def threads(room_id: str):
    include = query_str("include") or "all"
    if include not in ("all", "participated"):
        raise invalid_param("include must be all or participated")
    body = runtime().relations.threads(
        current_requester(),
        room_id,
        include == "participated",
        query_int("limit", THREADS_DEFAULT_LIMIT, minimum=1, maximum=MAX_LIMIT),
        query_str("from"),
    )
    return json_response(body)
