"""Shared-secret registration, in Synapse's shape, because provisioning tools speak it."""

from __future__ import annotations

import hashlib
import hmac

from flask import Blueprint
from marshmallow import Schema, fields, validate

from ...errors import MatrixError, forbidden
from ...http.context import runtime
from ...http.parsing import validated_json
from ...http.responses import json_response

bp = Blueprint("admin", __name__, url_prefix="/_synapse/admin/v1")


class AdminRegisterBody(Schema):
    nonce = fields.String(required=True)
    username = fields.String(required=True, validate=validate.Length(min=1, max=255))
    password = fields.String(required=True, validate=validate.Length(min=1, max=512))
    admin = fields.Boolean(load_default=False)
    mac = fields.String(required=True)
    user_type = fields.String(load_default=None, allow_none=True)


def expected_mac(shared_secret: str, nonce: str, username: str, password: str, admin: bool,
                 user_type: str | None) -> str:
    mac = hmac.new(shared_secret.encode("utf-8"), digestmod=hashlib.sha1)
    parts = [nonce, username, password, "admin" if admin else "notadmin"]
    if user_type:
        parts.append(user_type)
    mac.update(b"\x00".join(p.encode("utf-8") for p in parts))
    return mac.hexdigest()


def _shared_secret() -> str:
    secret = runtime().config.registration.shared_secret
    if not secret:
        raise MatrixError(400, "M_UNKNOWN", "Shared secret registration is not enabled")
    return secret


@bp.get("/register")
def nonce():
    _shared_secret()
    return json_response({"nonce": runtime().registration_sessions.admin_nonces.new()})


@bp.post("/register")
def register():
    rt = runtime()
    secret = _shared_secret()
    body = validated_json(AdminRegisterBody())
    if not rt.registration_sessions.admin_nonces.take(body["nonce"]):
        raise MatrixError(400, "M_UNKNOWN", "unrecognised nonce")
    want = expected_mac(secret, body["nonce"], body["username"], body["password"],
                        body["admin"], body["user_type"])
    if not hmac.compare_digest(want, body["mac"].lower()):
        raise forbidden("HMAC incorrect")
    result = rt.accounts.register(body["username"].lower(), body["password"], admin=body["admin"])
    return json_response({"user_id": result.user_id, "access_token": result.access_token,
                          "device_id": result.device_id, "home_server": rt.server_name})
