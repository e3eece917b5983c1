"""Presence (client-server spec, "Presence"): homeserver/sync/presence.py does the work."""

from __future__ import annotations

from flask import Blueprint

from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import runtime
from homeserver.http.parsing import json_object
from homeserver.http.responses import json_response

bp = Blueprint("presence", __name__, url_prefix="/_matrix/client/v3")


@bp.put("/presence/<user_id>/status")
@requires_auth
def set_status(user_id: str):
    runtime().presence.set_status(current_requester().user_id, user_id, json_object())
    return json_response({})


@bp.get("/presence/<user_id>/status")
@requires_auth
def status(user_id: str):
    return json_response(runtime().presence.status(current_requester().user_id, user_id))
