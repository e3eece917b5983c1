"""How stored media goes out: one builder for every route that serves a file.

Local and remote media, downloads and thumbnails, the client API and federation all answer
through here, so the safety headers are decided once: the content type, an inline or
attachment disposition from the spec's safe list with an RFC 6266 file name, the spec's
sandboxing Content-Security-Policy, Cross-Origin-Resource-Policy, and a long cache lifetime
(media at an mxc:// URI never changes). Files are streamed in chunks, never read whole.
"""

from __future__ import annotations

import os
import re
import uuid
from urllib.parse import quote

from werkzeug.exceptions import RequestedRangeNotSatisfiable
from werkzeug.http import parse_range_header
from werkzeug.wrappers import Response
from werkzeug.wsgi import FileWrapper

from homeserver.core.errors import Codes, MatrixError, not_found
from homeserver.media.files import MediaFile, safe_content_type
from homeserver.media.thumbnails import base_type

# The spec's "Serving inline content" list: types a browser will not run as a document.
INLINE_CONTENT_TYPES = frozenset(
    {
        "text/css",
        "text/plain",
        "text/csv",
        "application/json",
        "application/ld+json",
        "image/jpeg",
        "image/gif",
        "image/png",
        "image/apng",
        "image/webp",
        "image/avif",
        "video/mp4",
        "video/webm",
        "video/ogg",
        "video/quicktime",
        "audio/mp4",
        "audio/webm",
        "audio/aac",
        "audio/mpeg",
        "audio/ogg",
        "audio/wave",
        "audio/wav",
        "audio/x-wav",
        "audio/x-pn-wav",
        "audio/flac",
        "audio/x-flac",
    }
)

# The spec's recommended policy for everything the content repository serves.
CONTENT_SECURITY_POLICY = (
    "sandbox; default-src 'none'; script-src 'none'; "
    "plugin-types application/pdf; style-src 'unsafe-inline'; "
    "object-src 'self';"
)

# Media is immutable, so browsers may keep it for a year. "private": responses to
# authenticated requests must not be served by a shared cache to someone else.
CACHE_CONTROL = "private, max-age=31536000, immutable"

CHUNK_SIZE = 64 * 1024

# RFC 2616 token characters: visible ASCII except separators.
_TOKEN = re.compile(r"[!#$%&'*+\-.0-9A-Z^_`a-z|~]+")


def served_content_type(content_type: str | None) -> str:
    """The type a client download carries: text without a charset is said to be UTF-8."""
    content_type = safe_content_type(content_type)
    if base_type(content_type).startswith("text/") and "charset" not in content_type.lower():
        return f"{content_type}; charset=utf-8"
    return content_type


def content_disposition(content_type: str | None, filename: str | None) -> str:
    """inline for the spec's safe list, attachment otherwise; the name per RFC 6266."""
    disposition = "inline" if base_type(content_type) in INLINE_CONTENT_TYPES else "attachment"
    if not filename:
        return disposition
    if _TOKEN.fullmatch(filename):
        return f"{disposition}; filename={filename}"
    # RFC 5987 ext-value: UTF-8, percent-encoded; quote() leaves only attr-chars bare.
    return f"{disposition}; filename*=utf-8''{quote(filename, safe='')}"


def _open(media: MediaFile):
    try:
        f = open(media.path, "rb")
    except FileNotFoundError:
        raise not_found("Media not found") from None
    return f, os.fstat(f.fileno()).st_size


def _safety_headers() -> dict:
    return {
        "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        "Cross-Origin-Resource-Policy": "cross-origin",
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": CACHE_CONTROL,
    }


def file_response(media: MediaFile, environ: dict) -> Response:
    """The file as a client download: 200, or 206 for a satisfiable Range."""
    f, size = _open(media)
    content_type = served_content_type(media.content_type)
    headers = {
        **_safety_headers(),
        "Content-Type": content_type,
        "Content-Disposition": content_disposition(content_type, media.filename),
        "Content-Length": str(size),
    }
    response = Response(FileWrapper(f, CHUNK_SIZE), headers=headers, direct_passthrough=True)
    try:
        # Werkzeug applies Range (a single range) by seeking the wrapped file: still streamed.
        response.make_conditional(
            _range_environ(environ, size), accept_ranges=True, complete_length=size
        )
    except RequestedRangeNotSatisfiable:
        f.close()
        raise MatrixError(
            416,
            Codes.UNKNOWN,
            "Requested range not satisfiable",
            headers={"Content-Range": f"bytes */{size}"},
        ) from None
    return response


def _range_environ(environ: dict, size: int) -> dict:
    """The request as Werkzeug should see it to apply Range per RFC 9110 §14, which it does
    not on its own: another unit is ignored (it MUST be), as are several ranges (we do not
    send multipart/byteranges, and may ignore Range); a suffix longer than the file is the
    whole file. Anything else, satisfiable or not, is left to Werkzeug."""
    header = environ.get("HTTP_RANGE")
    if header is None:
        return environ
    parsed = parse_range_header(header)
    if parsed is None:
        unit = header.split("=", 1)[0].strip().lower()
        return environ if unit == "bytes" else _without_range(environ)
    if parsed.units != "bytes" or len(parsed.ranges) != 1:
        return _without_range(environ)
    start, end = parsed.ranges[0]
    if end is None and start < -size:
        return {**environ, "HTTP_RANGE": "bytes=0-"}
    return environ


def _without_range(environ: dict) -> dict:
    return {k: v for k, v in environ.items() if k != "HTTP_RANGE"}


def multipart_response(media: MediaFile) -> Response:
    """The file as a federation media response, in the shape Synapse sends and reads:

    \\r\\n--B\\r\\nContent-Type: application/json\\r\\n\\r\\n{}
    \\r\\n--B\\r\\nContent-Type: T\\r\\nContent-Disposition: D\\r\\n\\r\\n<bytes>
    \\r\\n--B--\\r\\n
    """
    f, size = _open(media)
    content_type = safe_content_type(media.content_type)  # as stored: the peer stores it too
    # 128 random bits: the chance that the file contains the boundary is nil.
    boundary = uuid.uuid4().hex
    head = (
        f"\r\n--{boundary}\r\nContent-Type: application/json\r\n\r\n{{}}"
        f"\r\n--{boundary}\r\nContent-Type: {content_type}\r\n"
        f"Content-Disposition: {content_disposition(content_type, media.filename)}"
        "\r\n\r\n"
    ).encode("ascii")
    tail = f"\r\n--{boundary}--\r\n".encode("ascii")

    headers = {
        **_safety_headers(),
        "Content-Type": f"multipart/mixed; boundary={boundary}",
        "Content-Length": str(len(head) + size + len(tail)),
    }
    return Response(_MultipartBody(head, f, tail), headers=headers, direct_passthrough=True)


class _MultipartBody:
    """Streams the parts; `close` (called by the server even if the client left before the
    first byte, when a generator's `finally` would never run) closes the file."""

    def __init__(self, head: bytes, f, tail: bytes):
        self._head, self._file, self._tail = head, f, tail

    def __iter__(self):
        yield self._head
        while chunk := self._file.read(CHUNK_SIZE):
            yield chunk
        yield self._tail

    def close(self) -> None:
        self._file.close()
