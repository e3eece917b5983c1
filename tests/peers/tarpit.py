"""A peer that accepts connections and never answers.

The attack ADR-0079 is about: every client of it waits until its own
deadline. It runs as greenlets in the test process (the tests are
monkey-patched), so a server under test in a subprocess can connect to it
as well. A TLS tarpit is the same thing: it never sends a ServerHello.

    with Tarpit() as tarpit:
        ...connect to ("127.0.0.1", tarpit.port)...
        assert tarpit.wait_accepted(1, timeout=5)
        assert tarpit.wait_current(0, timeout=5)   # the client hung up

It reads (and discards) whatever the client sends, so a client's writes
never block, and so that it sees the client hang up: ``current`` counts
connections the client has not closed yet.

One tarpit may listen on several addresses (``listen``), counting them
together: a swarm of server names, each with an address of its own, is
still one tarpit. Subclasses change what happens on a held connection by
overriding ``serve`` (tests/peers/slow.py: a TLS peer that hangs after the
request, or drips its answer); the accounting stays here.
"""

from __future__ import annotations

import errno
import time

import gevent
from gevent import socket
from gevent.event import Event

__all__ = ["Tarpit"]


class Tarpit:
    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, backlog: int = 1024, *, on_change=None
    ) -> None:
        self.host = host
        self.port = port
        self.backlog = backlog
        self.accepted = 0  # connections accepted, ever
        self.current = 0  # accepted and not yet closed by the client (or by stop())
        self.max_concurrent = 0
        self.bytes_received = 0
        self.bytes_sent = 0  # by subclasses that answer something
        # Called after every change of the counts (several peers summed into one figure).
        self._on_change = on_change
        self._listeners: list[socket.socket] = []
        self._acceptors: list[gevent.Greenlet] = []
        self._holders: set[gevent.Greenlet] = set()
        self._conns: set[socket.socket] = set()
        # Replaced on every change; waiters wait on the one they saw. No
        # polling, and no lost wake-up since nothing switches between a
        # waiter's check and its wait.
        self._changed = Event()

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> Tarpit:
        if self._listeners:
            raise RuntimeError("tarpit already started")
        self.port = self.listen(self.host, self.port)[1]
        return self

    def listen(self, host: str, port: int = 0) -> tuple[str, int]:
        """Holds connections to one more address as well; returns it (port 0: a free one)."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(self.backlog)
        except BaseException:
            sock.close()
            raise
        self._listeners.append(sock)
        self._acceptors.append(gevent.spawn(self._accept_loop, sock))
        return host, sock.getsockname()[1]

    def stop(self) -> None:
        """Stop accepting and close every held connection. Idempotent."""
        gevent.killall(self._acceptors, block=True)
        self._acceptors.clear()
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()
        gevent.killall(list(self._holders), block=True)
        self._holders.clear()
        # A holder killed before it ever ran has no ``finally`` to run.
        for conn in list(self._conns):
            self._forget(conn)

    def __enter__(self) -> Tarpit:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # -- waiting -------------------------------------------------------------

    def wait_until(self, predicate, timeout: float | None = None) -> bool:
        """Wait until ``predicate()`` is true; False if ``timeout`` passed first."""
        end = None if timeout is None else time.monotonic() + timeout
        while not predicate():
            if end is None:
                self._changed.wait()
                continue
            left = end - time.monotonic()
            if left <= 0:
                return False
            self._changed.wait(left)
        return True

    def wait_accepted(self, n: int, timeout: float | None = None) -> bool:
        """Wait until at least ``n`` connections were accepted in all."""
        return self.wait_until(lambda: self.accepted >= n, timeout)

    def wait_current(self, n: int, timeout: float | None = None) -> bool:
        """Wait until at most ``n`` connections are open (clients hung up)."""
        return self.wait_until(lambda: self.current <= n, timeout)

    def counters(self) -> dict:
        return {
            "accepted": self.accepted,
            "current": self.current,
            "max_concurrent": self.max_concurrent,
            "bytes_received": self.bytes_received,
            "bytes_sent": self.bytes_sent,
        }

    def _notify(self) -> None:
        changed, self._changed = self._changed, Event()
        changed.set()
        if self._on_change is not None:
            self._on_change()

    # -- serving -------------------------------------------------------------

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: the connection stays in the backlog,
                    # which is still a tarpit. Try again shortly.
                    gevent.sleep(0.05)
                    continue
                if e.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                raise
            try:
                # Hang-ups that reached us before this connection did are counted first:
                # a client that closes one connection and then opens the next must not
                # look like two at once (the concurrent maximum is what tests judge).
                gevent.idle()
            except BaseException:
                conn.close()
                raise
            self.accepted += 1
            self.current += 1
            if self.current > self.max_concurrent:
                self.max_concurrent = self.current
            self._conns.add(conn)
            holder = gevent.spawn(self._hold, conn)
            self._holders.add(holder)
            self._notify()

    def _hold(self, conn: socket.socket) -> None:
        try:
            self.serve(conn)
        except OSError:
            return  # reset by the client: gone as well
        finally:
            self._holders.discard(gevent.getcurrent())
            self._forget(conn)

    def serve(self, conn: socket.socket) -> None:
        """What a held connection gets: nothing. Returns when the client hangs up."""
        self.discard_until_eof(conn)

    def discard_until_eof(self, conn) -> None:
        while True:
            data = conn.recv(65536)
            if not data:  # EOF: the client closed its end
                return
            self.bytes_received += len(data)

    def _forget(self, conn: socket.socket) -> None:
        # Idempotent: close a held connection and count it as gone.
        if conn in self._conns:
            self._conns.discard(conn)
            conn.close()
            self.current -= 1
            self._notify()

    def __repr__(self) -> str:
        return (
            f"<Tarpit {self.host}:{self.port} accepted={self.accepted}"
            f" current={self.current} max_concurrent={self.max_concurrent}>"
        )
