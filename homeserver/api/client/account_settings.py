"""Account settings (client-server spec, "Account registration and management", "OpenID"):
changing the password, deactivating the account, and OpenID tokens for third parties. The
first two take user-interactive auth with the current password (accounts/uia.py)."""

from __future__ import annotations

from flask import Blueprint
from marshmallow import Schema, fields, validate

from homeserver.api.auth import current_requester, require_password_auth, requires_auth
from homeserver.api.context import outbound_caller, runtime
from homeserver.http.parsing import json_object
from homeserver.http.parsing import validate as validate_body
from homeserver.http.responses import json_response

bp = Blueprint("account_settings", __name__, url_prefix="/_matrix/client/v3")


class PasswordBody(Schema):
    new_password = fields.String(required=True, validate=validate.Length(min=1, max=512))
    logout_devices = fields.Boolean(load_default=True)


class DeactivateBody(Schema):
    erase = fields.Boolean(load_default=False)
    id_server = fields.String()


@bp.post("/account/password")
@requires_auth
def change_password():
    raw = json_object()
    body = validate_body(PasswordBody(), raw)
    require_password_auth(raw)
    runtime().accounts.change_password(
        current_requester(), body["new_password"], body["logout_devices"]
    )
    return json_response({})


@bp.post("/account/deactivate")
@requires_auth
def deactivate():
    raw = json_object(allow_empty=True)
    body = validate_body(DeactivateBody(), raw)
    require_password_auth(raw)
    runtime().deactivation.deactivate(current_requester().user_id, body["erase"], outbound_caller())
    # No identity server was ever told of this account's third-party identifiers.
    return json_response({"id_server_unbind_result": "no-support"})


@bp.post("/user/<user_id>/openid/request_token")
@requires_auth
def openid_request_token(user_id: str):
    json_object(allow_empty=True)  # the spec's body is `{}`; anything else is still read off
    return json_response(runtime().openid_tokens.issue(current_requester(), user_id))


@bp.get("/voip/turnServer")
@requires_auth
def turn_server():
    return json_response(runtime().turn.for_user(current_requester().user_id))
