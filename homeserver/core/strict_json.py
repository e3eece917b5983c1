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

import json
import math
import re
from typing import Any

# How deep a value that is kept may nest: event content, account data, filters, profiles.
# A PDU is one level more (its content), so a PDU may nest MAX_DEPTH + 1.
MAX_DEPTH = 100
# How deep any body may nest. Room for a transaction's envelope around a PDU too deep, so
# that such a PDU is refused alone, not with its transaction.
MAX_BODY_DEPTH = 2 * MAX_DEPTH

# A \uD800-\uDFFF escape: half of a surrogate pair, valid only with its other half.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class NotJson(ValueError):
    """Not UTF-8 JSON: bad syntax, bad encoding, a lone surrogate, or a non-finite number."""


class TooDeep(ValueError):
    """JSON nested deeper than allowed."""


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
