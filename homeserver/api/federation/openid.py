"""OpenID userinfo (server-server spec, "OpenID"): a third party given one of our users'
OpenID tokens asks whose it is. Authenticated by that token, not by X-Matrix (the spec
says so: the asker is no homeserver), so it is listed in UNAUTHENTICATED_ROUTES."""

from __future__ import annotations

from flask import Blueprint, request

from homeserver.api.context import runtime
from homeserver.http.responses import json_response

bp = Blueprint("federation_openid", __name__)


@bp.get("/_matrix/federation/v1/openid/userinfo")
def userinfo():
    user_id = runtime().openid_tokens.user_of(request.args.get("access_token"))
    return json_response({"sub": user_id})
