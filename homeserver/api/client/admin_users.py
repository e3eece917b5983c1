"""Synapse's admin API for users, as synadm calls it (admin/users.py)."""

from __future__ import annotations

from flask import Blueprint, request

from homeserver import __version__
from homeserver.api.auth import current_requester, requires_admin
from homeserver.api.context import outbound_caller, runtime
from homeserver.core.errors import invalid_param
from homeserver.http.parsing import json_object
from homeserver.http.responses import json_response

bp = Blueprint("admin_users", __name__, url_prefix="/_synapse/admin")


def query_flag(name: str, default: bool) -> bool:
    value = request.args.get(name)
    if value is None:
        return default
    if value not in ("true", "false"):
        raise invalid_param(f"{name} must be true or false")
    return value == "true"


def query_int(name: str, default: int) -> int:
    value = request.args.get(name)
    if value is None:
        return default
    if not value.isdigit() or len(value) > 15:
        raise invalid_param(f"{name} must be a non-negative integer")
    return int(value)


@bp.get("/v1/server_version")
@requires_admin
def server_version():
    return json_response({"server_version": __version__})


@bp.get("/v2/users")
@requires_admin
def list_users():
    query_flag("guests", True)  # checked; there are no guest accounts to show or hide
    page = runtime().admin_users.list(
        query_int("from", 0),
        query_int("limit", 100),
        request.args.get("name") or request.args.get("user_id"),
        query_flag("deactivated", False),
    )
    return json_response(page)


@bp.get("/v2/users/<user_id>")
@requires_admin
def user_details(user_id: str):
    return json_response(runtime().admin_users.details(user_id))


@bp.put("/v2/users/<user_id>")
@requires_admin
def put_user(user_id: str):
    body = json_object(allow_empty=True)
    details, created = runtime().admin_users.put(
        current_requester(), user_id, body, outbound_caller()
    )
    return json_response(details, 201 if created else 200)


@bp.post("/v1/deactivate/<user_id>")
@requires_admin
def deactivate(user_id: str):
    erase = json_object(allow_empty=True).get("erase", False)
    if not isinstance(erase, bool):
        raise invalid_param("erase must be a boolean")
    runtime().admin_users.deactivate(user_id, erase, outbound_caller())
    # There is no identity server to unbind from: nothing failed.
    return json_response({"id_server_unbind_result": "success"})


@bp.post("/v1/reset_password/<user_id>")
@requires_admin
def reset_password(user_id: str):
    body = json_object()
    password = body.get("new_password")
    logout = body.get("logout_devices", True)
    if not isinstance(password, str) or not isinstance(logout, bool):
        raise invalid_param("new_password must be a string and logout_devices a boolean")
    runtime().admin_users.reset_password(user_id, password, logout)
    return json_response({})


@bp.get("/v1/whois/<user_id>")
@requires_admin
def whois(user_id: str):
    return json_response(runtime().admin_users.whois(user_id))


@bp.get("/v1/users/<user_id>/joined_rooms")
@requires_admin
def joined_rooms(user_id: str):
    return json_response(runtime().admin_users.joined_rooms(user_id))
