"""The request path in process: fair turns between keep-alive connections, CORS on every
response, the OPTIONS preflight, the access log at INFO, and the thread pools' gauges."""

from __future__ import annotations

import gc
import json
import logging
import socket

import gevent
import pytest
import requests
from gevent import monkey
from gevent.event import Event

from homeserver.api.app import create_flask_app
from homeserver.config import parse_config
from homeserver.http.places import WorkPool
from homeserver.http.responses import CORS_HEADERS, json_response
from homeserver.http.server import WeirHandler, WeirWSGIServer
from homeserver.runtime import HomeserverRuntime
from tests.support.server import base_settings

PIPELINED = 5


def test_pipelined_keep_alive_connections_are_served_in_turns():
    # Each connection sends all its requests at once, so each next one has already arrived
    # when its previous one is answered: without a turn of the hub in between, one
    # connection would be served to its end while the other waits.
    served: list[str] = []
    both_started = Event()
    done = Event()

    def app(environ, start_response):
        conn, number = environ["PATH_INFO"].split("/")[1:]
        served.append(conn)
        if number == "0":
            # Hold the first request of each until both connections are in: from then on
            # both have requests waiting, whatever order they were accepted in. (Only there:
            # waiting on an Event may itself yield.)
            if len(served) == 2:
                both_started.set()
            both_started.wait()
        if len(served) == 2 * PIPELINED:
            done.set()
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
        return [b"ok"]

    server = WeirWSGIServer(("127.0.0.1", 0), app, pool=WorkPool(4), keepalive_timeout=5)
    server.start()
    socks = []
    try:
        for conn in ("a", "b"):
            sock = socket.create_connection(("127.0.0.1", server.server_port))
            sock.sendall(
                b"".join(
                    f"GET /{conn}/{i} HTTP/1.1\r\nHost: t\r\n\r\n".encode()
                    for i in range(PIPELINED)
                )
            )
            socks.append(sock)
        assert done.wait(10)
    finally:
        for sock in socks:
            sock.close()
        server.stop()
    # After both first requests, no connection is served twice in a row.
    rest = served[2:]
    assert sorted(rest) == ["a"] * (PIPELINED - 1) + ["b"] * (PIPELINED - 1)
    assert all(x != y for x, y in zip(rest, rest[1:])), served


def test_a_response_larger_than_one_send_takes_arrives_whole():
    # One send takes what the socket's buffer has room for; a slow reader leaves the rest
    # to be sent as the buffer drains.
    body = bytes(range(256)) * (32 * 1024)  # 8 MiB

    def app(environ, start_response):
        start_response("200 OK", [("Content-Length", str(len(body)))])
        return [body]

    server = WeirWSGIServer(("127.0.0.1", 0), app, pool=WorkPool(4), keepalive_timeout=5)
    server.start()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        sock.connect(("127.0.0.1", server.server_port))
        sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        reader = sock.makefile("rb")
        assert reader.readline().startswith(b"HTTP/1.1 200")
        while reader.readline() != b"\r\n":
            pass
        assert reader.read(len(body)) == body
    finally:
        sock.close()
        server.stop()


def test_an_idle_keep_alive_connection_keeps_nothing_of_its_last_request():
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
        return [b"ok"]

    server = WeirWSGIServer(("127.0.0.1", 0), app, pool=WorkPool(4), keepalive_timeout=5)
    server.start()
    sock = socket.create_connection(("127.0.0.1", server.server_port))
    try:
        sock.sendall(b"GET /a?b=c HTTP/1.1\r\nHost: t\r\nX-Big: " + b"x" * 500 + b"\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        with gevent.Timeout(10):
            while not server.idle_greenlets:  # back to waiting for its next request
                gevent.sleep(0.01)
        (handler,) = [
            o for o in gc.get_objects() if isinstance(o, WeirHandler) and o.server is server
        ]
        kept = (handler.environ, handler.headers, handler.wsgi_input, handler.response_headers)
        assert kept == (None, None, None, None)
        # ...and its next request is served as the first was.
        sock.sendall(b"GET /again HTTP/1.1\r\nHost: t\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        sock.close()
        server.stop()


# --- thread pools by kind ---------------------------------------------------------------------


@pytest.fixture
def runtime(tmp_path):
    rt = HomeserverRuntime(parse_config(base_settings(str(tmp_path / "data")), str(tmp_path)))
    yield rt
    rt.close()


def _block_every_thread(pool) -> tuple[object, list]:
    """Occupies each thread of `pool` until the returned native lock is released; returns
    once every thread has taken its job."""
    # Native locks only: the original threading.Semaphore builds its Condition on the
    # patched Lock, a gevent lock, which a native thread can deadlock on.
    allocate_lock = monkey.get_original("_thread", "allocate_lock")
    lock = allocate_lock()
    lock.acquire()
    started = [allocate_lock() for _ in range(pool.maxsize)]
    for each in started:
        each.acquire()

    def hold(started_here):
        started_here.release()
        with lock:
            pass

    jobs = [gevent.spawn(pool.apply, hold, (each,)) for each in started]
    for each in started:  # a native wait, so on another pool's thread (the hub's)
        gevent.get_hub().threadpool.apply(each.acquire)
    return lock, jobs


def test_database_queries_do_not_wait_behind_password_hashing(runtime):
    hasher = runtime.password_hasher
    stored = hasher.hash("secret")
    lock, jobs = _block_every_thread(hasher.pool)
    try:
        login = gevent.spawn(hasher.check, "secret", stored)
        gevent.sleep(0)
        assert hasher.pool.queued == 1  # the hash waits, in its own pool's queue...
        # ...and the database answers meanwhile.
        assert runtime.db.read(lambda tx: tx.fetchone("SELECT 1")) == (1,)
        assert runtime.accounts.store.get_user("@nobody:weir.test") is None
        assert not login.ready()
    finally:
        lock.release()
    gevent.joinall([*jobs, login], raise_error=True)
    assert hasher.pool.queued == 0
    assert login.value is True


def test_metrics_show_each_thread_pool_queue(runtime):
    runtime.build_all()
    lock, jobs = _block_every_thread(runtime.password_hasher.pool)
    try:
        waiting = gevent.spawn(runtime.password_hasher.hash, "secret")
        gevent.sleep(0)
        text = runtime.metrics.render().decode()
    finally:
        lock.release()
    gevent.joinall([*jobs, waiting], raise_error=True)
    threads = runtime.password_hasher.pool.maxsize
    assert 'weir_threadpool_queued{pool="password_hashing"} 1.0' in text
    assert f'weir_threadpool_threads{{pool="password_hashing"}} {threads}.0' in text
    for pool in ("thumbnails", "database_read", "database_write"):
        assert f'weir_threadpool_queued{{pool="{pool}"}} 0.0' in text
        assert f'weir_threadpool_threads{{pool="{pool}"}}' in text


# --- the lean hot path: same answers ----------------------------------------------------------


@pytest.fixture
def served(runtime):
    server = WeirWSGIServer(
        ("127.0.0.1", 0), create_flask_app(runtime), pool=WorkPool(8), keepalive_timeout=5
    )
    server.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.stop(timeout=1)


def _has_cors(response) -> bool:
    return all(response.headers.get(name) == value for name, value in CORS_HEADERS.items())


def test_preflight_answers_204_with_cors_on_any_path(served):
    for path in ("/_matrix/client/v3/login", "/no/such/path", "/_matrix/federation/v1/version"):
        r = requests.options(
            served + path,
            headers={"Origin": "https://app.element.io", "Access-Control-Request-Method": "POST"},
        )
        assert r.status_code == 204 and r.content == b""
        assert _has_cors(r)


def test_cors_headers_on_json_responses_and_errors_once_each(served):
    ok = requests.get(served + "/_matrix/client/versions")
    not_found = requests.get(served + "/_matrix/client/v3/nothing")
    unauthorized = requests.get(served + "/_matrix/client/v3/account/whoami")
    assert [r.status_code for r in (ok, not_found, unauthorized)] == [200, 404, 401]
    for r in (ok, not_found, unauthorized):
        assert _has_cors(r)
        # One of each, not one per layer that might add it.
        names = [name.lower() for name in r.raw.headers.keys()]
        assert names.count("access-control-allow-origin") == 1


def test_access_log_has_a_line_per_request_at_info(served, caplog):
    caplog.set_level(logging.INFO, logger="weir.access")
    requests.get(served + "/_matrix/client/versions?access_token=secret")
    requests.options(served + "/anything")
    requests.get(served + "/_matrix/client/v3/nothing")
    lines = [r.getMessage() for r in caplog.records if r.name == "weir.access"]
    assert len(lines) == 3
    assert lines[0].startswith("GET /_matrix/client/versions?access_token=<redacted> 200 ")
    assert lines[1].startswith("OPTIONS /anything 204 ")
    assert lines[2].startswith("GET /_matrix/client/v3/nothing 404 ")
    assert all(getattr(r, "request_id", None) for r in caplog.records if r.name == "weir.access")


def test_json_answers_have_their_head_for_get_head_and_errors(served):
    body = requests.get(served + "/_matrix/client/versions")
    head = requests.head(served + "/_matrix/client/versions")
    for r in (body, head):
        assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
        assert r.headers["Content-Length"] == str(len(body.content))
    assert "v1.16" in body.json()["versions"] and head.content == b""
    unauthorized = requests.get(served + "/_matrix/client/v3/account/whoami")
    assert unauthorized.status_code == 401 and unauthorized.reason == "UNAUTHORIZED"
    assert unauthorized.json()["errcode"] == "M_MISSING_TOKEN"


def test_a_json_answer_whose_headers_are_read_is_made_from_them():
    # As an after_request hook would: what it changes is what goes out.
    answer = json_response({"a": 1}, 429, {"Retry-After": 3})
    assert answer.status == "429 TOO MANY REQUESTS" and answer.data == b'{"a":1}'
    answer.headers["X-Extra"] = "yes"
    started = []
    sent = b"".join(
        answer({"REQUEST_METHOD": "GET"}, lambda status, headers: started.append((status, headers)))
    )
    assert sent == b'{"a":1}'
    assert started == [
        (
            "429 TOO MANY REQUESTS",
            [
                ("Retry-After", "3"),
                ("Content-Type", "application/json"),
                ("Content-Length", "7"),
                ("X-Extra", "yes"),
            ],
        )
    ]


@pytest.mark.parametrize(
    "body",
    [
        [{"type": "m.room.member", "n": i} for i in range(5000)],  # /state
        {"chunk": [{"n": i} for i in range(5000)]},  # /members
        {"joined": {f"@u{i}:x": {"displayname": None} for i in range(5000)}},
    ],
)
def test_a_long_json_answer_lets_the_hub_run_while_it_is_encoded(body):
    """A big room's /state or /members: another greenlet runs while it is encoded, and
    the text is what the one encoder gives; a short answer is encoded in one go."""
    ran: list[int] = []
    gevent.spawn(ran.append, 1)
    answer = json_response(body)
    assert ran == [1]
    assert answer.data == json.dumps(body, separators=(",", ":")).encode()
    gevent.spawn(ran.append, 2)
    json_response({"versions": ["v1.1"] * 20, "unstable_features": {}})
    assert ran == [1]
