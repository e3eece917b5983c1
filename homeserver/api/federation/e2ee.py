"""Our users' keys for other servers (server-server spec, "End-to-End Encryption"):
`/user/keys/query`, `/user/keys/claim` and `/user/devices/{userId}`, X-Matrix authenticated;
homeserver/e2ee/federation.py answers and bounds them."""

from __future__ import annotations

from flask import Blueprint

from homeserver.api.context import runtime
from homeserver.api.federation_auth import requires_server_auth
from homeserver.core.errors import missing_param
from homeserver.http.parsing import DEFAULT_MAX_JSON_BYTES, json_object
from homeserver.http.responses import json_response

bp = Blueprint("federation_e2ee", __name__, url_prefix="/_matrix/federation/v1")


@bp.post("/user/keys/query")
@requires_server_auth(max_body_bytes=DEFAULT_MAX_JSON_BYTES)
def query_keys():
    body = json_object()
    if "device_keys" not in body:
        raise missing_param("Missing parameter: device_keys")
    return json_response(runtime().e2ee_federation.server.query(body["device_keys"]))


@bp.post("/user/keys/claim")
@requires_server_auth(max_body_bytes=DEFAULT_MAX_JSON_BYTES)
def claim_keys():
    body = json_object()
    if "one_time_keys" not in body:
        raise missing_param("Missing parameter: one_time_keys")
    return json_response(runtime().e2ee_federation.server.claim(body["one_time_keys"]))


@bp.get("/user/devices/<user_id>")
@requires_server_auth
def user_devices(user_id: str):
    return json_response(runtime().e2ee_federation.server.devices(user_id))
