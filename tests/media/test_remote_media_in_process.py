"""Remote media with the server built in the test process, where a test can reach inside:

- inline mode (the app built without pools, as `flask run` and embedded use build it): the
  same code path, with fetches in the request greenlet under ADR-0079's client outbound
  budget, served here by a WeirWSGIServer on loopback;
- pool mode's shutdown and hang-up rules, on a HomeserverServer with one media-pool place.
"""

import http.client
import socket
import time
import uuid

import gevent
import pytest
from gevent.event import Event

from homeserver.api.app import create_flask_app
from homeserver.config import parse_config
from homeserver.http.places import WorkPool
from homeserver.http.server import WeirWSGIServer
from homeserver.processes.listeners import HomeserverServer
from homeserver.runtime import HomeserverRuntime
from tests.media.images import solid
from tests.peers.tarpit import Tarpit
from tests.support.browser import Connection, burst
from tests.support.federation import federation_settings
from tests.support.server import MatrixClient, base_settings, merge

CLIENT = "/_matrix/client/v1/media"
REMOTE_TIMEOUT = 5


def make_config(test_ca, tmp_path, **http):
    settings = merge(
        base_settings(str(tmp_path / "data")),
        {
            "server": {"http": http},
            "federation": federation_settings(test_ca, remote_timeout=REMOTE_TIMEOUT),
        },
    )
    return parse_config(settings, str(tmp_path))


def wait_until(predicate, timeout: float = 10) -> None:
    """In-process state changes with no event to wait on: look again every few ms."""
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not reached"
        gevent.sleep(0.01)


def new_id() -> str:
    return uuid.uuid4().hex


# --- inline mode ------------------------------------------------------------------------------


@pytest.fixture
def inline(test_ca, tmp_path):
    runtime = HomeserverRuntime(make_config(test_ca, tmp_path, main_pool_size=4), pools=False)
    server = WeirWSGIServer(
        ("127.0.0.1", 0), create_flask_app(runtime), pool=WorkPool(100), keepalive_timeout=30
    )
    server.start()
    server.url = f"http://127.0.0.1:{server.address[1]}"
    yield server, runtime
    server.stop(timeout=1)
    runtime.close()


def test_inline_mode_follows_the_client_outbound_budget(inline, start_peer):
    """Element's first view in inline mode: while one fetch is in flight for a client, its
    other requests (the same file's thumbnail included) are refused at once, as ADR-0079
    says; one at a time, the view loads with one fetch per file."""
    server, runtime = inline
    budget = runtime.client_outbound_budget
    assert runtime.media_handoff is None and runtime.media_pool is None
    token = MatrixClient(server.url).register("ivy")["access_token"]
    headers = {"Authorization": f"Bearer {token}"}
    peer = start_peer("127.46.1.1:8448", "127.46.1.1")
    images = {new_id(): solid(200, 150, "PNG") for _ in range(10)}
    for media_id, data in images.items():
        peer.serve_media(media_id, data, "image/png")
    release = peer.media_gate = Event()
    paths = []
    for media_id in images:
        paths += [
            f"{CLIENT}/download/{peer.server_name}/{media_id}",
            f"{CLIENT}/thumbnail/{peer.server_name}/{media_id}?width=32&height=32",
        ]

    view = gevent.spawn(burst, server.url, paths, 6, headers)
    wait_until(lambda: budget.refusals == len(paths) - 1)  # all but the first, at once
    assert peer.media_fetches() == 1 and budget.in_flight == 1
    release.set()
    results = view.get()
    statuses = [r.status for r in results]
    assert statuses.count(200) == 1 and statuses.count(429) == len(paths) - 1
    for r in results:
        if r.status == 429:
            assert r.json()["errcode"] == "M_LIMIT_EXCEEDED"
            assert r.json()["retry_after_ms"] == 1000 and r.headers["retry-after"] == "1"
    assert peer.max_in_flight == 1 and budget.in_flight == 0

    # One request at a time, the whole view loads: one fetch per file, thumbnails from the
    # cached originals.
    results = burst(server.url, paths, 1, headers)
    assert [r.status for r in results] == [200] * len(paths)
    assert [r.body for r in results[0::2]] == list(images.values())
    assert peer.media_fetches() == 10 and peer.max_in_flight == 1
    assert budget.in_flight == 0


def test_inline_mode_global_cap_is_half_the_main_pool(inline, start_peer):
    server, runtime = inline
    token = MatrixClient(server.url).register("jay")["access_token"]
    headers = {"Authorization": f"Bearer {token}"}
    clients = [Connection(server.url, source_ip=f"127.46.3.{i}") for i in (1, 2, 3)]
    with Tarpit("127.46.2.1", 8448) as tarpit:
        # main_pool_size = 4: two clients may wait on remote peers; a third is refused.
        parked = [
            gevent.spawn(c.get, f"{CLIENT}/download/127.46.2.1:8448/{new_id()}", headers)
            for c in clients[:2]
        ]
        assert tarpit.wait_accepted(2, timeout=10)
        third = clients[2].get(f"{CLIENT}/download/127.46.2.1:8448/{new_id()}", headers)
        assert (third.status, third.json()["errcode"]) == (429, "M_LIMIT_EXCEEDED")
        gevent.joinall(parked, raise_error=True)
    for c in clients:
        c.close()
    assert [g.value.status for g in parked] == [504, 504]
    assert runtime.client_outbound_budget.in_flight == 0


# --- pool mode: after the response, hang-ups, shutdown ----------------------------------------


def pooled_server(test_ca, tmp_path, **http):
    runtime = HomeserverRuntime(make_config(test_ca, tmp_path, **http), pools=True)
    server = HomeserverServer(runtime)
    server.start()
    client = MatrixClient(server.client_url)
    client.register("kim")
    client.session.close()  # its keep-alive connection would hold a main-pool place
    server.headers = {"Authorization": f"Bearer {client.token}"}
    return server, runtime


@pytest.fixture
def pooled(test_ca, tmp_path):
    server, runtime = pooled_server(test_ca, tmp_path, media_fetch_threads=1)
    yield server, runtime
    server.stop(grace=1)
    runtime.close()


def test_a_connection_back_from_the_media_pool_keeps_alive_with_the_main_pool_busy(
    test_ca, tmp_path, start_peer
):
    """main_pool_size = 2. While a request is handed off it holds no main-pool place, and two
    other requests run meanwhile; once its response is written, its connection stays open
    and serves its next request like any other (http/places.py)."""
    server, runtime = pooled_server(test_ca, tmp_path, main_pool_size=2)
    try:
        peer = start_peer("127.46.7.1:8448", "127.46.7.1")
        media_id = new_id()
        peer.serve_media(media_id, b"the answer", "text/plain")
        release = peer.media_gate = Event()
        sock = raw_request(
            server.client_url, f"{CLIENT}/download/{peer.server_name}/{media_id}", server.headers
        )
        wait_until(lambda: runtime.media_fetch_budget.in_flight == 1)
        assert len(runtime.main_pool) == 0  # the handed-off request holds no place
        others = [Connection(server.client_url, timeout=10) for _ in range(2)]
        assert [c.get("/_matrix/client/versions").status for c in others] == [200, 200]
        release.set()
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert (response.status, response.read()) == (200, b"the answer")
        wait_until(lambda: runtime.media_fetch_budget.in_flight == 0)
        # The same connection serves its next request.
        sock.sendall(b"GET /_matrix/client/versions HTTP/1.1\r\nHost: x\r\n\r\n")
        again = http.client.HTTPResponse(sock)
        again.begin()
        assert again.status == 200
        again.read()
        assert len(runtime.main_pool) == 0
        for c in others:
            c.close()
        sock.close()
    finally:
        server.stop(grace=1)
        runtime.close()


def test_waiters_on_a_fetch_take_no_media_pool_place(test_ca, tmp_path, start_peer):
    """Two media-pool places. One slow file asked for six times is one fetch in one place;
    the other place stays free for another file, which is fetched meanwhile."""
    server, runtime = pooled_server(test_ca, tmp_path, media_fetch_threads=2)
    try:
        slow, other = (
            start_peer("127.46.8.1:8448", "127.46.8.1"),
            start_peer("127.46.8.2:8448", "127.46.8.2"),
        )
        slow_id, other_id = new_id(), new_id()
        slow.serve_media(slow_id, solid(64, 64), "image/png")
        other.serve_media(other_id, b"not held up", "text/plain")
        release = slow.media_gate = Event()
        kinds = ["download", "thumbnail"] * 3
        waiting = [
            gevent.spawn(
                Connection(server.client_url).get,
                f"{CLIENT}/{kind}/{slow.server_name}/{slow_id}?width=8&height=8",
                server.headers,
            )
            for kind in kinds
        ]
        wait_until(lambda: len(runtime.media_handoff.away) == len(kinds))
        # The leader holds the one ticket and one place; its five waiters wait outside both.
        assert runtime.media_fetch_budget.in_flight == 1
        assert len(runtime.media_pool) == 1
        r = Connection(server.client_url).get(
            f"{CLIENT}/download/{other.server_name}/{other_id}", server.headers
        )
        assert (r.status, r.body) == (200, b"not held up")
        assert not any(g.ready() for g in waiting)
        release.set()
        assert [g.get().status for g in waiting] == [200] * len(kinds)
        assert slow.media_fetches() == 1
        wait_until(lambda: runtime.media_fetch_budget.in_flight == 0)
    finally:
        server.stop(grace=1)
        runtime.close()


def raw_request(url: str, path: str, headers: dict) -> socket.socket:
    """Sends a GET and returns the socket without reading the answer."""
    host, port = url.split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)))
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}"] + [f"{k}: {v}" for k, v in headers.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return sock


def test_a_handoff_whose_client_has_gone_is_dropped_without_fetching(pooled, start_peer):
    server, runtime = pooled
    budget, handoff = runtime.media_fetch_budget, runtime.media_handoff
    peer = start_peer("127.46.4.1:8448", "127.46.4.1")
    media_id = new_id()
    peer.serve_media(media_id, b"never fetched", "text/plain")
    with Tarpit("127.46.4.2", 8448) as tarpit:
        # The one media-pool place is taken by a fetch parked on the tarpit.
        parked = gevent.spawn(
            Connection(server.client_url).get,
            f"{CLIENT}/download/127.46.4.2:8448/{new_id()}",
            server.headers,
        )
        assert tarpit.wait_accepted(1, timeout=10)
        # A second request queues for the place, and its client hangs up meanwhile.
        sock = raw_request(
            server.client_url, f"{CLIENT}/download/{peer.server_name}/{media_id}", server.headers
        )
        wait_until(lambda: budget.in_flight == 2 and len(handoff.away) == 2)
        sock.close()
        wait_until(lambda: budget.in_flight == 1 and len(handoff.away) == 1)
    parked.join()  # the tarpit is gone: the parked fetch fails and frees the place
    assert parked.value.status == 502
    wait_until(lambda: budget.in_flight == 0 and len(runtime.media_pool) == 0)
    assert peer.hits() == 0


def test_after_the_media_pool_stopped_handoffs_answer_503(pooled, start_peer):
    server, runtime = pooled
    budget, handoff = runtime.media_fetch_budget, runtime.media_handoff
    peer = start_peer("127.46.5.1:8448", "127.46.5.1")
    cached, queued, late = new_id(), new_id(), new_id()
    for media_id in (cached, queued, late):
        peer.serve_media(media_id, b"bytes", "text/plain")
    client = Connection(server.client_url)
    assert (
        client.get(f"{CLIENT}/download/{peer.server_name}/{cached}", server.headers).status == 200
    )
    with Tarpit("127.46.5.2", 8448) as tarpit:
        parked = gevent.spawn(
            Connection(server.client_url).get,
            f"{CLIENT}/download/127.46.5.2:8448/{new_id()}",
            server.headers,
        )
        assert tarpit.wait_accepted(1, timeout=10)
        waiting = gevent.spawn(
            Connection(server.client_url).get,
            f"{CLIENT}/download/{peer.server_name}/{queued}",
            server.headers,
        )
        wait_until(lambda: budget.in_flight == 2)
        handoff.stop()  # what HomeserverServer.stop does first
        # A new handoff is refused at once; a cached copy needs none and is still served.
        r = client.get(f"{CLIENT}/download/{peer.server_name}/{late}", server.headers)
        assert (r.status, r.json()["errcode"]) == (503, "M_UNKNOWN")
        assert (
            client.get(f"{CLIENT}/download/{peer.server_name}/{cached}", server.headers).status
            == 200
        )
    # The queued request gets its place once the parked fetch fails, and gives up with 503.
    assert waiting.get().status == 503
    assert parked.get().status == 502
    assert peer.media_fetches() == 1  # only the cached copy was ever fetched
    wait_until(lambda: budget.in_flight == 0 and len(handoff.away) == 0)


def test_shutdown_stops_requests_parked_on_a_peer(pooled):
    server, runtime = pooled
    with Tarpit("127.46.6.1", 8448) as tarpit:
        parked = gevent.spawn(
            Connection(server.client_url).get,
            f"{CLIENT}/download/127.46.6.1:8448/{new_id()}",
            server.headers,
        )
        assert tarpit.wait_accepted(1, timeout=10)
        started = time.monotonic()
        server.stop(grace=0.5)
        assert time.monotonic() - started < REMOTE_TIMEOUT  # not left to run to its deadline
        with pytest.raises(ConnectionError):
            parked.get(timeout=10)  # closed without an answer
        assert tarpit.wait_current(0, timeout=10)  # and our side of the fetch is closed
    assert runtime.media_fetch_budget.in_flight == 0
    assert len(runtime.media_handoff.away) == 0 and len(runtime.media_pool) == 0


def test_a_deadline_spent_waiting_for_a_media_pool_place_is_counted(pooled):
    """The one media-pool place is taken: a request for a file not cached waits for it, runs
    out of its deadline, and gets 504. Operators see it on /metrics as a deadline, like a
    fetch from a silent peer, and no peer was called."""
    server, runtime = pooled
    holder = runtime.media_pool.spawn(Event().wait)  # takes the only place
    expiries = dict(name="weir_outbound_deadline_expiries_total", labels={"call": "remote_media"})
    deadlines = dict(
        name="weir_outbound_calls_total", labels={"call": "remote_media", "outcome": "deadline"}
    )

    def count(metric):
        return runtime.metrics.registry.get_sample_value(**metric) or 0

    try:
        with Tarpit("127.46.9.1", 8448) as tarpit:
            r = Connection(server.client_url, timeout=REMOTE_TIMEOUT + 10).get(
                f"{CLIENT}/download/127.46.9.1:8448/{new_id()}", server.headers
            )
            assert (r.status, r.json()["errcode"]) == (504, "M_UNKNOWN")
            assert tarpit.accepted == 0
        assert (count(expiries), count(deadlines)) == (1, 1)
        wait_until(lambda: runtime.media_fetch_budget.in_flight == 0)
    finally:
        holder.kill()
