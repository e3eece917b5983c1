"""Registration, login, logout and whoami (client-server API)."""

from __future__ import annotations

from flask import Blueprint, request
from marshmallow import EXCLUDE, Schema, fields, validate

from homeserver.api.auth import (
    appservice_of_request,
    current_requester,
    enforce_rate_limit,
    requires_auth,
)
from homeserver.api.context import runtime
from homeserver.core.errors import (
    Codes,
    MatrixError,
    forbidden,
    invalid_param,
    missing_param,
)
from homeserver.http.parsing import json_object
from homeserver.http.parsing import validate as validate_body
from homeserver.http.responses import json_response

bp = Blueprint("accounts", __name__, url_prefix="/_matrix/client/v3")
v1 = Blueprint("accounts_v1", __name__, url_prefix="/_matrix/client/v1")

DUMMY_FLOWS = [{"stages": ["m.login.dummy"]}]
APPSERVICE_LOGIN = "m.login.application_service"


class RegisterBody(Schema):
    username = fields.String(validate=validate.Length(min=1, max=255))
    password = fields.String(validate=validate.Length(max=512))
    device_id = fields.String(validate=validate.Length(min=1, max=255))
    initial_device_display_name = fields.String(validate=validate.Length(max=512))
    inhibit_login = fields.Boolean(load_default=False)
    auth = fields.Dict()
    type = fields.String()  # m.login.application_service, where older bridges put it


class UserIdentifier(Schema):
    class Meta:
        unknown = EXCLUDE  # other types carry other fields; login refuses the type clearly

    type = fields.String(required=True)
    user = fields.String()


class LoginBody(Schema):
    type = fields.String(required=True)
    identifier = fields.Nested(UserIdentifier)
    user = fields.String()
    password = fields.String(validate=validate.Length(max=512))
    device_id = fields.String(validate=validate.Length(min=1, max=255))
    initial_device_display_name = fields.String(validate=validate.Length(max=512))


def _login_response(result) -> dict:
    body = {"user_id": result.user_id}
    if result.access_token is not None:
        body.update(
            access_token=result.access_token,
            device_id=result.device_id,
            home_server=runtime().server_name,
        )
    return body


@bp.post("/register")
def register():
    rt = runtime()
    kind = request.args.get("kind", "user")
    if kind == "guest":
        raise MatrixError(403, Codes.GUEST_ACCESS_FORBIDDEN, "Guest access is disabled")
    if kind != "user":
        raise invalid_param(f"kind must be 'user' or 'guest', not {kind[:50]!r}")
    appservice = appservice_of_request()
    if appservice is not None:
        return _register_appservice_user(appservice)
    if not rt.config.registration.enabled:
        raise forbidden("Registration has been disabled")
    enforce_rate_limit(rt.registration_rate_limiter)
    body = validate_body(RegisterBody(), json_object(allow_empty=True))

    localpart = body.get("username")
    if localpart is not None:
        localpart = localpart.lower()
        if not rt.accounts.is_available(localpart):
            raise MatrixError(400, Codes.USER_IN_USE, "User ID already taken.")
        rt.appservices.check_user_id(None, rt.accounts.user_id_for(localpart))

    # User-interactive auth: m.login.dummy, after m.login.registration_token when the
    # server requires a token (accounts/registration_tokens.py).
    session = rt.registration_auth.check(body.get("auth") or {})
    if not body.get("password"):
        raise missing_param("Missing parameter: password")
    result = rt.accounts.register(
        localpart,
        body["password"],
        device_id=body.get("device_id"),
        display_name=body.get("initial_device_display_name"),
        inhibit_login=body["inhibit_login"],
    )
    rt.registration_auth.completed(session)
    return json_response(_login_response(result))


def _register_appservice_user(appservice):
    """`m.login.application_service`: a user in the appservice's namespace, without a
    password, whether or not registration is open (Application Service API, "Server admin
    style permissions")."""
    rt = runtime()
    body = validate_body(RegisterBody(), json_object())
    if APPSERVICE_LOGIN not in (body.get("type"), (body.get("auth") or {}).get("type")):
        raise MatrixError(400, Codes.UNKNOWN, f"An as_token registers with {APPSERVICE_LOGIN}")
    if appservice.rate_limited:
        enforce_rate_limit(rt.registration_rate_limiter)
    if not body.get("username"):
        raise missing_param("Missing parameter: username")
    localpart = rt.accounts.validate_localpart(body["username"].lower())
    rt.appservices.check_user_id(appservice, rt.accounts.user_id_for(localpart))
    result = rt.accounts.register(
        localpart,
        None,
        device_id=body.get("device_id"),
        display_name=body.get("initial_device_display_name"),
        inhibit_login=body["inhibit_login"],
    )
    return json_response(_login_response(result))


@bp.get("/register/available")
def register_available():
    username = request.args.get("username")
    if not username:
        raise missing_param("Missing parameter: username")
    rt = runtime()
    if not rt.accounts.is_available(username.lower()):
        raise MatrixError(400, Codes.USER_IN_USE, "User ID already taken.")
    rt.appservices.check_user_id(None, rt.accounts.user_id_for(username.lower()))
    return json_response({"available": True})


@v1.get("/register/m.login.registration_token/validity")
def registration_token_validity():
    rt = runtime()
    if not rt.config.registration.enabled:
        raise forbidden("Registration is not enabled on this homeserver.")
    enforce_rate_limit(rt.registration_rate_limiter)  # the spec asks: tokens can be guessed
    token = request.args.get("token")
    if token is None:
        raise missing_param("Missing parameter: token")
    return json_response({"valid": rt.registration_auth.token_valid(token)})


@bp.get("/login")
def login_flows():
    flows = [{"type": "m.login.password"}]
    if runtime().appservices.registrations:  # offered only where a bridge can use it
        flows.append({"type": APPSERVICE_LOGIN})
    return json_response({"flows": flows})


@bp.post("/login")
def login():
    rt = runtime()
    enforce_rate_limit(rt.login_rate_limiter)
    body = validate_body(LoginBody(), json_object())
    if body["type"] not in ("m.login.password", APPSERVICE_LOGIN):
        raise MatrixError(400, Codes.UNKNOWN, "Unknown login type")
    identifier = body.get("identifier")
    if identifier is not None:
        if identifier["type"] != "m.id.user":
            raise MatrixError(400, Codes.UNKNOWN, "Only m.id.user identifiers are supported")
        user = identifier.get("user")
    else:
        user = body.get("user")
    if not user:
        raise missing_param("Missing parameter: identifier.user")
    if body["type"] == APPSERVICE_LOGIN:
        return _login_appservice_user(user, body)
    if "password" not in body:
        raise missing_param("Missing parameter: password")
    result = rt.accounts.login_with_password(
        user, body["password"], body.get("device_id"), body.get("initial_device_display_name")
    )
    return json_response(_login_response(result))


def _login_appservice_user(user: str, body: dict):
    """A device and token for a user of the appservice's namespace, on its as_token."""
    rt = runtime()
    appservice = appservice_of_request()
    if appservice is None:
        raise MatrixError(401, Codes.MISSING_TOKEN, f"{APPSERVICE_LOGIN} needs an as_token")
    user_id = rt.accounts.user_id_for(rt.accounts.localpart_of(user))
    if not appservice.owns_user(user_id) or not rt.accounts.user_exists(user_id):
        raise forbidden("This user is not one of the application service's")
    result = rt.accounts.login_as(
        user_id, body.get("device_id"), body.get("initial_device_display_name")
    )
    return json_response(_login_response(result))


@bp.post("/logout")
@requires_auth
def logout():
    runtime().accounts.logout(current_requester())
    return json_response({})


@bp.post("/logout/all")
@requires_auth
def logout_all():
    runtime().accounts.logout_all(current_requester())
    return json_response({})


@bp.get("/account/whoami")
@requires_auth
def whoami():
    requester = current_requester()
    body = {"user_id": requester.user_id, "device_id": requester.device_id, "is_guest": False}
    if not requester.device_id:  # an appservice's as_token names no device (MSC3202 aside)
        del body["device_id"]
    return json_response(body)
