"""At `max_connections` the server makes room by closing the connection idle longest
(homeserver/http/server.py), so a new client, a load balancer's /health check included, is
answered rather than left unaccepted until some connection closes by itself. A parked /sync
and a request in progress are never idle, so never the one closed. Against the real server."""

import socket
import time

import gevent
import pytest
import requests

from tests.support.metrics import metric, wait_for_metric
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge

V3 = "/_matrix/client/v3"
MAX_CONNECTIONS = 200
KEEPALIVE = 120.0  # far longer than the test: an idle connection never ends by itself
CLOSED = "weir_client_idle_connections_closed_total"


@pytest.fixture(scope="module")
def weir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("max-connections")
    http = {"max_connections": MAX_CONNECTIONS, "keepalive_timeout": KEEPALIVE}
    settings = merge(base_settings(str(directory / "data")), {"server": {"http": http}})
    proc = WeirProcess(str(directory), settings).start()
    yield proc
    proc.stop()


def address(weir) -> tuple[str, int]:
    host, port = weir.client_url.rsplit("/", 1)[1].rsplit(":", 1)
    return host, int(port)


def idle_keep_alive(weir) -> socket.socket:
    """A connection that made one request and keeps its connection open, sending nothing."""
    sock = socket.create_connection(address(weir), timeout=30)
    sock.sendall(b"GET /_matrix/client/versions HTTP/1.1\r\nHost: weir\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200"), head[:100]
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(65536) == b""  # (the response body was read with the head or later)
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def test_a_new_client_is_answered_at_max_connections_and_a_parked_sync_is_never_closed(weir):
    alice = MatrixClient(weir.client_url)
    alice.register("alice")
    room_id = alice.post(f"{V3}/createRoom", json={}).json()["room_id"]
    since = alice.get(f"{V3}/sync").json()["next_batch"]
    # The parked sync is the oldest connection of all: it would be the first closed if a
    # parked request counted as idle.
    parked = gevent.spawn(
        requests.get,
        weir.url(f"{V3}/sync"),
        params={"since": since, "timeout": 90_000},
        headers={"Authorization": f"Bearer {alice.token}"},
        timeout=100,
    )
    wait_for_metric(weir.client_url, "weir_sync_waiters", 1, timeout=15)
    assert metric(weir.client_url, CLOSED) == 0
    alice.session.close()  # its keep-alive connection would be idle, and older than ours
    # Every other place taken by idle keep-alive connections, oldest first.
    idle = [idle_keep_alive(weir) for _ in range(MAX_CONNECTIONS - 1)]
    newcomers = []
    for _ in range(5):
        started = time.monotonic()
        # Without room made, each waits for a connection to end: the keep-alive timeout.
        r = requests.get(weir.url("/health"), timeout=10, headers={"Connection": "close"})
        assert r.status_code == 200, r.text
        newcomers.append(idle_keep_alive(weir))  # a new client that keeps its connection
        print(f"/health, then /versions, at max_connections: {time.monotonic() - started:.3f} s")
    closed = [s for s in idle if closed_by_server(s)]
    # Each newcomer took the place of one idle connection: ours, but for any connection
    # whose client had closed it and whose server side had not yet seen that (idle, older).
    assert len(closed) >= 3
    assert closed == idle[: len(closed)]  # the longest idle first
    assert metric(weir.client_url, CLOSED) >= len(closed)
    # The parked sync is still waiting, and a message in its room wakes it.
    assert not parked.ready()
    alice.put(
        f"{V3}/rooms/{room_id}/send/m.room.message/t1", json={"msgtype": "m.text", "body": "hi"}
    )
    woken = parked.get(timeout=30)
    assert woken.status_code == 200
    assert room_id in woken.json()["rooms"]["join"]
    for sock in idle + newcomers:
        sock.close()
