"""End-to-end encryption keys and to-device messages (client-server spec, "End-to-End
Encryption" and "Send-to-Device messaging")."""

from __future__ import annotations

from flask import Blueprint, request

from homeserver.api.auth import current_requester, enforce_rate_limit, requires_auth
from homeserver.api.context import outbound_caller, runtime
from homeserver.core.errors import invalid_param, missing_param
from homeserver.e2ee.sync_part import Range
from homeserver.http.parsing import json_object
from homeserver.http.responses import json_response
from homeserver.sync.tokens import SyncToken

bp = Blueprint("keys", __name__, url_prefix="/_matrix/client/v3")

# A client shares a room key with every device in a room in one request: a few hundred
# bytes each, for thousands of devices.
MAX_TO_DEVICE_BYTES = 8 * 1024 * 1024


@bp.post("/keys/upload")
@requires_auth
def upload_keys():
    return json_response(runtime().keys.upload(current_requester(), json_object()))


@bp.post("/keys/query")
@requires_auth
def query_keys():
    body = json_object()
    if "device_keys" not in body:
        raise missing_param("Missing parameter: device_keys")
    keys = runtime().keys
    return json_response(keys.query(current_requester(), body["device_keys"], outbound_caller()))


@bp.post("/keys/claim")
@requires_auth
def claim_keys():
    body = json_object()
    if "one_time_keys" not in body:
        raise missing_param("Missing parameter: one_time_keys")
    keys = runtime().keys
    return json_response(keys.claim(current_requester(), body["one_time_keys"], outbound_caller()))


@bp.get("/keys/changes")
@requires_auth
def key_changes():
    start, end = request.args.get("from"), request.args.get("to")
    if not start or not end:
        raise missing_param("Missing parameter: from and to")
    since, until = SyncToken.parse(start), SyncToken.parse(end)
    span = Range(since.events, until.events, since.device_lists, until.device_lists, 0, 0)
    return json_response(runtime().keys.changes(current_requester(), span))


@bp.post("/keys/device_signing/upload")
@requires_auth
def upload_cross_signing_keys():
    rt = runtime()
    requester = current_requester()
    body = json_object()
    if rt.keys.cross_signing.needs_auth(requester, body):
        auth = body.get("auth")
        if isinstance(auth, dict) and "type" in auth:
            enforce_rate_limit(rt.login_rate_limiter)
        rt.uia.require_password(requester, auth)
    rt.keys.cross_signing.upload_keys(requester, body)
    return json_response({})


@bp.post("/keys/signatures/upload")
@requires_auth
def upload_signatures():
    return json_response(
        runtime().keys.cross_signing.upload_signatures(
            current_requester(), json_object(), outbound_caller()
        )
    )


@bp.put("/sendToDevice/<event_type>/<txn_id>")
@requires_auth
def send_to_device(event_type: str, txn_id: str):
    body = json_object(max_bytes=MAX_TO_DEVICE_BYTES)
    if "messages" not in body:
        raise missing_param("Missing parameter: messages")
    if not event_type or len(event_type) > 255:
        raise invalid_param("eventType must be 1 to 255 characters")
    runtime().to_device.send(current_requester(), event_type, txn_id, body["messages"])
    return json_response({})
