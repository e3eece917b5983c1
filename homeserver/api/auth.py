"""Client authentication: access tokens from `Authorization: Bearer` or `?access_token=`."""

from __future__ import annotations

import functools

from flask import g, request

from homeserver.api.context import client_key, runtime
from homeserver.core.errors import Codes, MatrixError, limit_exceeded
from homeserver.core.requester import Requester


def access_token() -> str | None:
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
        raise MatrixError(401, Codes.MISSING_TOKEN, "Invalid Authorization header")
    return request.args.get("access_token") or None


def optional_requester() -> Requester | None:
    if "requester" not in g:
        token = access_token()
        g.requester = None
        if token is not None:
            g.requester = runtime().accounts.authenticate(token)
            if g.requester is None:
                raise MatrixError(
                    401, Codes.UNKNOWN_TOKEN, "Unrecognised access token", soft_logout=False
                )
    return g.requester


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


def enforce_rate_limit(limiter) -> None:
    """Counts this request against `limiter` under the caller's client key."""
    decision = limiter.check(client_key())
    if not decision.allowed:
        raise limit_exceeded(decision.retry_after_ms)
