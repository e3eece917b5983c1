"""The tarpit peer the deadline tests (and later server tests) rely on."""

import subprocess
import sys

import gevent
from gevent import socket

from tests.peers.tarpit import Tarpit


def test_accepts_never_answers_and_counts():
    with Tarpit() as tarpit:
        assert tarpit.port > 0
        clients = [socket.create_connection(tarpit.address) for _ in range(3)]
        assert tarpit.wait_accepted(3, timeout=5)
        assert tarpit.accepted == tarpit.current == tarpit.max_concurrent == 3
        clients[0].sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        clients[0].settimeout(0.05)
        try:
            data = clients[0].recv(1)
        except socket.timeout:
            data = None
        assert data is None  # nothing, not even EOF
        for c in clients[:2]:
            c.close()
        assert tarpit.wait_current(1, timeout=5)  # it noticed the hang-ups
        assert tarpit.max_concurrent == 3 and tarpit.accepted == 3
        assert tarpit.bytes_received > 0
    # stop() closed the last one: the client sees EOF.
    clients[2].settimeout(5)
    assert clients[2].recv(1) == b""
    clients[2].close()
    assert tarpit.current == 0


def test_wait_accepted_times_out_without_connections():
    with Tarpit() as tarpit:
        assert tarpit.wait_accepted(1, timeout=0.01) is False


def test_wakes_a_waiter_without_polling():
    with Tarpit() as tarpit:
        waiter = gevent.spawn(tarpit.wait_accepted, 2, 10)
        gevent.sleep(0)
        a = socket.create_connection(tarpit.address)
        b = socket.create_connection(tarpit.address)
        assert waiter.get(timeout=10) is True
        a.close()
        b.close()


def test_stop_is_idempotent_and_closes_the_listener():
    tarpit = Tarpit().start()
    port = tarpit.port
    tarpit.stop()
    tarpit.stop()
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        refused = False
    except OSError:
        refused = True
    assert refused


def test_stop_with_connections_not_yet_served():
    """stop() right after a burst: every connection is closed and uncounted,
    whether or not its holder greenlet has run yet."""
    tarpit = Tarpit().start()
    clients = [socket.create_connection(tarpit.address) for _ in range(20)]
    assert tarpit.wait_accepted(20, timeout=5)
    tarpit.stop()
    assert tarpit.current == 0
    for c in clients:
        c.close()


def test_a_client_in_another_process():
    with Tarpit() as tarpit:
        code = (
            "import socket, sys\n"
            f"s = socket.create_connection(('127.0.0.1', {tarpit.port}))\n"
            "s.sendall(b'hello')\n"
            "s.settimeout(0.2)\n"
            "try:\n"
            "    s.recv(1); sys.exit(1)\n"
            "except socket.timeout:\n"
            "    sys.exit(0)\n"
        )
        proc = subprocess.Popen([sys.executable, "-c", code])
        assert tarpit.wait_accepted(1, timeout=30)
        assert proc.wait(timeout=30) == 0  # the other process got no answer
        assert tarpit.wait_current(0, timeout=10)  # its exit closed the socket


def test_several_addresses_are_one_tarpit():
    changes = []
    with Tarpit(on_change=lambda: changes.append(1)) as tarpit:
        other = tarpit.listen("127.0.0.1")
        assert other[1] != tarpit.port
        a = socket.create_connection(tarpit.address)
        b = socket.create_connection(other)
        assert tarpit.wait_accepted(2, timeout=5)
        assert tarpit.current == tarpit.max_concurrent == 2 and changes
        a.close()
        b.close()
        assert tarpit.wait_current(0, timeout=5)
    assert socket.socket().connect_ex(other) != 0  # stop() closed every listener


def test_a_client_that_closes_before_reconnecting_is_never_counted_twice():
    """The concurrent maximum is what the load test judges: a hang-up that reached the
    tarpit before the next connection did is counted first."""
    with Tarpit() as tarpit:
        for i in range(30):
            conn = socket.create_connection(tarpit.address)
            assert tarpit.wait_accepted(i + 1, timeout=5)
            conn.close()
        assert tarpit.wait_current(0, timeout=5)
        assert tarpit.max_concurrent == 1
