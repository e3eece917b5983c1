"""JSON as Weir sends it: compact, UTF-8 text, one encoder for every answer.

An answer may also be put together from parts already encoded (`EncodedJson`,
`object_text`): one message wakes the syncs of every member of its room, and its event is
encoded once for all of them (homeserver/sync/woken.py), not once for each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any, Iterable

# json.dumps with any option builds a new encoder per call. No circular-reference check: an
# answer is built from decoded JSON and fresh dicts, never a cycle, and the check's
# bookkeeping for every dict and list was a quarter of the encoding.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)


def encode(value: Any) -> str:
    return _ENCODER.encode(value)


def utf8(text: str) -> bytes:
    """The text's UTF-8 bytes. A lone surrogate, kept before the strict decoder
    (core/strict_json.py) refused them, has no UTF-8 form; it is sent as its JSON escape
    (it can only be inside a string), so the answer is still JSON, and never a 500 forever."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace")


@dataclass(frozen=True, slots=True)
class EncodedJson:
    """An answer already encoded."""

    text: str


def object_text(members: Iterable[tuple[str, str]]) -> str:
    """A JSON object from its members: (name, the value already encoded)."""
    # A name is a string: encoded as the encoder encodes one (ensure_ascii=False).
    return "{" + ",".join(f"{encode_basestring(name)}:{value}" for name, value in members) + "}"
