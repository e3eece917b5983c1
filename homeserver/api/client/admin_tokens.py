"""Registration tokens for server admins, in Synapse's admin API shape
(accounts/registration_tokens.py)."""

from __future__ import annotations

from flask import Blueprint, request

from homeserver.api.auth import requires_admin
from homeserver.api.context import runtime
from homeserver.core.errors import invalid_param
from homeserver.http.parsing import json_object
from homeserver.http.responses import json_response

bp = Blueprint("admin_tokens", __name__, url_prefix="/_synapse/admin/v1/registration_tokens")


@bp.get("")
@requires_admin
def list_tokens():
    valid = {"true": True, "false": False, None: None}
    flag = request.args.get("valid")
    if flag not in valid:
        raise invalid_param("valid must be true or false")
    tokens = runtime().registration_tokens.list(valid[flag])
    return json_response({"registration_tokens": [t.as_json() for t in tokens]})


@bp.post("/new")
@requires_admin
def new_token():
    body = json_object(allow_empty=True)
    return json_response(runtime().registration_tokens.create(body).as_json())


@bp.get("/<token>")
@requires_admin
def get_token(token: str):
    return json_response(runtime().registration_tokens.get(token).as_json())


@bp.put("/<token>")
@requires_admin
def update_token(token: str):
    body = json_object(allow_empty=True)
    return json_response(runtime().registration_tokens.update(token, body).as_json())


@bp.delete("/<token>")
@requires_admin
def delete_token(token: str):
    runtime().registration_tokens.delete(token)
    return json_response({})
