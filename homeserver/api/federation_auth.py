"""X-Matrix authentication of inbound federation requests.

Every ``/_matrix/federation/*`` route is wrapped in :func:`requires_server_auth` (the spec's
unauthenticated ones, such as ``/version``, are listed in ``UNAUTHENTICATED_ROUTES``; a test
checks that nothing else slips through). The guard verifies the request's X-Matrix signature
with the origin's key valid now, from the keyring, and hands the verified origin to the
handler as :func:`current_origin` (also ``flask.g.origin``).

Refusals follow Synapse: 401 ``M_UNAUTHORIZED`` for a missing header, another destination, an
unknown, expired or wrong key; 400 ``M_UNAUTHORIZED`` for a header that does not parse; 429
``M_LIMIT_EXCEEDED`` with ``Retry-After`` when the key could not be fetched for lack of
budget, so the sender retries and nothing is lost.
"""

from __future__ import annotations

import functools
import re
from urllib.parse import quote

from flask import g, request

from homeserver.api.context import client_key, runtime
from homeserver.core.errors import Codes, MatrixError, limit_exceeded
from homeserver.federation.discovery import split_server_name
from homeserver.federation.errors import InvalidSignature, KeyResolutionRefused
from homeserver.federation.signing import (
    MalformedAuthHeader,
    parse_x_matrix,
    request_object,
)
from homeserver.http.parsing import parse_json, read_body

# Inbound federation bodies (a transaction is at most 50 PDUs and 100 EDUs of 64 KiB each).
FEDERATION_MAX_BODY_BYTES = 10 * 1024 * 1024

# Routes under /_matrix/federation/ that the spec serves without authentication.
UNAUTHENTICATED_ROUTES = frozenset({"/_matrix/federation/v1/version"})


_SEPARATE_HEADERS = re.compile(r",\s*(?=x-matrix\s)", re.IGNORECASE)


def _unauthorized(message: str, status: int = 401) -> MatrixError:
    return MatrixError(status, Codes.UNAUTHORIZED, message)


def request_target() -> str:
    """The request target exactly as sent on the request line: the signed ``uri``."""
    env = request.environ
    raw = env.get("weir.raw_uri") or env.get("REQUEST_URI") or env.get("RAW_URI")
    if raw:
        return raw
    path = quote(env.get("SCRIPT_NAME", "") + env.get("PATH_INFO", ""), safe="/:@!$&'()*+,;=-._~")
    query = env.get("QUERY_STRING", "")
    return f"{path}?{query}" if query else path


def authenticate_request(max_body_bytes: int = FEDERATION_MAX_BODY_BYTES) -> str:
    """Verifies the X-Matrix signature of the current request; returns the origin."""
    rt = runtime()
    # WSGI joins repeated headers with commas: split them again before each "X-Matrix".
    headers = [
        h
        for value in request.headers.getlist("Authorization")
        for h in _SEPARATE_HEADERS.split(value)
        if h[:8].lower() == "x-matrix"
    ]
    if not headers:
        raise _unauthorized("Missing Authorization headers")
    try:
        auths = [parse_x_matrix(h) for h in headers]
    except MalformedAuthHeader:
        raise _unauthorized("Malformed Authorization header", 400) from None
    origin = auths[0].origin
    try:
        split_server_name(origin)
    except ValueError:
        # Not a server name: nothing to fetch keys from (and no budget spent finding out).
        raise _unauthorized("Malformed Authorization header: bad origin", 400) from None
    for auth in auths:
        if auth.origin != origin:
            raise _unauthorized("Authorization headers name different origins")
        if auth.destination is not None and auth.destination != rt.server_name:
            raise _unauthorized(f"Destination mismatch in auth header: {auth.destination!r}")

    content = None
    raw = read_body(max_body_bytes)
    if raw.strip():
        content = parse_json(raw)  # kept for the handler: a large body is parsed once
    signed = request_object(
        request.method, request_target(), origin, auths[0].destination or rt.server_name, content
    )
    signed["signatures"] = {origin: {a.key_id: a.sig for a in auths}}
    try:
        rt.keyring.verify_json(signed, origin, client_key())
    except KeyResolutionRefused as e:
        raise limit_exceeded(e.retry_after_ms, f"Cannot fetch the keys of {origin} now") from None
    except InvalidSignature as e:
        raise _unauthorized(f"Invalid signature for {origin}: {e}") from None
    return origin


def current_origin() -> str:
    """The server name the current federation request was verified to come from."""
    return g.origin


def requires_server_auth(view=None, *, max_body_bytes: int = FEDERATION_MAX_BODY_BYTES):
    """Wraps a federation view: it runs only for a request with a valid X-Matrix signature.
    Use as ``@requires_server_auth`` or ``@requires_server_auth(max_body_bytes=...)``."""
    if view is None:
        return functools.partial(requires_server_auth, max_body_bytes=max_body_bytes)

    @functools.wraps(view)
    def wrapper(*args, **kwargs):
        g.origin = authenticate_request(max_body_bytes)
        request.environ["weir.origin"] = g.origin  # for the access log
        return view(*args, **kwargs)

    # A marker for route audits (tests/federation/test_inbound_auth.py). Set through the
    # function's __dict__: a type checker does not let arbitrary attributes onto a function.
    vars(wrapper)["requires_server_auth"] = True
    return wrapper
