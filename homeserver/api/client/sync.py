"""/sync and the filter API (client-server spec, "Syncing" and "Filtering")."""

from __future__ import annotations

from flask import Blueprint, request

from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import runtime
from homeserver.core.errors import invalid_param
from homeserver.http.later import LaterResponse
from homeserver.http.parsing import json_object, query_bool, query_int, query_str
from homeserver.http.responses import json_response
from homeserver.sync.filters import MAX_FILTER_BYTES
from homeserver.sync.presence import STATES as PRESENCE_STATES
from homeserver.sync.service import WaitingSync

bp = Blueprint("sync", __name__, url_prefix="/_matrix/client/v3")


@bp.get("/sync")
@requires_auth
def sync():
    set_presence = query_str("set_presence")
    if set_presence not in (None, *PRESENCE_STATES):
        raise invalid_param("set_presence must be one of " + ", ".join(PRESENCE_STATES))
    requester, timeout_ms = current_requester(), query_int("timeout", 0, minimum=0)
    runtime().presence.syncing(requester.user_id, set_presence, timeout_ms)
    found = runtime().sync.begin(
        requester,
        query_str("since") or None,
        timeout_ms,
        query_bool("full_state", False),
        query_str("filter"),
        query_bool("use_state_after", False),
    )
    if isinstance(found, WaitingSync):
        # Waited for once Flask is done with the request: it holds no main-pool place
        # meanwhile, and a client that hangs up frees its greenlet and registration at once.
        return LaterResponse(request.environ, found.answer, found.close)
    return json_response(found)


@bp.post("/user/<user_id>/filter")
@requires_auth
def create_filter(user_id: str):
    body = json_object(max_bytes=MAX_FILTER_BYTES)
    filter_id = runtime().filters.create(current_requester(), user_id, body)
    return json_response({"filter_id": filter_id})


@bp.get("/user/<user_id>/filter/<filter_id>")
@requires_auth
def get_filter(user_id: str, filter_id: str):
    return json_response(runtime().filters.get(current_requester(), user_id, filter_id))
