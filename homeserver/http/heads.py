"""Request heads, parsed without the email package in the common case.

pywsgi parses every request's header lines with `http.client.parse_headers`, which runs the
email package's feed parser: about a sixth of the hub's time for a short request (a burst of
refused remote media requests, a wake of parked syncs). Here the lines are read with the
same limits (`http.client`'s 65,536 bytes a line and 100 lines) and plain `Name: value`
lines are split directly; a head with anything else in it (a folded line, a line without a
colon, a name with white space) is parsed by the email parser exactly as before.
"""

from __future__ import annotations

import email.parser
import http.client
import re
from typing import BinaryIO

from gevent.pywsgi import OldMessage

MAX_LINE = 65536  # http.client._MAXLINE
MAX_HEADERS = 100  # http.client._MAXHEADERS
_END = (b"\r\n", b"\n", b"")
# A name as the email parser takes one: printable ASCII but the colon, no space.
_NAME = re.compile(rb"[\x21-\x39\x3b-\x7e]+")


def read_head(fp: BinaryIO) -> OldMessage:
    """The header lines of one request as pywsgi's message; a line over MAX_LINE gives the
    message pywsgi gives (status "Line too long"), more than MAX_HEADERS lines raise
    http.client.HTTPException, as http.client does."""
    lines = []
    while True:
        line = fp.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            message = OldMessage()
            message.status = "Line too long"
            return message
        lines.append(line)
        if len(lines) > MAX_HEADERS:
            raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")
        if line in _END:
            break
    fields = _plain_fields(lines)
    if fields is None:
        text = b"".join(lines).decode("iso-8859-1")
        return email.parser.Parser(_class=OldMessage).parsestr(text)
    message = OldMessage()
    message._headers = fields
    return message


def _plain_fields(lines: list[bytes]) -> list[tuple[str, str]] | None:
    """(name, value) of each line, as the email parser would store them, or None if any line
    is not a plain `Name: value`."""
    fields = []
    for line in lines[:-1]:
        name, colon, value = line.partition(b":")
        value = value.rstrip(b"\r\n")
        if not colon or not _NAME.fullmatch(name) or b"\r" in value or b"\n" in value:
            return None
        fields.append((name.decode("iso-8859-1"), value.lstrip(b" \t").decode("iso-8859-1")))
    return fields
