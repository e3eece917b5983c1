"""Signed federation requests: the X-Matrix ``Authorization`` header (spec v1.16,
server-server API, "Request Authentication").

The signed object is ``{method, uri, origin, destination[, content]}``, where ``uri`` is the
exact request target (path and query, as sent on the request line) and ``content`` the JSON
body if there is one. The header carries ``origin``, ``destination``, ``key`` and ``sig``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import gevent
from canonicaljson import encode_canonical_json
from nacl.exceptions import BadSignatureError
from signedjson.key import decode_verify_key_bytes
from signedjson.sign import SignatureVerifyException, sign_json, verify_signed_json
from unpaddedbase64 import decode_base64

from homeserver.federation.errors import InvalidSignature

SCHEME = "X-Matrix"
# A signed message longer than this is verified on a native thread.
NATIVE_VERIFY_BYTES = 64 * 1024


@dataclass(frozen=True)
class XMatrixAuth:
    """One parsed X-Matrix header. ``destination`` is None when the sender left it out
    (older servers do; the spec says to accept that)."""

    origin: str
    key_id: str
    sig: str
    destination: str | None


class MalformedAuthHeader(ValueError):
    pass


def request_object(
    method: str, uri: str, origin: str, destination: str, content: object = None
) -> dict:
    """The JSON object whose signature is the request's ``sig``."""
    obj: dict[str, object] = {
        "method": method.upper(),
        "uri": uri,
        "origin": origin,
        "destination": destination,
    }
    if content is not None:
        obj["content"] = content
    return obj


def request_signing_bytes(
    method: str, uri: str, origin: str, destination: str, content: bytes | None
) -> bytes:
    """The canonical JSON of `request_object` when the content's own canonical JSON is
    already made (`content`, or None for no body): what a request's `sig` signs. A large
    body's canonical JSON is made a piece at a time (core/strict_json.py), never in one
    call to the encoder."""
    rest = encode_canonical_json(request_object(method, uri, origin, destination))
    if content is None:
        return rest
    # "content" sorts before every other key of the request object.
    return b'{"content":' + content + b"," + rest[1:]


def verify_signature_bytes(message: bytes, signature: str, verify_key) -> None:
    """Checks one unpadded-base64 ed25519 `signature` of `message`, already canonical
    JSON, as signedjson would of the object. Raises :class:`InvalidSignature`.

    A long message is checked on a native thread: hashing megabytes takes tens of
    milliseconds, and PyNaCl lets go of the GIL meanwhile, so the hub runs on."""
    try:
        signature_bytes = decode_base64(signature)
        if len(message) > NATIVE_VERIFY_BYTES:
            gevent.get_hub().threadpool.apply(verify_key.verify, (message, signature_bytes))
        else:
            verify_key.verify(message, signature_bytes)
    except (BadSignatureError, ValueError) as e:
        raise InvalidSignature(f"signature does not verify: {e}") from None


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sign_request(
    signing_key, origin: str, destination: str, method: str, uri: str, content: object = None
) -> str:
    """The ``Authorization`` header value for one request from ``origin`` to ``destination``."""
    key_id = f"{signing_key.alg}:{signing_key.version}"
    signed = sign_json(
        request_object(method, uri, origin, destination, content), origin, signing_key
    )
    sig = signed["signatures"][origin][key_id]
    return (
        f"{SCHEME} origin={_quote(origin)},destination={_quote(destination)},"
        f"key={_quote(key_id)},sig={_quote(sig)}"
    )


# One parameter: name = token | quoted-string (RFC 9110 auth-param), with the
# separating commas and optional whitespace around them.
_PARAM = re.compile(
    r'[ \t]*([A-Za-z0-9_.-]+)[ \t]*=[ \t]*(?:"((?:[^"\\]|\\.)*)"|([^",\s]*))[ \t]*(?:,|$)'
)


def parse_x_matrix(header: str) -> XMatrixAuth:
    """Parses one X-Matrix header. Parameters may come in any order, quoted or not, with
    backslash escapes in quoted values; names are case-insensitive; unknown ones are ignored.
    Raises :class:`MalformedAuthHeader`.
    """
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != SCHEME.lower():
        raise MalformedAuthHeader("not an X-Matrix header")
    params: dict[str, str] = {}
    pos, rest = 0, rest.strip()
    while pos < len(rest):
        m = _PARAM.match(rest, pos)
        if m is None or m.end() == pos:
            raise MalformedAuthHeader(f"cannot parse parameters at {rest[pos : pos + 20]!r}")
        name, quoted, token = m.groups()
        value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else token
        params.setdefault(name.lower(), value)
        pos = m.end()
    missing = [p for p in ("origin", "key", "sig") if not params.get(p)]
    if missing:
        raise MalformedAuthHeader(f"missing {', '.join(missing)}")
    return XMatrixAuth(
        params["origin"], params["key"], params["sig"], params.get("destination") or None
    )


def decode_verify_key(key_id: str, key_base64: str):
    """A signedjson VerifyKey from a key id (``ed25519:abc``) and its unpadded base64."""
    return decode_verify_key_bytes(key_id, decode_base64(key_base64))


def verify_signature(obj: dict, signer: str, verify_key) -> None:
    """Checks ``obj``'s signature by ``signer`` with ``verify_key`` (whose ``alg:version`` is
    the key id). Raises :class:`InvalidSignature`."""
    try:
        verify_signed_json(obj, signer, verify_key)
    except SignatureVerifyException as e:
        raise InvalidSignature(str(e)) from None
