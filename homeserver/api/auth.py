"""Client authentication: access tokens from `Authorization: Bearer` or `?access_token=`."""

from __future__ import annotations

import functools
import logging

from flask import request

from homeserver.api.context import client_key, runtime
from homeserver.core.errors import Codes, MatrixError, forbidden, limit_exceeded
from homeserver.core.requester import Requester

admin_log = logging.getLogger("homeserver.admin")

# The request's Requester, or None without a token, once authenticated: kept in the environ
# rather than Flask's `g`, each of whose reads and writes goes through a context proxy.
_REQUESTER = "weir.requester"
_UNSET = object()


def access_token(environ: dict) -> str | None:
    """The token from the header or the query, never both: as Synapse, a request that
    carries two (which would one be?) is refused."""
    # Read from the environ, not through Headers (which scans every header): the WSGI server
    # joins a repeated header's values with commas, and no token contains one.
    header = environ.get("HTTP_AUTHORIZATION", "")
    in_query = request.args.getlist("access_token") if environ.get("QUERY_STRING") else []
    if "," in header:
        raise MatrixError(401, Codes.MISSING_TOKEN, "Too many Authorization headers")
    if len(in_query) > 1:
        raise MatrixError(401, Codes.MISSING_TOKEN, "Too many access_token query parameters")
    if header and in_query:
        raise MatrixError(
            401,
            Codes.MISSING_TOKEN,
            "Mixing Authorization headers and access_token query parameters",
        )
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
        raise MatrixError(401, Codes.MISSING_TOKEN, "Invalid Authorization header")
    return in_query[0] if in_query and in_query[0] else None


def optional_requester() -> Requester | None:
    environ = request.environ
    requester = environ.get(_REQUESTER, _UNSET)
    if requester is not _UNSET:
        return requester
    token = access_token(environ)
    requester = None
    if token is not None:
        rt = runtime()
        registration = rt.appservices.for_token(token) if rt.appservices.registrations else None
        if registration is not None:
            requester = _appservice_requester(registration)
        else:
            requester = rt.accounts.authenticate(token)
        if requester is None:
            raise MatrixError(
                401, Codes.UNKNOWN_TOKEN, "Unrecognised access token", soft_logout=False
            )
    environ[_REQUESTER] = requester
    return requester


def _appservice_requester(registration) -> Requester:
    """An as_token acts as the appservice's sender, or as `user_id` in its namespace
    (Application Service API, "Identity assertion"), on the device MSC3202 names."""
    args = request.args
    device_id = args.get("org.matrix.msc3202.device_id") or args.get("device_id")
    return runtime().appservices.requester(registration, args.get("user_id"), device_id)


def appservice_of_request():
    """The appservice whose as_token the request carries, or None (registration and login
    with `m.login.application_service`, before any user exists to act as)."""
    token = access_token(request.environ)
    return None if token is None else runtime().appservices.for_token(token)


def current_requester() -> Requester:
    requester = optional_requester()
    if requester is None:
        raise MatrixError(401, Codes.MISSING_TOKEN, "Missing access token")
    return requester


def requires_auth(view):
    """Refuses the request with 401 unless it carries a valid access token."""

    @functools.wraps(view)
    def wrapper(*args, **kwargs):
        current_requester()
        return view(*args, **kwargs)

    return wrapper


def requires_admin(view):
    """Refuses the request unless a server admin makes it (401 without a token, 403 for
    anyone else), and logs every admin request with the admin's user ID."""

    @functools.wraps(view)
    def wrapper(*args, **kwargs):
        requester = current_requester()
        if not requester.is_admin:
            raise forbidden("You are not a server admin")
        admin_log.info("admin %s: %s %s", requester.user_id, request.method, request.path)
        return view(*args, **kwargs)

    return wrapper


def enforce_rate_limit(limiter, key: str | None = None) -> None:
    """Counts this request against `limiter` under `key`, by default the caller's client
    key."""
    requester = request.environ.get(_REQUESTER)
    if requester is not None and not runtime().appservices.rate_limited(requester):
        return  # an appservice registered with `rate_limited: false`
    decision = limiter.check(client_key() if key is None else key)
    if not decision.allowed:
        raise limit_exceeded(decision.retry_after_ms)


def require_password_auth(body: dict) -> None:
    """User-interactive auth with the requester's password (accounts/uia.py): returns once
    `body["auth"]` proves it, else 401 with the flows. An attempt counts as a login."""
    rt = runtime()
    if isinstance(body.get("auth"), dict) and "type" in body["auth"]:
        enforce_rate_limit(rt.login_rate_limiter)  # a password guess, counted like a login
    rt.uia.require_password(current_requester(), body.get("auth"))
