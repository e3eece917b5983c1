"""Request parsing: capped JSON bodies, marshmallow validation, query parameters.

Every failure is a Matrix error naming the field: M_NOT_JSON, M_BAD_JSON, M_MISSING_PARAM,
M_INVALID_PARAM or M_TOO_LARGE.
"""

from __future__ import annotations

from typing import Any, Iterator, overload

from flask import request
from marshmallow import EXCLUDE, Schema, ValidationError

from homeserver.core import strict_json
from homeserver.core.concurrency import let_io_run
from homeserver.core.errors import (
    Codes,
    MatrixError,
    bad_json,
    invalid_param,
    missing_param,
)
from homeserver.http.disconnect import ClientDisconnected

DEFAULT_MAX_JSON_BYTES = 1024 * 1024
MAX_DEPTH = strict_json.MAX_DEPTH
MAX_BODY_DEPTH = strict_json.MAX_BODY_DEPTH
_MISSING = "Missing data for required field."


def read_body(max_bytes: int) -> bytes:
    """The request body, refused with 413 past `max_bytes` before it is all read.

    Kept once read, so that a guard that needs the body (federation auth verifies it) and
    the handler after it both see it."""
    data = request.environ.get("weir.body")
    if data is None:
        length = request.content_length
        if length is not None and length > max_bytes:
            raise MatrixError(413, Codes.TOO_LARGE, f"Request body over {max_bytes} bytes")
        data = _read_up_to(max_bytes + 1)
    if len(data) > max_bytes:
        raise MatrixError(413, Codes.TOO_LARGE, f"Request body over {max_bytes} bytes")
    request.environ["weir.body"] = data
    return data


# A large body is read this much at a time, the hub free in between: one read of megabytes
# that are already there decrypts and copies them all without a pause.
READ_CHUNK_BYTES = 256 * 1024


def _read_up_to(limit: int) -> bytes:
    stream, parts, read = request.stream, [], 0
    while read < limit:
        chunk = stream.read(min(READ_CHUNK_BYTES, limit - read))
        if not chunk:
            break
        parts.append(chunk)
        read += len(chunk)
        if len(chunk) == READ_CHUNK_BYTES:  # more may follow: let others run first
            let_io_run()
    return parts[0] if len(parts) == 1 else b"".join(parts)


def is_blank(raw: bytes) -> bool:
    """No body, or only whitespace (without copying a large one, as `strip` would)."""
    return not raw or raw.isspace()


def body_chunks(chunk_size: int = 64 * 1024) -> Iterator[bytes]:
    """The request body as it arrives, chunk by chunk (Content-Length or chunked), so that a
    large upload is never held in memory. The caller caps the total.

    A client that hangs up mid-body ends the request as `ClientDisconnected`: no traceback,
    one access-log line, and the caller's `finally` removes what it wrote."""
    stream = request.stream
    while True:
        try:
            chunk = stream.read(chunk_size)
        except OSError:  # pywsgi: "unexpected end of file while reading request"
            raise ClientDisconnected() from None
        if not chunk:
            return
        yield chunk


def parse_json(raw: bytes) -> Any:
    """`raw`, the body `read_body` returned, parsed as strict JSON (`core/strict_json.py`):
    400 M_NOT_JSON if it is not JSON, 400 M_BAD_JSON past `MAX_BODY_DEPTH`, 413 M_TOO_LARGE
    for a large body made of tiny values."""
    return decode_json(raw).value


def decode_json(raw: bytes, canonical: bool = False) -> strict_json.Decoded:
    """`parse_json`'s decoding, with the canonical JSON too when asked for (what a request
    signature covers). Parsed once per request: a federation body may be megabytes, and the
    guard that verifies its signature and the handler after it both need it. A large body
    is decoded a piece at a time, the hub free between pieces."""
    cached = request.environ.get("weir.json")
    if cached is not None and cached[0] is raw and (cached[1].canonical or not canonical):
        return cached[1]
    try:
        decoded = strict_json.loads_in_pieces(raw, MAX_BODY_DEPTH, let_io_run, canonical=canonical)
    except strict_json.TooDeep:
        raise too_deep(MAX_BODY_DEPTH) from None
    except strict_json.TooManyValues as e:
        raise MatrixError(413, Codes.TOO_LARGE, f"Request body refused: {e}") from None
    except strict_json.NotJson:
        raise MatrixError(400, Codes.NOT_JSON, "Content not JSON.") from None
    request.environ["weir.json"] = (raw, decoded)
    return decoded


def forget_body() -> None:
    """Drops the request's kept body and its parsed JSON: a long-poll parks with its
    request's environ, and needs neither once its handler has read them."""
    request.environ.pop("weir.body", None)
    request.environ.pop("weir.json", None)


def too_deep(limit: int) -> MatrixError:
    return bad_json(f"JSON nested deeper than {limit} levels")


def json_object(
    max_bytes: int = DEFAULT_MAX_JSON_BYTES, allow_empty: bool = False, max_depth: int = MAX_DEPTH
) -> dict:
    """The body as a JSON object. Nested at most `max_depth` deep: a client's body is kept
    as it is (event content, account data), so it gets the depth of a kept value."""
    return object_from(read_body(max_bytes), allow_empty, max_depth)


def object_from(raw: bytes, allow_empty: bool = False, max_depth: int = MAX_DEPTH) -> dict:
    """`json_object` of a body already read."""
    if allow_empty and is_blank(raw):
        return {}
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise MatrixError(400, Codes.NOT_JSON, "Content must be a JSON object.")
    if strict_json.nested_deeper_than(body, max_depth):
        raise too_deep(max_depth)
    return body


def _field_error(messages: Any, prefix: str = "") -> MatrixError:
    if isinstance(messages, dict):
        key = sorted(messages, key=str)[0]
        return _field_error(messages[key], f"{prefix}.{key}" if prefix else str(key))
    if isinstance(messages, list) and messages:
        first = messages[0]
        if isinstance(first, (dict, list)):
            return _field_error(first, prefix)
        if first == _MISSING:
            return missing_param(f"Missing parameter: {prefix}")
        return bad_json(f"{prefix}: {first}")
    return bad_json(f"{prefix}: {messages}")


def validate(schema: Schema, data: dict) -> dict:
    try:
        return schema.load(data, unknown=EXCLUDE)
    except ValidationError as e:
        raise _field_error(e.messages) from None


def validated_json(
    schema: Schema, max_bytes: int = DEFAULT_MAX_JSON_BYTES, allow_empty: bool = False
) -> dict:
    return validate(schema, json_object(max_bytes, allow_empty))


def query_str(name: str) -> str | None:
    """The parameter's first value, None when absent. Werkzeug's `args.get` builds and
    catches an HTTP exception for every absent parameter; hot routes ask for several."""
    values = request.args.getlist(name)
    return values[0] if values else None


@overload
def query_int(
    name: str, default: int, minimum: int | None = None, maximum: int | None = None
) -> int: ...


@overload
def query_int(
    name: str, default: None = None, minimum: int | None = None, maximum: int | None = None
) -> int | None: ...


def query_int(
    name: str, default: int | None = None, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    """The parameter as an integer, capped at `maximum`; `default` when absent or empty
    (so never None when `default` is an int)."""
    raw = query_str(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise invalid_param(f"{name} must be an integer") from None
    if minimum is not None and value < minimum:
        raise invalid_param(f"{name} must be at least {minimum}")
    if maximum is not None and value > maximum:
        value = maximum
    return value


def query_bool(name: str, default: bool) -> bool:
    raw = query_str(name)
    if raw is None:
        return default
    if raw in ("true", "1"):
        return True
    if raw in ("false", "0"):
        return False
    raise invalid_param(f"{name} must be true or false")
