"""The URL map (homeserver/http/routing.py): a fixed path's match is remembered, so serving it
leaves nothing for the cyclic collector; everything else matches as werkzeug does."""

from __future__ import annotations

import gc
import socket

import pytest
from werkzeug.exceptions import MethodNotAllowed, NotFound
from werkzeug.routing import Rule

from homeserver.api.app import create_flask_app
from homeserver.config import parse_config
from homeserver.http.places import WorkPool
from homeserver.http.routing import FixedPathMatcher, RouteMap, routed_path
from homeserver.http.server import WeirWSGIServer
from homeserver.runtime import HomeserverRuntime
from tests.support.server import base_settings


def _route_map() -> RouteMap:
    return RouteMap(
        [
            Rule("/versions", endpoint="versions", methods=["GET"]),
            Rule("/rooms/<room_id>/send", endpoint="send", methods=["PUT"]),
            Rule("/media", endpoint="media", methods=["GET"], defaults={"size": 1}),
        ],
        strict_slashes=False,
    )


def _matcher_cycles(run) -> int:
    """How many of werkzeug's matcher closures `run` leaves for the collector."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run()
        gc.collect()
        return sum(
            1
            for found in gc.garbage
            if getattr(found, "__qualname__", "") == "StateMachineMatcher.match.<locals>._match"
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_a_fixed_path_is_matched_once_by_werkzeug_then_leaves_no_cycle():
    adapter = _route_map().bind("hs.test")
    assert adapter.match("/versions", "GET", return_rule=True)[0].endpoint == "versions"

    def again():
        for _ in range(20):
            rule, values = adapter.match("/versions", "GET", return_rule=True)
            assert (rule.endpoint, values) == ("versions", {})

    assert _matcher_cycles(again) == 0


def test_a_path_with_variables_is_matched_by_werkzeug_each_time():
    adapter = _route_map().bind("hs.test")

    def twice():
        for room in ("!a:hs.test", "!b:hs.test"):
            assert adapter.match(f"/rooms/{room}/send", "PUT") == ("send", {"room_id": room})

    # The check above can fail: werkzeug's own matching leaves its closure every time.
    assert _matcher_cycles(twice) == 2


def test_each_match_gets_values_of_its_own():
    adapter = _route_map().bind("hs.test")
    first = adapter.match("/versions", "GET")[1]
    first["injected"] = True
    assert adapter.match("/versions", "GET")[1] == {}
    # A rule with defaults has arguments, so it is never remembered: its values are werkzeug's.
    assert adapter.match("/media", "GET") == ("media", {"size": 1})
    assert adapter.match("/media", "GET") == ("media", {"size": 1})


def test_refusals_are_not_remembered():
    adapter = _route_map().bind("hs.test")
    for _ in range(2):
        with pytest.raises(MethodNotAllowed):
            adapter.match("/versions", "POST")
        with pytest.raises(NotFound):
            adapter.match("/nothing", "GET")
    assert adapter.match("/versions/", "GET")[0] == "versions"  # strict_slashes off


def test_a_rule_added_later_is_matched():
    route_map = _route_map()
    adapter = route_map.bind("hs.test")
    assert adapter.match("/versions", "GET")[0] == "versions"
    route_map.add(Rule("/versions", endpoint="versions_post", methods=["POST"]))
    adapter = route_map.bind("hs.test")
    assert adapter.match("/versions", "POST")[0] == "versions_post"
    assert adapter.match("/versions", "GET")[0] == "versions"


@pytest.fixture
def served(tmp_path):
    runtime = HomeserverRuntime(parse_config(base_settings(str(tmp_path / "data")), str(tmp_path)))
    app = create_flask_app(runtime)
    server = WeirWSGIServer(("127.0.0.1", 0), app, pool=WorkPool(8), keepalive_timeout=5)
    server.start()
    yield app, server.server_port
    server.stop(timeout=1)
    runtime.close()


def test_the_apps_requests_for_a_fixed_path_leave_no_cycle(served):
    app, port = served
    # werkzeug keeps its matcher in a private attribute: this fails if it moves.
    assert isinstance(app.url_map._matcher, FixedPathMatcher)
    sock = socket.create_connection(("127.0.0.1", port))
    reader = sock.makefile("rb")

    def get(path: str, count: int):
        def run():
            for _ in range(count):
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
                status = reader.readline()
                length = 0
                while (line := reader.readline()) != b"\r\n":
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                reader.read(length)
                assert status.split()[1] in (b"200", b"401")

        return run

    try:
        get("/_matrix/client/versions", 1)()  # werkzeug's first match
        assert _matcher_cycles(get("/_matrix/client/versions", 20)) == 0
        # The same count does see werkzeug's closures, for a path with variables (401: no
        # token, but matched).
        assert _matcher_cycles(get("/_matrix/client/v3/rooms/!r:t/state", 3)) == 3
    finally:
        reader.close()
        sock.close()


def test_an_escaped_slash_stays_inside_its_segment():
    # A room version 3 event ID is standard base64: `/` travels as %2F, and `%25` must not
    # turn into a second one.
    route_map = RouteMap([Rule("/event/<event_id>/<path:rest>", endpoint="event")])
    adapter = route_map.bind("hs.test")
    path = routed_path("/event/$a%2Fb+%252F%20c/x%2Fy/z")
    assert adapter.match(path) == ("event", {"event_id": "$a/b+%2F c", "rest": "x/y/z"})


def test_the_server_routes_an_event_id_holding_a_slash(served):
    _, port = served
    for path in ("/_matrix/federation/v1/event/$a%2Fb", "/_matrix/federation/v1/event/$a/b"):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            status = sock.makefile("rb").readline()
        # Matched, so refused for want of X-Matrix; split at the `/`, it matches nothing.
        assert status.split()[1] == (b"401" if "%2F" in path else b"404"), status
