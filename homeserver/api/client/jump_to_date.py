"""Jump to date over the client-server API (v1): `GET /timestamp_to_event`
(rooms/jump_to_date.py)."""

from __future__ import annotations

from flask import Blueprint

from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import outbound_caller, runtime
from homeserver.core.errors import invalid_param, missing_param
from homeserver.http.parsing import query_int, query_str
from homeserver.http.responses import json_response

bp = Blueprint("jump_to_date", __name__, url_prefix="/_matrix/client/v1")


def timestamp_params() -> tuple[int, bool]:
    """`ts` and whether `dir` is forward, for this endpoint and its federation twin; 400
    for a missing or impossible one."""
    ts = query_int("ts", minimum=0)
    if ts is None:
        raise missing_param("Missing parameter: ts")
    direction = query_str("dir")
    if direction is None:
        raise missing_param("Missing parameter: dir")
    if direction not in ("b", "f"):
        raise invalid_param("dir must be b or f")
    return ts, direction == "f"


@bp.get("/rooms/<room_id>/timestamp_to_event")
@requires_auth
def timestamp_to_event(room_id: str):
    ts, forward = timestamp_params()
    return json_response(
        runtime().timestamp_lookup.for_client(
            current_requester(),
            room_id,
            ts,
            forward,
            outbound_caller(),  # our history may lack it: ask the room's servers (ADR-0079)
        )
    )
