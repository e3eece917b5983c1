"""The main pool counts requests being worked on: idle connections, request heads being read
and parked syncs wait outside it (homeserver/http/places.py), and reading a request has
deadlines (homeserver/http/reading.py). Against the real server process."""

import select
import socket
import time
from urllib.parse import quote

import gevent
import pytest
import requests

from homeserver.http.places import WorkPlaces, WorkPool
from tests.support.server import MatrixClient

V3 = "/_matrix/client/v3"
HEAD_TIMEOUT = 1.0
KEEPALIVE = 30.0  # far longer than any test here waits


def wait_until(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        gevent.sleep(0.02)


def metric(weir, name: str, labels: str = "") -> float:
    prefix = f"{name}{{{labels}}} " if labels else f"{name} "
    text = requests.get(weir.url("/metrics"), timeout=10).text
    return float(next(x for x in text.splitlines() if x.startswith(prefix)).split()[1])


def address(weir) -> tuple[str, int]:
    host, port = weir.client_url.rsplit("/", 1)[1].rsplit(":", 1)
    return host, int(port)


def connect(weir) -> socket.socket:
    return socket.create_connection(address(weir), timeout=10)


def read_response(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def no_traceback(weir) -> bool:
    with open(weir.stderr_path, errors="replace") as f:
        return "Traceback" not in f.read()


@pytest.fixture(scope="module")
def weir(tmp_path_factory):
    from tests.support.server import WeirProcess, base_settings, merge

    directory = tmp_path_factory.mktemp("waiting-stage")
    http = {"main_pool_size": 4, "keepalive_timeout": KEEPALIVE}
    settings = merge(
        base_settings(str(directory / "data")),
        {"server": {"http": {**http, "request_head_timeout": HEAD_TIMEOUT}}},
    )
    proc = WeirProcess(str(directory), settings).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def alice(weir):
    client = MatrixClient(weir.client_url)
    client.register("alice")
    return client


def test_idle_connections_and_parked_syncs_take_no_main_pool_place(weir, alice):
    """main_pool_size = 4: 20 idle keep-alive connections and 10 parked syncs, and /health
    and /versions still answer at once."""
    fresh = [connect(weir) for _ in range(10)]  # never sent a request
    kept = []
    for _ in range(10):  # answered once, now idle between requests
        sock = connect(weir)
        sock.sendall(b"GET /_matrix/client/versions HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        kept.append(sock)
    since = alice.get(f"{V3}/sync").json()["next_batch"]
    syncs = []
    for _ in range(10):
        sock = connect(weir)
        sock.sendall(
            f"GET {V3}/sync?since={quote(since)}&timeout=120000 HTTP/1.1\r\n"
            f"Host: x\r\nAuthorization: Bearer {alice.token}\r\n\r\n".encode()
        )
        syncs.append(sock)
    wait_until(lambda: metric(weir, "weir_sync_waiters") == 10)

    assert requests.get(weir.url("/health"), timeout=5).status_code == 200
    assert requests.get(weir.url("/_matrix/client/versions"), timeout=5).status_code == 200
    # Only the scrape itself holds a place; every connection waits in the waiting stage.
    assert metric(weir, "weir_pool_greenlets", 'pool="main"') == 1
    assert metric(weir, "weir_pool_greenlets", 'pool="client_connections"') >= 31

    for sock in fresh + kept + syncs:
        sock.close()
    wait_until(lambda: metric(weir, "weir_sync_waiters") == 0)


def test_a_slow_request_head_is_closed_at_request_head_timeout(weir):
    """A client sending one header line every 0.25 s: the head as a whole has 1 s, after
    which it gets a 408 and its connection is closed; /health answers meanwhile."""
    sock = connect(weir)
    started = time.monotonic()
    sock.sendall(b"GET /_matrix/client/versions HTTP/1.1\r\n")

    def trickle():
        try:
            for i in range(100):
                gevent.sleep(0.25)
                sock.sendall(f"X-Slow-{i}: {i}\r\n".encode())
        except OSError:
            pass

    trickler = gevent.spawn(trickle)
    assert requests.get(weir.url("/health"), timeout=5).status_code == 200
    response = read_response(sock)
    elapsed = time.monotonic() - started
    trickler.kill()
    sock.close()
    assert response.startswith(b"HTTP/1.1 408")
    assert b'"errcode":"M_UNKNOWN"' in response
    # At the head timeout, not the keep-alive one (30 s) nor a per-read one (never reached).
    assert HEAD_TIMEOUT <= elapsed < KEEPALIVE / 2


def test_a_body_shorter_than_its_content_length_is_a_400(weir):
    sock = connect(weir)
    sock.sendall(
        b"POST /_matrix/client/v3/login HTTP/1.1\r\nHost: x\r\n"
        b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"type":'
    )
    sock.shutdown(socket.SHUT_WR)  # the client sends nothing more
    response = read_response(sock)
    sock.close()
    assert response.startswith(b"HTTP/1.1 400"), response
    assert b'"errcode":"M_UNKNOWN"' in response
    assert no_traceback(weir)


def test_a_malformed_chunk_is_a_400(weir):
    sock = connect(weir)
    sock.sendall(
        b"POST /_matrix/client/v3/login HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"zz\r\n{}\r\n0\r\n\r\n"
    )
    response = read_response(sock)
    sock.close()
    assert response.startswith(b"HTTP/1.1 400"), response
    assert b"errcode" in response
    assert no_traceback(weir)


def test_a_full_main_pool_makes_a_request_wait_then_succeed(weir):
    """Four requests whose bodies have not arrived hold the four places; /versions waits
    for one, answers once a body arrives, and the wait shows in /metrics."""
    before = metric(weir, "weir_pool_waits_total", 'pool="main"')
    body = b'{"type":"m.login.password","identifier":{"type":"m.id.user","user":"nobody"},'
    rest = b'"password":"wrong"}'
    holders = []
    for _ in range(4):
        sock = connect(weir)
        sock.sendall(
            b"POST /_matrix/client/v3/login HTTP/1.1\r\nHost: x\r\nContent-Type: "
            b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body + rest), body)
        )
        holders.append(sock)
    waiting = connect(weir)
    waiting.sendall(
        b"GET /_matrix/client/versions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"[:]
    )
    readable, _, _ = select.select([waiting], [], [], 1.0)
    assert not readable  # no place for it yet

    holders[0].sendall(rest)
    assert holders[0].recv(65536).startswith(b"HTTP/1.1 403")
    assert read_response(waiting).startswith(b"HTTP/1.1 200")
    for sock in holders[1:]:
        sock.sendall(rest)
        assert sock.recv(65536).startswith(b"HTTP/1.1 403")
    for sock in [*holders, waiting]:
        sock.close()
    assert metric(weir, "weir_pool_waits_total", 'pool="main"') == before + 1
    assert metric(weir, "weir_pool_wait_seconds_total", 'pool="main"') > 0
    assert metric(weir, "weir_pool_waiting", 'pool="main"') == 0


def test_a_body_that_stalls_is_a_408(start_weir):
    """The socket's idle timeout (here 1 s) or the floor cuts a stalled body off: 408."""
    weir = start_weir({"server": {"http": {"keepalive_timeout": 1}}})
    sock = connect(weir)
    sock.sendall(
        b"POST /_matrix/client/v3/login HTTP/1.1\r\nHost: x\r\n"
        b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"type":'
    )
    response = read_response(sock)
    sock.close()
    assert response.startswith(b"HTTP/1.1 408"), response
    assert no_traceback(weir)


def test_no_place_in_time_is_refused_and_counted():
    places = WorkPlaces(WorkPool(1), wait_seconds=0.1)
    holder = gevent.spawn(lambda: places.take() and gevent.sleep(5))
    gevent.sleep(0)
    assert gevent.spawn(places.take).get(timeout=5) is False
    assert (places.waits, places.timeouts, places.waiting) == (1, 1, 0)
    assert places.waited_seconds >= 0.1
    holder.kill()


def test_a_free_place_goes_to_the_request_that_waited_for_it():
    places = WorkPlaces(WorkPool(1), wait_seconds=5)
    order: list[str] = []

    def queued() -> None:
        assert places.take()
        order.append("queued")
        places.give_back()

    def holder() -> None:
        assert places.take()
        waiter = gevent.spawn(queued)
        gevent.sleep(0)  # the waiter queues for the only place
        places.give_back()
        # Asking again at once, it queues behind the waiter rather than taking the place
        # back before the waiter runs (a woken /sync behind its client's next request).
        assert places.take()
        order.append("holder again")
        places.give_back()
        waiter.get()

    gevent.spawn(holder).get(timeout=5)
    assert order == ["queued", "holder again"]
    assert (places.waiting, places.waits, places.timeouts) == (0, 2, 0)
