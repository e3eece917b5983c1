"""Device management (client-server spec, "Device management"): list, read, rename and
delete devices; deleting asks for the password (user-interactive auth)."""

from __future__ import annotations

from flask import Blueprint

from homeserver.api.auth import current_requester, require_password_auth, requires_auth
from homeserver.api.context import runtime
from homeserver.core.errors import invalid_param, missing_param
from homeserver.e2ee.devices import MAX_DISPLAY_NAME
from homeserver.http.parsing import json_object
from homeserver.http.responses import json_response

bp = Blueprint("devices", __name__, url_prefix="/_matrix/client/v3")


@bp.get("/devices")
@requires_auth
def list_devices():
    return json_response({"devices": runtime().devices.all(current_requester())})


@bp.get("/devices/<device_id>")
@requires_auth
def get_device(device_id: str):
    return json_response(runtime().devices.get(current_requester(), device_id))


@bp.put("/devices/<device_id>")
@requires_auth
def rename_device(device_id: str):
    body = json_object(allow_empty=True)
    name = body.get("display_name")
    if name is not None and (not isinstance(name, str) or len(name) > MAX_DISPLAY_NAME):
        raise invalid_param(f"display_name must be a string of at most {MAX_DISPLAY_NAME}")
    if "display_name" in body:
        runtime().devices.rename(current_requester(), device_id, name)
    else:
        runtime().devices.get(current_requester(), device_id)  # 404 for a device not ours
    return json_response({})


@bp.delete("/devices/<device_id>")
@requires_auth
def delete_device(device_id: str):
    body = json_object(allow_empty=True)
    require_password_auth(body)
    runtime().devices.delete(current_requester(), [device_id])
    return json_response({})


@bp.post("/delete_devices")
@requires_auth
def delete_devices():
    body = json_object()
    devices = body.get("devices")
    if devices is None:
        raise missing_param("Missing parameter: devices")
    if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
        raise invalid_param("devices must be a list of device IDs")
    require_password_auth(body)
    runtime().devices.delete(current_requester(), devices)
    return json_response({})
