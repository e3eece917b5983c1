"""The URL map: werkzeug's, with the matches of fixed paths remembered.

werkzeug's matcher (3.1) defines a recursive closure on every call, so every match leaves a
reference cycle that only the cyclic collector frees: about eight objects a request. Those were
the only cycles a request made, and they alone kept the collector running every thousand or
so requests. With thousands of waiting connections, some of those collections walk older
generations, a pause for every request in flight (docs/operations.md, "Sizing").

Most requests are for a path without variables (/sync above all, /versions, /keys/upload,
/publicRooms): such a match depends on the path, the method and the domain alone, so it is
remembered and answered without the matcher. A path with variables (a room ID, an event ID)
is matched by werkzeug each time, as before.

A room version 3 event ID is standard base64 and may hold `/`, sent escaped as `%2F`. The
WSGI server decodes the path before routing would see it, so the escaped `/` would split the
segment: `routed_path` keeps `%2F` (and `%25`, so that the two stay apart) escaped, and the
map's converters decode each variable once it is matched.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any
from urllib.parse import unquote

from gevent.pywsgi import unquote_latin1
from werkzeug.datastructures import ImmutableDict
from werkzeug.routing import Map, PathConverter, Rule, UnicodeConverter
from werkzeug.routing.matcher import StateMachineMatcher

# Fixed-path matches remembered, at most. Each rule has only a few keys (its methods, with and
# without a trailing slash), so this bounds only what an unexpected domain part could add.
FIXED_MATCHES = 1024


class FixedPathMatcher(StateMachineMatcher):
    """werkzeug's matcher, remembering what it found for paths that have no variables."""

    def __init__(self, merge_slashes: bool) -> None:
        super().__init__(merge_slashes)
        self._fixed: dict[tuple[str, str, str, bool], Rule] = {}

    def add(self, rule: Rule) -> None:
        super().add(rule)
        self._fixed.clear()

    def update(self) -> None:
        super().update()
        self._fixed.clear()

    def match(
        self, domain: str, path: str, method: str, websocket: bool
    ) -> tuple[Rule, MutableMapping[str, Any]]:
        key = (domain, path, method, websocket)
        rule = self._fixed.get(key)
        if rule is not None:
            # The view gets the values as its keyword arguments: a dict of its own each time.
            return rule, {}
        rule, values = super().match(domain, path, method, websocket)
        # No arguments: no converter and no defaults, so the values are always {}. A refusal
        # (404, 405, a redirect) is raised and never remembered.
        if not rule.arguments and len(self._fixed) < FIXED_MATCHES:
            self._fixed[key] = rule
        return rule, values


_KEPT_ESCAPED = re.compile(r"(%2[fF]|%25)")


def routed_path(target_path: str) -> str:
    """PATH_INFO for a request path as sent: decoded but for `%2F` and `%25`."""
    parts = _KEPT_ESCAPED.split(target_path)
    return "".join(p if i % 2 else unquote_latin1(p) for i, p in enumerate(parts))


class _Segment(UnicodeConverter):
    def to_python(self, value: str) -> str:
        return unquote(value) if "%" in value else value


class _Path(PathConverter):
    def to_python(self, value: str) -> str:
        return unquote(value) if "%" in value else value


class RouteMap(Map):
    """The app's URL map (api/app.py): werkzeug's, with FixedPathMatcher, and converters
    that decode what `routed_path` left escaped."""

    default_converters = ImmutableDict(
        {**Map.default_converters, "default": _Segment, "string": _Segment, "path": _Path}
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        matcher = FixedPathMatcher(self.merge_slashes)
        for rule in self.iter_rules():  # any the constructor was given
            matcher.add(rule)
        # werkzeug keeps its matcher, and whether it must be updated before the next match,
        # in private attributes (Werkzeug is pinned in requirements.txt);
        # tests/http/test_routing.py fails if they change.
        self._matcher = matcher
        self._remap = True
