"""User search over the client-server API: `POST /user_directory/search`
(accounts/user_directory.py)."""

from __future__ import annotations

from flask import Blueprint
from marshmallow import Schema, fields

from homeserver.accounts.user_directory import DEFAULT_LIMIT
from homeserver.api.auth import current_requester, enforce_rate_limit, requires_auth
from homeserver.api.context import runtime
from homeserver.http.parsing import validated_json
from homeserver.http.responses import json_response

bp = Blueprint("user_directory", __name__, url_prefix="/_matrix/client/v3")

# A term and a limit; more than this is no search.
MAX_SEARCH_BYTES = 16 * 1024


class SearchBody(Schema):
    search_term = fields.String(required=True)
    limit = fields.Integer(load_default=DEFAULT_LIMIT, strict=True)


@bp.post("/user_directory/search")
@requires_auth
def search():
    rt = runtime()
    requester = current_requester()
    enforce_rate_limit(rt.user_directory_rate_limiter, requester.user_id)
    body = validated_json(SearchBody(), MAX_SEARCH_BYTES)
    return json_response(rt.user_directory.search(requester, body["search_term"], body["limit"]))
