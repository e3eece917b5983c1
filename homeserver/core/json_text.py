"""JSON as Weir sends it: compact, UTF-8 text, one encoder for every answer.

An answer may also be put together from parts already encoded (`EncodedJson`,
`object_text`): one message wakes the syncs of every member of its room, and its event is
encoded once for all of them (homeserver/sync/woken.py), not once for each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any, Callable, Iterable

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


# Members `encode_in_pieces` encodes between two pauses, and how deep it splits containers:
# a /sync answer's event lists sit five levels down (rooms, join, room ID, state, events).
PIECE_MEMBERS = 500
_SPLIT_DEPTH = 6


def encode_in_pieces(value: Any, pause: Callable[[], None]) -> str:
    """`encode(value)`, the same text, with `pause()` between pieces: the json module's
    encoder runs in C without letting go, and a first sync of a 100,000-member room is a
    second of it. Containers down to `_SPLIT_DEPTH` are put together from their members,
    each encoded whole, pausing every `PIECE_MEMBERS` of them."""
    count = [0]

    def piece(item: Any, depth: int) -> str:
        if depth >= _SPLIT_DEPTH or not isinstance(item, (dict, list)):
            count[0] += 1
            if count[0] % PIECE_MEMBERS == 0:
                pause()
            return encode(item)
        if isinstance(item, dict):
            return object_text((k, piece(v, depth + 1)) for k, v in item.items())
        return "[" + ",".join(piece(v, depth + 1) for v in item) + "]"

    return piece(value, 0)
