"""Simplified sliding sync (MSC4186) on its unstable path (sync/sliding.py)."""

from __future__ import annotations

from flask import Blueprint, request

from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import runtime
from homeserver.core.errors import invalid_param
from homeserver.http.later import LaterResponse
from homeserver.http.parsing import forget_body, object_from, query_int, query_str, read_body
from homeserver.http.responses import json_response
from homeserver.sync.presence import STATES as PRESENCE_STATES
from homeserver.sync.sliding import WaitingSlidingSync

bp = Blueprint(
    "sliding_sync", __name__, url_prefix="/_matrix/client/unstable/org.matrix.simplified_msc3575"
)

# Lists, subscriptions and their required_state, with room for a hundred of each.
MAX_SLIDING_SYNC_BYTES = 512 * 1024


def _body_param(body: dict, name: str, kind: type):
    value = body.get(name)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise invalid_param(f"{name} must be a {kind.__name__}")
    return value


@bp.post("/sync")
@requires_auth
def sliding_sync():
    parsed = runtime().sliding_sync.requests.parse(read_body(MAX_SLIDING_SYNC_BYTES), object_from)
    forget_body()  # what a parked connection keeps is the shared parse (sliding_request.py)
    body, sliding_request = parsed
    # Clients of the unstable path put pos and timeout in the query; the MSC's final text
    # moved them into the body (no CORS preflight for each request).
    pos = query_str("pos") or _body_param(body, "pos", str) or None
    timeout_ms = query_int("timeout", None, minimum=0)
    if timeout_ms is None:
        timeout_ms = _body_param(body, "timeout", int) or 0
        if timeout_ms < 0:
            raise invalid_param("timeout must not be negative")
    set_presence = query_str("set_presence") or _body_param(body, "set_presence", str)
    if set_presence not in (None, *PRESENCE_STATES):
        raise invalid_param("set_presence must be one of " + ", ".join(PRESENCE_STATES))
    requester = current_requester()
    runtime().presence.syncing(requester.user_id, set_presence, timeout_ms)
    found = runtime().sliding_sync.begin(requester, sliding_request, pos, timeout_ms)
    if isinstance(found, WaitingSlidingSync):
        # As /sync: waited for once Flask is done, holding no main-pool place.
        return LaterResponse(request.environ, found.answer, found.close)
    return json_response(found)
