"""Reading a federation media response (`multipart/mixed`) while it streams in.

The spec's shape is exactly two parts: a JSON part (the media's metadata, `{}` for now), then
either the file's bytes with their Content-Type and Content-Disposition, or a `Location`
header saying where to get them. python-multipart's push parser (the one Synapse uses) is fed
the body chunk by chunk as it arrives, and the file part's bytes are handed on as they are
parsed, so a file is never held in memory. Anything else, including a body that ends before
the closing boundary, is a `MalformedResponse`.

    reader = MultipartMediaReader(origin, response.headers.get("Content-Type"), response.stream())
    part = reader.file_part()        # reads up to the end of the file part's headers
    if part.location: ...            # follow it
    else: store(reader.file_chunks())   # the bytes, then a check that the body ended well
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import unquote

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from homeserver.federation.errors import MalformedResponse

# The metadata part is small JSON; a peer sending more is not sending metadata.
MAX_JSON_PART_BYTES = 64 * 1024

# filename*=charset'language'percent-encoded-value (RFC 5987)
_EXTENDED_FILENAME = re.compile(
    r"(?:^|;)\s*filename\*\s*=\s*([\w!#$%&+^`{}~-]+)'[^']*'([^;\s]*)", re.IGNORECASE
)


@dataclass(frozen=True)
class FilePart:
    """The second part's headers: where the bytes are, and what they are."""

    content_type: str | None
    upload_name: str | None
    location: str | None  # set: the bytes are at this URL, not in the body


def upload_name_from(content_disposition: str | None) -> str | None:
    """The file name in a Content-Disposition header, or None: `filename*=` (RFC 5987,
    percent-encoded in a named charset) when it decodes, else `filename=`. It is stored as
    given and encoded again whenever it is served."""
    if not content_disposition:
        return None
    extended = _EXTENDED_FILENAME.search(content_disposition)
    if extended:
        charset, value = extended.groups()
        try:
            return unquote(value, encoding=charset, errors="strict") or None
        except (LookupError, UnicodeDecodeError):
            pass  # an unknown charset or bytes that are not in it: try the plain name
    _, params = parse_options_header(content_disposition)
    name = params.get(b"filename")
    return name.decode("latin-1") if name else None


class MultipartMediaReader:
    def __init__(self, destination: str, content_type: str | None, chunks: Iterator[bytes]):
        self.destination = destination
        mime, params = parse_options_header(content_type)
        boundary = params.get(b"boundary")
        if mime != b"multipart/mixed" or not boundary:
            raise self._malformed(f"not multipart/mixed with a boundary: {content_type!r}")
        self._chunks = iter(chunks)
        self._parts = 0
        self._headers: dict[str, str] = {}
        self._field = b""
        self._value = b""
        self._json = b""
        self._file_headers: dict[str, str] | None = None
        self._file_data: list[bytes] = []
        self._ended = False
        self._error: str | None = None
        try:
            self._parser = MultipartParser(
                boundary,
                {
                    "on_part_begin": self._on_part_begin,
                    "on_header_field": self._on_header_field,
                    "on_header_value": self._on_header_value,
                    "on_header_end": self._on_header_end,
                    "on_headers_finished": self._on_headers_finished,
                    "on_part_data": self._on_part_data,
                    "on_part_end": self._on_part_end,
                    "on_end": self._on_end,
                },
            )
        except ValueError as e:  # a boundary python-multipart refuses (too long)
            raise self._malformed(str(e)) from None

    def file_part(self) -> FilePart:
        """Reads until the file part's headers are complete, the JSON part checked on the way."""
        while self._file_headers is None:
            chunk = next(self._chunks, None)
            if chunk is None:
                raise self._malformed("body ended before the file part")
            self._write(chunk)
        headers = self._file_headers
        return FilePart(
            headers.get("content-type"),
            upload_name_from(headers.get("content-disposition")),
            headers.get("location"),
        )

    def file_chunks(self) -> Iterator[bytes]:
        """The file part's bytes as they arrive. Ends only once the closing boundary was read:
        a body cut short raises instead, so a partial file is never taken for the whole."""
        if self._file_headers is None:
            self.file_part()
        while True:
            if self._file_data:
                data, self._file_data = b"".join(self._file_data), []
                yield data
            if self._ended:
                return
            chunk = next(self._chunks, None)
            if chunk is None:
                self._parser.finalize()
                raise self._malformed("body ended before the closing boundary")
            self._write(chunk)

    # --- the parser's callbacks: they record, and `_write` raises what they found --------

    def _write(self, chunk: bytes) -> None:
        try:
            self._parser.write(chunk)
        except MultipartParseError as e:
            raise self._malformed(f"bad multipart body: {e}") from None
        if self._error is not None:
            raise self._malformed(self._error)

    def _fail(self, error: str) -> None:
        if self._error is None:
            self._error = error

    def _on_part_begin(self) -> None:
        self._parts += 1
        self._headers = {}
        if self._parts > 2:
            self._fail("more than two parts")

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _on_header_end(self) -> None:
        name = self._field.decode("latin-1").strip().lower()
        self._headers[name] = self._value.decode("latin-1").strip()
        self._field = self._value = b""

    def _on_headers_finished(self) -> None:
        if self._parts == 1:
            mime, _ = parse_options_header(self._headers.get("content-type"))
            if mime != b"application/json":
                self._fail("the first part is not application/json")
        elif self._parts == 2:
            self._file_headers = self._headers

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._parts == 1:
            self._json += data[start:end]
            if len(self._json) > MAX_JSON_PART_BYTES:
                self._fail("metadata part too large")
        elif (
            self._parts == 2
            and self._file_headers is not None
            and "location" not in self._file_headers
        ):
            self._file_data.append(data[start:end])

    def _on_part_end(self) -> None:
        if self._parts != 1:
            return
        try:
            metadata = json.loads(self._json)
        except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
            metadata = None
        if not isinstance(metadata, dict):
            self._fail("the metadata part is not a JSON object")

    def _on_end(self) -> None:
        if self._parts != 2:
            self._fail(f"{self._parts} parts instead of two")
        self._ended = True

    def _malformed(self, why: str) -> MalformedResponse:
        return MalformedResponse(self.destination, f"media response: {why}")
