"""Shared-secret registration, in Synapse's shape (homeserver/accounts/shared_secret.py)."""

from __future__ import annotations

from flask import Blueprint
from marshmallow import Schema, fields, validate

from homeserver.api.context import runtime
from homeserver.http.parsing import validated_json
from homeserver.http.responses import json_response

bp = Blueprint("admin", __name__, url_prefix="/_synapse/admin/v1")


class AdminRegisterBody(Schema):
    nonce = fields.String(required=True)
    username = fields.String(required=True, validate=validate.Length(min=1, max=255))
    password = fields.String(required=True, validate=validate.Length(min=1, max=512))
    admin = fields.Boolean(load_default=False)
    mac = fields.String(required=True)
    user_type = fields.String(load_default=None, allow_none=True)


@bp.get("/register")
def nonce():
    return json_response({"nonce": runtime().shared_secret_registration.new_nonce()})


@bp.post("/register")
def register():
    rt = runtime()
    rt.shared_secret_registration.require_enabled()
    body = validated_json(AdminRegisterBody())
    result = rt.shared_secret_registration.register(
        body["nonce"],
        body["username"],
        body["password"],
        body["admin"],
        body["user_type"],
        body["mac"],
    )
    return json_response(
        {
            "user_id": result.user_id,
            "access_token": result.access_token,
            "device_id": result.device_id,
            "home_server": rt.server_name,
        }
    )
