"""Spaces for other servers (X-Matrix authenticated): `GET /hierarchy/{roomId}`
(rooms/hierarchy.py)."""

from __future__ import annotations

from flask import Blueprint

from homeserver.api.context import runtime
from homeserver.api.federation_auth import current_origin, requires_server_auth
from homeserver.http.parsing import query_bool
from homeserver.http.responses import json_response

bp = Blueprint("federation_spaces", __name__, url_prefix="/_matrix/federation/v1")


@bp.get("/hierarchy/<room_id>")
@requires_server_auth
def hierarchy(room_id: str):
    hierarchy = runtime().space_hierarchy
    body = hierarchy.federation_hierarchy(
        current_origin(), room_id, query_bool("suggested_only", False)
    )
    return json_response(body)
