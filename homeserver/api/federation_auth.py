"""X-Matrix authentication of inbound federation requests.

Every ``/_matrix/federation/*`` route is wrapped in :func:`requires_server_auth` (the spec's
unauthenticated ones, such as ``/version``, are listed in ``UNAUTHENTICATED_ROUTES``; a test
checks that nothing else slips through). The guard verifies the request's X-Matrix signature
with the origin's key valid now, from the keyring, and hands the verified origin to the
handler as :func:`current_origin` (also ``flask.g.origin``).

Refusals follow Synapse: 401 ``M_UNAUTHORIZED`` for a missing header, another destination, an
unknown, expired or wrong key; 400 ``M_UNAUTHORIZED`` for a header that does not parse; 429
``M_LIMIT_EXCEEDED`` with ``Retry-After`` when the key could not be fetched for lack of
budget, so the sender retries and nothing is lost. All of them but a wrong signature are
decided before the body is read.
"""

from __future__ import annotations

import functools
import re
from urllib.parse import quote

from flask import g, request

from homeserver.api.context import client_key, runtime
from homeserver.core.clock import now_ms
from homeserver.core.errors import Codes, MatrixError, limit_exceeded
from homeserver.federation.discovery import split_server_name
from homeserver.federation.errors import InvalidSignature, KeyResolutionRefused
from homeserver.federation.signing import (
    MalformedAuthHeader,
    XMatrixAuth,
    parse_x_matrix,
    request_signing_bytes,
    verify_signature_bytes,
)
from homeserver.http.parsing import decode_json, is_blank, read_body

# Inbound federation bodies: a route's own cap, or this. Only a transaction may be large (at
# most 50 PDUs and 100 EDUs of 64 KiB each: TRANSACTION_MAX_BODY_BYTES).
FEDERATION_MAX_BODY_BYTES = 64 * 1024
TRANSACTION_MAX_BODY_BYTES = 10 * 1024 * 1024

# Routes under /_matrix/federation/ that the spec serves without X-Matrix: the OpenID
# userinfo route is asked by third parties, with the token it checks as its authentication.
UNAUTHENTICATED_ROUTES = frozenset(
    {"/_matrix/federation/v1/version", "/_matrix/federation/v1/openid/userinfo"}
)


_SEPARATE_HEADERS = re.compile(r",\s*(?=x-matrix\s)", re.IGNORECASE)


def _unauthorized(message: str, status: int = 401) -> MatrixError:
    """A refusal. One decided before a large body was read (whatever was announced past a
    route's smallest cap, or a chunked body) ends the connection: the body is then read no
    further than a short linger (http/server.py), never drained whole."""
    headers = None
    chunked = "chunked" in request.headers.get("Transfer-Encoding", "").lower()
    large = (request.content_length or 0) > FEDERATION_MAX_BODY_BYTES
    if "weir.body" not in request.environ and (chunked or large):
        headers = {"Connection": "close"}
    return MatrixError(status, Codes.UNAUTHORIZED, message, headers=headers)


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
    """Verifies the X-Matrix signature of the current request; returns the origin.

    Everything that can be checked before the body is read is checked first: the headers'
    shape, the origin and destination, and a key of the origin's for one of the key IDs,
    from the keyring (under its budget). A request that fails any of these costs no more
    than its head; its body is never read (docs/architecture.md, "What a hostile server
    can and cannot make us do")."""
    rt = runtime()
    origin, auths = _x_matrix_headers(rt.server_name)
    signatures = {a.key_id: a.sig for a in auths if a.key_id.startswith("ed25519:")}
    if not signatures:
        raise _unauthorized(f"No ed25519 signature by {origin}")
    try:
        keys = rt.keyring.resolve(origin, list(signatures), now_ms(), client_key())
    except KeyResolutionRefused as e:
        raise limit_exceeded(e.retry_after_ms, f"Cannot fetch the keys of {origin} now") from None
    if not keys:
        raise _unauthorized(f"No valid key of {origin} among {sorted(signatures)}")
    content = None
    raw = read_body(max_body_bytes)
    if not is_blank(raw):
        # Kept for the handler: a large body is decoded once, a piece at a time.
        content = decode_json(raw, canonical=True).canonical
    destination = auths[0].destination or rt.server_name
    message = request_signing_bytes(request.method, request_target(), origin, destination, content)
    try:
        for key_id, key in keys.items():
            verify_signature_bytes(message, signatures[key_id], key)
    except InvalidSignature as e:
        raise _unauthorized(f"Invalid signature for {origin}: {e}") from None
    return origin


def _x_matrix_headers(server_name: str) -> tuple[str, list[XMatrixAuth]]:
    """The request's origin and its X-Matrix headers, each naming it and us."""
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
        if auth.destination is not None and auth.destination != server_name:
            raise _unauthorized(f"Destination mismatch in auth header: {auth.destination!r}")
    return origin, auths


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
