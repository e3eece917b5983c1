"""The one strict JSON decoder for bytes from outside: request bodies on both listeners,
inbound PDUs, and the answers of other servers.

Matrix JSON is UTF-8 (spec appendices, "Canonical JSON"). Python's own `json.loads` of bytes
guesses UTF-16 or UTF-32 and lets a raw UTF-8-encoded surrogate (ED A0 80) through; a string
holding a lone surrogate has no UTF-8 form, so a value kept with one could never be served
again. NaN, Infinity and numbers past a double are no JSON numbers either. Nesting is bounded
well below the interpreter's recursion limit, so that whatever is kept can always be encoded
again, however deep the stack that encodes it.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from json.decoder import scanstring  # type: ignore[attr-defined]  # the C scanner's, unlisted
from typing import Any, Callable, Collection, Iterable

from canonicaljson import encode_canonical_json

# How deep a value that is kept may nest: event content, account data, filters, profiles.
# A PDU is one level more (its content), so a PDU may nest MAX_DEPTH + 1.
MAX_DEPTH = 100
# How deep any body may nest. Room for a transaction's envelope around a PDU too deep, so
# that such a PDU is refused alone, not with its transaction.
MAX_BODY_DEPTH = 2 * MAX_DEPTH

# A \uD800-\uDFFF escape: half of a surrogate pair, valid only with its other half.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_TEXT = re.compile(r"\\u[dD][89a-fA-F]")
# A body is decoded in pieces of about this size, the hub free between them (loads_in_pieces).
PIECE_BYTES = 64 * 1024
# A container longer than PIECE_BYTES holds at most one member per this many bytes: what
# federation sends in large containers (events, event IDs, device keys, EDUs) is far
# larger, and a document of tiny values costs far more to build than its size suggests.
MIN_MEMBER_BYTES = 16
# Bracket-level steps of the structure walk between two pauses.
_STEPS_PER_PAUSE = 2_000


class NotJson(ValueError):
    """Not UTF-8 JSON: bad syntax, bad encoding, a lone surrogate, or a non-finite number."""


class TooDeep(ValueError):
    """JSON nested deeper than allowed."""


class TooManyValues(ValueError):
    """A large JSON document made of tiny values (`loads_in_pieces`)."""


def loads(raw: bytes, max_depth: int = MAX_BODY_DEPTH) -> Any:
    """`raw` parsed as strict UTF-8 JSON; `NotJson` or `TooDeep` if it may not be."""
    try:
        # Strict UTF-8: refuses encoded surrogates, and a UTF-16 or UTF-32 body.
        text = raw.decode("utf-8")
        value = json.loads(text, parse_constant=_not_a_json_number, parse_float=_finite_float)
        if _SURROGATE_ESCAPE.search(raw):
            # Pairs encode fine; a lone half does not.
            json.dumps(value, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise TooDeep("nested deeper than the parser goes") from None
    except ValueError as e:  # UnicodeDecodeError and UnicodeEncodeError included
        raise NotJson(str(e)) from None
    if nested_deeper_than(value, max_depth):
        raise TooDeep(f"nested deeper than {max_depth} levels")
    return value


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` nests more than `limit` objects or arrays deep. Walks without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, (dict, list)):
            continue
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _not_a_json_number(name: str):
    # Python's parser takes NaN and (-)Infinity; JSON has no such numbers, and a value kept
    # with one would be served back as JSON no strict client can parse.
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: the parser would read it as Infinity
        raise ValueError(f"{text} is out of range")
    return value


# --- large documents, a piece at a time -------------------------------------------------


class Decoded:
    """What `loads_in_pieces` gives: the value, and when asked for, its canonical JSON
    (`canonical`, bytes: what a signature over the value covers)."""

    __slots__ = ("value", "canonical")

    def __init__(self, value: Any, canonical: bytes | None):
        self.value = value
        self.canonical = canonical


def loads_in_pieces(
    raw: bytes,
    max_depth: int,
    pause: Callable[[], None],
    *,
    canonical: bool = False,
    piece_bytes: int = PIECE_BYTES,
) -> Decoded:
    """`raw` decoded by exactly `loads`' rules, `pause()` called between pieces of about
    `piece_bytes`: a large body never holds the gevent hub for longer than one piece takes.

    A walk over the document's brackets (strings skipped in C by a regular expression)
    finds the containers longer than a piece, and refuses a document nested too deep
    before anything of it is built. Those containers are then taken apart member by
    member; every other value is decoded whole by the json module's C scanner, with the
    strict rules' hooks. `canonical`: also the canonical JSON of the value, made of each
    piece's, so that verifying a signature over a large body pauses too."""
    if len(raw) <= piece_bytes:
        value = loads(raw, max_depth)
        return Decoded(value, encode_canonical_json(value) if canonical else None)
    text = _decoded(raw, piece_bytes * 4, pause)
    walk = _walk(text, piece_bytes, max_depth, pause)
    pieces = _Pieces(text, walk, max_depth, pause, piece_bytes, canonical)
    try:
        value, canon, end = pieces.value(_skip_space(text, 0), 1)
        if _skip_space(text, end) != len(text):
            raise NotJson("extra data after the JSON value")
    except IndexError:
        raise NotJson("the JSON text ends too early") from None
    return Decoded(value, canon if canonical else None)


# Up to the next bracket outside a string, or to a string that does not end in the window.
_TO_BRACKET = re.compile(r'(?:[^"\[\]{}]++|"(?:[^"\\]++|\\.)*+")*+')
# Inside a string: everything up to its closing quote (or the end of the window).
_STRING_RUN = re.compile(r'(?:[^"\\]++|\\.)*+', re.DOTALL)
_SPACE = re.compile(r"[ \t\n\r]*")
# A whole string; a scalar (number, true, false, null) up to what may follow it.
_STRING = re.compile(f'"{_STRING_RUN.pattern}"', re.DOTALL)
_SCALAR = re.compile(r"[^,\]}\s]*")
_CONTROL = re.compile(r"[\x00-\x1f]")
# One value at a given index, by the json module's C scanner with the strict rules' hooks.
_SCANNER = json.JSONDecoder(
    parse_constant=lambda name: _not_a_json_number(name),
    parse_float=lambda text: _finite_float(text),
).scan_once  # type: ignore[attr-defined]


def _decoded(raw: bytes, chunk_bytes: int, pause: Callable[[], None]) -> str:
    """`raw` as strict UTF-8 (no encoded surrogates), decoded a chunk at a time."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    parts = []
    try:
        for at in range(0, len(raw), chunk_bytes):
            parts.append(decoder.decode(raw[at : at + chunk_bytes]))
            pause()
        parts.append(decoder.decode(b"", final=True))
    except UnicodeDecodeError as e:
        raise NotJson(str(e)) from None
    return "".join(parts)


def _skip_space(text: str, i: int) -> int:
    return _SPACE.match(text, i).end()  # type: ignore[union-attr]


def _walk(text: str, piece_bytes: int, max_depth: int, pause: Callable[[], None]) -> _Walk:
    """The start of every container and string longer than `piece_bytes`; `TooDeep` at once
    for a document nested deeper than `max_depth`, `TooManyValues` as soon as a container
    that is already longer than `PIECE_BYTES` holds more than one container per
    `MIN_MEMBER_BYTES`, `NotJson` for unbalanced brackets or an unterminated string.

    One regular expression takes the walk from bracket to bracket, over every string and
    scalar between them, in C; a string the window cuts is gone through apart. Each match
    runs over one piece of the text at most, with a pause after each piece."""
    walk = _Walk(piece_bytes, max_depth)
    i, paused_at, steps, size, string_start = 0, 0, 0, len(text), 0
    skip = _TO_BRACKET.match
    in_string = False
    while i < size:
        if i - paused_at >= piece_bytes or steps >= _STEPS_PER_PAUSE:
            pause()
            paused_at, steps = i, 0
        steps += 1
        window = min(size, i + piece_bytes)
        if in_string:
            i, in_string = _through_string(text, i, window)
            if not in_string and i - string_start > piece_bytes:
                walk.long_strings[string_start] = i
            continue
        i = skip(text, i, window).end()  # type: ignore[union-attr]
        if i == window:
            continue
        walk.member(i)
        mark = text[i]
        i += 1
        if mark == '"':
            in_string, string_start = True, i - 1
        elif mark in "[{":
            walk.open(i - 1)
        else:
            walk.close(i - 1)
    if in_string:
        raise NotJson("unterminated string")
    if walk.opened:
        raise NotJson("unbalanced brackets")
    return walk


def _through_string(text: str, i: int, window: int) -> tuple[int, bool]:
    """From `i` inside a string: past its closing quote (and False), or as far as the
    window goes (and True: still inside)."""
    end = _STRING_RUN.match(text, i, window).end()  # type: ignore[union-attr]
    if end < len(text) and text[end] == '"':
        return end + 1, False
    if end == window:
        return end, True
    if end + 1 < len(text):  # a backslash the window cut from what it escapes
        return end + 2, True
    raise NotJson("unterminated string")


class _Walk:
    """The open containers of the structure walk, and how many members each has so far."""

    def __init__(self, piece_bytes: int, max_depth: int):
        self.piece_bytes = piece_bytes
        self.max_depth = max_depth
        self.big: set[int] = set()  # where each container longer than a piece starts
        self.long_strings: dict[int, int] = {}  # where each such string starts, and ends
        self.opened: list[int] = []  # where each open container starts
        self.members: list[int] = []  # containers and strings directly in each, names too

    def member(self, i: int) -> None:
        """A string or a bracket at `i`, inside the innermost open container."""
        if not self.members:
            return
        self.members[-1] += 1
        length = i - self.opened[-1]
        if length > PIECE_BYTES and self.members[-1] * MIN_MEMBER_BYTES > length:
            raise TooManyValues(f"more than one value per {MIN_MEMBER_BYTES} bytes")

    def open(self, i: int) -> None:
        self.opened.append(i)
        self.members.append(0)
        if len(self.opened) > self.max_depth:
            raise TooDeep(f"nested deeper than {self.max_depth} levels")

    def close(self, i: int) -> None:
        if not self.opened:
            raise NotJson("unbalanced brackets")
        self.members.pop()
        start = self.opened.pop()
        if i - start >= self.piece_bytes:
            self.big.add(start)


class _Pieces:
    """Decodes a document whose large containers (`big`) are taken apart."""

    def __init__(self, text, walk, max_depth, pause, piece_bytes, canonical):
        self.text = text
        self.big = walk.big
        self.long_strings = walk.long_strings
        self.max_depth = max_depth
        self.pause = pause
        self.piece_bytes = piece_bytes
        self.canonical = canonical
        self.since_pause = 0
        self.values_since_pause = 0

    def value(self, i: int, depth: int) -> tuple[Any, bytes, int]:
        """The value at `i`, its canonical JSON (b"" unless asked for) and where it ends."""
        if i in self.big:
            return self._object(i, depth) if self.text[i] == "{" else self._array(i, depth)
        if i in self.long_strings:
            return self._long_string(i, self.long_strings[i])
        try:
            value, end = _SCANNER(self.text, i)
        except StopIteration:
            raise NotJson(f"no JSON value at {i}") from None
        except RecursionError:
            raise TooDeep("nested deeper than the parser goes") from None
        except ValueError as e:  # JSONDecodeError, a strict hook, an int past its digits
            raise NotJson(str(e)) from None
        if nested_deeper_than(value, self.max_depth - depth + 1):
            raise TooDeep(f"nested deeper than {self.max_depth} levels")
        if _SURROGATE_ESCAPE_TEXT.search(self.text, i, end):
            _check_encodes(value)
        self.since_pause += end - i
        self.values_since_pause += 1
        if self.since_pause >= self.piece_bytes or self.values_since_pause >= _STEPS_PER_PAUSE:
            self.since_pause = self.values_since_pause = 0
            self.pause()
        return value, encode_canonical_json(value) if self.canonical else b"", end

    def _long_string(self, i: int, end: int) -> tuple[str, bytes, int]:
        """A string longer than a piece: one with no escape is its own text, taken as it is
        (a control character is all the strict rules can refuse in it); its canonical JSON
        is made a piece at a time."""
        inner = self.text[i + 1 : end - 1]
        if "\\" in inner:
            try:
                value, _ = scanstring(self.text, i + 1, True)
            except ValueError as e:
                raise NotJson(str(e)) from None
            _check_encodes(value)
        elif _CONTROL.search(inner):
            raise NotJson("a control character in a string")
        else:
            value = inner
        self.pause()
        if not self.canonical:
            return value, b"", end
        parts = [b'"']
        for at in range(0, len(value), self.piece_bytes):
            parts.append(
                json.dumps(value[at : at + self.piece_bytes], ensure_ascii=False)[1:-1].encode()
            )
            self.pause()
        parts.append(b'"')
        return value, b"".join(parts), end

    def _array(self, i: int, depth: int) -> tuple[list, bytes, int]:
        text = self.text
        items: list = []
        parts: list[bytes] = []
        j = _skip_space(text, i + 1)
        if text[j] == "]":
            return items, b"[]", j + 1
        while True:
            item, canon, j = self.value(j, depth + 1)
            items.append(item)
            parts.append(canon)
            _check_density(len(items), j - i)
            j = _skip_space(text, j)
            if text[j] == "]":
                return items, b"[" + b",".join(parts) + b"]" if self.canonical else b"", j + 1
            if text[j] != ",":
                raise NotJson(f"expected , or ] at {j}")
            j = _skip_space(text, j + 1)

    def _object(self, i: int, depth: int) -> tuple[dict, bytes, int]:
        text = self.text
        members: dict[str, Any] = {}
        parts: dict[str, bytes] = {}
        j = _skip_space(text, i + 1)
        if text[j] == "}":
            return members, b"{}", j + 1
        while True:
            if text[j] != '"':
                raise NotJson(f"expected a member name at {j}")
            try:
                key, j = scanstring(text, j + 1, True)
            except ValueError as e:
                raise NotJson(str(e)) from None
            _check_encodes(key)
            j = _skip_space(text, j)
            if text[j] != ":":
                raise NotJson(f"expected : at {j}")
            member, canon, j = self.value(_skip_space(text, j + 1), depth + 1)
            members[key] = member  # a repeated name: the last wins, as in json.loads
            parts[key] = canon
            _check_density(len(members), j - i)
            j = _skip_space(text, j)
            if text[j] == "}":
                return members, self._object_text(parts), j + 1
            if text[j] != ",":
                raise NotJson(f"expected , or }} at {j}")
            j = _skip_space(text, j + 1)

    def _object_text(self, parts: dict[str, bytes]) -> bytes:
        if not self.canonical:
            return b""
        return (
            b"{"
            + b",".join(encode_canonical_json(k) + b":" + parts[k] for k in sorted(parts))
            + b"}"
        )


def _check_density(count: int, length: int) -> None:
    """A large container's members, numbers included, average `MIN_MEMBER_BYTES` or more."""
    if count % 1024 == 0 and length > PIECE_BYTES and count * MIN_MEMBER_BYTES > length:
        raise TooManyValues(f"more than one value per {MIN_MEMBER_BYTES} bytes")


def _check_encodes(value: Any) -> None:
    """`NotJson` for a value holding a lone surrogate, which has no UTF-8 form."""
    try:
        (value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)).encode()
    except UnicodeEncodeError as e:
        raise NotJson(str(e)) from None


# --- an object read as it streams ------------------------------------------------------


def loads_streamed_object(
    chunks: Iterable[bytes],
    *,
    arrays: Collection[str],
    max_items: int,
    item_max_chars: int,
    value_max_chars: int,
    pause: Callable[[], None],
) -> dict[str, Any]:
    """A JSON object decoded by `loads`' rules as its bytes arrive, never held whole: the
    members named in `arrays` whose values are arrays are decoded an item at a time, each at
    most `item_max_chars` long and at most `max_items` of them in all (`TooManyValues`);
    any other member's value is at most `value_max_chars` long. Only the current chunk and
    the value it cuts are held as text. `pause()` is called after each chunk."""
    reader = _StreamReader(chunks, pause)
    found: dict[str, Any] = {}
    items = 0
    reader.take("{")
    first = True
    while reader.peek() != "}":
        if not first:
            reader.take(",")
        first = False
        key = reader.value(value_max_chars, 0)
        if not isinstance(key, str):
            raise NotJson("expected a member name")
        reader.take(":")
        if key in arrays and reader.peek() == "[":
            found[key] = reader.items(item_max_chars, max_items - items)
            items += len(found[key])
        else:  # a repeated name: the last wins, as in json.loads
            found[key] = reader.value(value_max_chars, MAX_BODY_DEPTH - 1)
    reader.take("}")
    if reader.peek(at_end=True):
        raise NotJson("extra data after the JSON value")
    return found


class _StreamReader:
    """The text of a byte stream as far as it has come (`text`, from the next thing to
    read, `at`); what was read before `at` is dropped whenever more is fetched."""

    def __init__(self, chunks: Iterable[bytes], pause: Callable[[], None]):
        self._chunks = iter(chunks)
        self._pause = pause
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self.text = ""
        self.at = 0
        self._ended = False

    def more(self) -> bool:
        """Fetches the next chunk; False at the end of the stream."""
        if self._ended:
            return False
        try:
            raw = next(self._chunks, None)
            piece = self._decoder.decode(raw if raw is not None else b"", final=raw is None)
        except UnicodeDecodeError as e:  # also a character the stream ends inside
            raise NotJson(str(e)) from None
        self._ended = raw is None
        self.text = self.text[self.at :] + piece
        self.at = 0
        self._pause()
        return True

    def peek(self, at_end: bool = False) -> str:
        """The next character past white space; "" at the end only if `at_end`."""
        while True:
            self.at = _skip_space(self.text, self.at)
            if self.at < len(self.text):
                return self.text[self.at]
            if not self.more() and self.at >= len(self.text):
                if at_end:
                    return ""
                raise NotJson("the JSON text ends too early")

    def take(self, mark: str) -> None:
        if self.peek() != mark:
            raise NotJson(f"expected {mark}")
        self.at += 1

    def items(self, max_chars: int, max_items: int) -> list:
        """The array that starts next, decoded an item at a time."""
        self.take("[")
        values: list = []
        if self.peek() == "]":
            self.at += 1
            return values
        while True:
            values.append(self.value(max_chars, MAX_BODY_DEPTH - 2))
            if len(values) > max_items:
                raise TooManyValues("too many items")
            if self.peek() == "]":
                self.at += 1
                return values
            self.take(",")

    def value(self, max_chars: int, max_depth: int) -> Any:
        """The value that starts next, at most `max_chars` long and nested at most
        `max_depth` deep; fetched until it is whole, then decoded by the C scanner."""
        self.peek()
        walked, depth = 0, 0  # how far past `at` the walk has come, and how deep it is there
        while True:
            end, walked, depth = _value_end(self.text, self.at, walked, depth, max_depth)
            if end is not None:
                break
            if len(self.text) - self.at > max_chars:
                raise TooManyValues(f"a value longer than {max_chars} characters")
            if not self.more():
                raise NotJson("the JSON text ends too early")
        if end - self.at > max_chars:
            raise TooManyValues(f"a value longer than {max_chars} characters")
        try:
            value, stop = _SCANNER(self.text, self.at)
        except StopIteration:
            raise NotJson("no JSON value") from None
        except ValueError as e:  # JSONDecodeError, a strict hook
            raise NotJson(str(e)) from None
        if stop != end:
            raise NotJson("malformed value")
        if _SURROGATE_ESCAPE_TEXT.search(self.text, self.at, end):
            _check_encodes(value)
        self.at = end
        return value


def _value_end(
    text: str, start: int, walked: int, depth: int, max_depth: int
) -> tuple[int | None, int, int]:
    """Where the value at `start` ends, if the text holds all of it: (end, _, _); else
    (None, how far past `start` to walk on from once more text has come, the depth there).
    A container is walked bracket to bracket, strings skipped in C; a string the text ends
    inside is walked again from its opening quote."""
    if text[start] not in "[{":
        m = _STRING.match(text, start) if text[start] == '"' else _SCALAR.match(text, start)
        if m is None or m.end() == len(text):  # unterminated, or maybe cut short
            return None, 0, 0
        return m.end(), 0, 0
    i = start + walked
    while True:
        i = _TO_BRACKET.match(text, i).end()  # type: ignore[union-attr]
        if i >= len(text) or text[i] == '"':  # the text ends, maybe inside a string
            return None, i - start, depth
        depth += 1 if text[i] in "[{" else -1
        i += 1
        if depth > max_depth:
            raise TooDeep(f"nested deeper than {MAX_BODY_DEPTH} levels")
        if depth == 0:
            return i, 0, 0
