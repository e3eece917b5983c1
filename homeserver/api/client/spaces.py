"""Spaces over the client-server API (v1): `GET /rooms/{roomId}/hierarchy`
(rooms/hierarchy.py)."""

from __future__ import annotations

from flask import Blueprint

from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import outbound_caller, runtime
from homeserver.http.parsing import query_bool, query_int, query_str
from homeserver.http.responses import json_response
from homeserver.rooms.hierarchy import DEFAULT_LIMIT, MAX_LIMIT, HierarchyRequest

bp = Blueprint("spaces", __name__, url_prefix="/_matrix/client/v1")


@bp.get("/rooms/<room_id>/hierarchy")
@requires_auth
def hierarchy(room_id: str):
    req = HierarchyRequest(
        room_id,
        query_bool("suggested_only", False),
        query_int("max_depth", None, minimum=0),
        query_int("limit", DEFAULT_LIMIT, minimum=1, maximum=MAX_LIMIT),
        query_str("from"),
    )
    user_id = current_requester().user_id
    return json_response(
        runtime().space_hierarchy.client_hierarchy(user_id, req, outbound_caller())
    )
