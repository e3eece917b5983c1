"""A client that hangs up while its request waits frees what the request held."""

import logging
import socket

import gevent
from gevent.event import Event

from budget import InFlightBudget
from homeserver.http.disconnect import ClientDisconnected, stop_on_client_disconnect
from homeserver.http.places import WorkPool
from homeserver.http.server import WeirWSGIServer


def _server(app):
    server = WeirWSGIServer(("127.0.0.1", 0), app, pool=WorkPool(8), keepalive_timeout=30)
    server.start()
    return server


def test_hang_up_mid_wait_releases_the_slot_and_ends_the_greenlet(caplog):
    caplog.set_level(logging.INFO, logger="weir.access")
    budget = InFlightBudget(4, 1, "test")
    entered, unwound = Event(), Event()
    outcome = []

    def app(environ, start_response):
        slot = budget.try_acquire("client")
        try:
            with slot, stop_on_client_disconnect(environ):
                entered.set()
                Event().wait()  # a remote peer that never answers
        except BaseException as e:
            outcome.append(type(e))
            raise
        finally:
            unwound.set()

    server = _server(app)
    try:
        conn = socket.create_connection(("127.0.0.1", server.server_port))
        conn.sendall(b"GET /publicRooms HTTP/1.1\r\nHost: x\r\n\r\n")
        assert entered.wait(10)
        assert budget.in_flight == 1
        conn.close()
        assert unwound.wait(5)
        assert outcome == [ClientDisconnected]
        assert budget.in_flight == 0
        # The connection's greenlet is gone from the pool too.
        assert server.pool.join(timeout=5)
        # Its access log line says what ended it.
        lines = [r.getMessage() for r in caplog.records if r.name == "weir.access"]
        assert len(lines) == 1 and lines[0].startswith("GET /publicRooms ClientDisconnected ")
    finally:
        server.stop()


def test_a_client_that_stays_is_not_disturbed():
    release = Event()

    def app(environ, start_response):
        with stop_on_client_disconnect(environ):
            release.wait()
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]

    server = _server(app)
    try:
        conn = socket.create_connection(("127.0.0.1", server.server_port))
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        gevent.sleep(0.05)  # room for a false alarm, which would kill the request
        release.set()
        conn.settimeout(10)
        assert conn.recv(1024).startswith(b"HTTP/1.1 200")
        conn.close()
    finally:
        server.stop()


def test_without_a_socket_the_body_just_runs():
    with stop_on_client_disconnect({}):
        done = True
    assert done


def test_a_hang_up_noticed_as_the_block_ends_does_not_reach_the_code_after_it(monkeypatch):
    """The request wakes in the same hub turn as the watcher sees EOF, and runs first: it
    leaves the block before the interruption is delivered. The interruption must then be
    dropped, not raised later in whatever the request does next."""
    from homeserver.http import disconnect

    ours, theirs = socket.socketpair()
    woken = Event()
    real_hang_up = disconnect.HangUpWatch.hang_up

    def hang_up_after_waking_the_request(watch):
        woken.set()  # queued first: the request runs before the interruption is delivered
        real_hang_up(watch)

    monkeypatch.setattr(disconnect.HangUpWatch, "hang_up", hang_up_after_waking_the_request)
    steps = []

    def request():
        with stop_on_client_disconnect({"weir.socket": ours}):
            theirs.close()
            woken.wait()
        steps.append("left the block")
        gevent.sleep(0.01)  # the hub delivers whatever is pending
        steps.append("went on")

    try:
        job = gevent.spawn(request)
        job.join(10)
        assert job.successful(), job.exception
        assert steps == ["left the block", "went on"]
    finally:
        ours.close()
