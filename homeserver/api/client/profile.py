"""Profiles (client-server spec, "Profiles"). Reading needs no access token."""

from __future__ import annotations

from flask import Blueprint

from homeserver.accounts.profile import MAX_PROFILE_BYTES
from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import runtime
from homeserver.core.errors import missing_param
from homeserver.http.parsing import json_object
from homeserver.http.responses import json_response

bp = Blueprint("profile", __name__, url_prefix="/_matrix/client/v3")


@bp.get("/profile/<user_id>")
def get_profile(user_id: str):
    rt = runtime()
    return json_response(
        rt.appservices.or_asked("users", user_id, lambda: rt.profiles.profile(user_id))
    )


@bp.get("/profile/<user_id>/<key>")
def get_field(user_id: str, key: str):
    return json_response(runtime().profiles.field(user_id, key))


@bp.put("/profile/<user_id>/<key>")
@requires_auth
def put_field(user_id: str, key: str):
    body = json_object(max_bytes=MAX_PROFILE_BYTES)
    if key not in body:
        raise missing_param(f"Missing parameter: {key}")
    runtime().profiles.set_field(current_requester(), user_id, key, body[key])
    return json_response({})


@bp.delete("/profile/<user_id>/<key>")
@requires_auth
def delete_field(user_id: str, key: str):
    runtime().profiles.delete_field(current_requester(), user_id, key)
    return json_response({})
