"""Profile queries from other servers (``GET /_matrix/federation/v1/query/profile``)."""

from __future__ import annotations

from flask import Blueprint, request

from homeserver.api.context import runtime
from homeserver.api.federation_auth import requires_server_auth
from homeserver.core.errors import invalid_param, missing_param
from homeserver.core.identifiers import server_of
from homeserver.http.responses import json_response

bp = Blueprint("federation_profile", __name__)

PROFILE_FIELDS = ("displayname", "avatar_url")


@bp.get("/_matrix/federation/v1/query/profile")
@requires_server_auth
def query_profile():
    user_id = request.args.get("user_id")
    if not user_id:
        raise missing_param("Missing parameter: user_id")
    field = request.args.get("field")
    if field is not None and field not in PROFILE_FIELDS:
        raise invalid_param(f"field must be one of {', '.join(PROFILE_FIELDS)}")
    rt = runtime()
    if server_of(user_id) != rt.server_name:
        raise invalid_param("User is not hosted on this homeserver")
    profile = rt.profiles.profile(user_id)  # 404 M_NOT_FOUND for an unknown user
    wanted = (field,) if field is not None else PROFILE_FIELDS
    # A field the user has not set is left out, not an error (the spec's "if set").
    return json_response({k: profile[k] for k in wanted if k in profile})
