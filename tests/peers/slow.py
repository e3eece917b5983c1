"""TLS peers that take a request and then make the client wait: a hang and a slow drip.

Both complete the TLS handshake (with a test-CA certificate for their names) and read the
request head, so the client has done everything right and now waits on the answer:

- ``HangingPeer`` never answers. On port 443 it is the well-known hang: discovery's
  ``/.well-known/matrix/server`` fetch waits on it.
- ``SlowDripPeer`` answers ``200`` with a ``Content-Length`` and then one byte of the body
  every ``interval`` seconds: every read succeeds in time, so per-read timeouts never fire,
  and only a total deadline ends the call.

They are tarpits with another way of holding a connection, so they count the same way
(``accepted``, ``current``, ``max_concurrent``, bytes) and wait the same way::

    with SlowDripPeer(test_ca, ("drip.test",), host="127.60.0.1", port=8448, interval=0.5) as drip:
        ... a request to drip.test:8448 ...
        assert drip.wait_current(0, timeout=5)   # the client gave up and closed
"""

from __future__ import annotations

import ssl

import gevent

from tests.peers.tarpit import Tarpit

__all__ = ["HangingPeer", "SlowDripPeer"]

# The request head is read up to this; a client sending more is not what these peers model.
MAX_HEAD_BYTES = 64 * 1024
HANDSHAKE_SECONDS = 30.0


class HangingPeer(Tarpit):
    def __init__(
        self, ca, names: tuple[str, ...], host: str = "127.0.0.1", port: int = 0, **kwargs
    ):
        super().__init__(host, port, **kwargs)
        # The certificate covers the names and the address, as an honest server's would.
        self._tls = ca.server_context(*names, host)
        self.requests = 0  # request heads read in full

    def serve(self, conn) -> None:
        with self._tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False) as tls:
            try:
                with gevent.Timeout(HANDSHAKE_SECONDS):
                    tls.do_handshake()
            except (ssl.SSLError, gevent.Timeout):
                return
            if not self._read_head(tls):
                return
            self.requests += 1
            self._notify()
            self.answer(tls)

    def answer(self, tls) -> None:
        """Nothing, until the client hangs up."""
        self.discard_until_eof(tls)

    def _read_head(self, tls) -> bool:
        head = b""
        while b"\r\n\r\n" not in head:
            data = tls.recv(4096)
            if not data or len(head) > MAX_HEAD_BYTES:
                return False
            head += data
            self.bytes_received += len(data)
        return True

    def counters(self) -> dict:
        return {**super().counters(), "requests": self.requests}


class SlowDripPeer(HangingPeer):
    def __init__(
        self,
        ca,
        names: tuple[str, ...],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        interval: float = 2.0,
        body_bytes: int = 4096,
        **kwargs,
    ):
        super().__init__(ca, names, host, port, **kwargs)
        self.interval = interval
        self.body_bytes = body_bytes

    def answer(self, tls) -> None:
        tls.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % self.body_bytes
        )
        # A JSON-looking body, one byte at a time; the client closes long before the end.
        body = (b'{"chunk": [' + b" " * self.body_bytes)[: self.body_bytes - 2] + b"]}"
        tls.settimeout(self.interval)
        for i in range(self.body_bytes):
            tls.sendall(body[i : i + 1])
            self.bytes_sent += 1
            # Wait for the next byte's turn by reading: a client that hangs up meanwhile is
            # seen at once, not at the next write.
            try:
                while True:
                    data = tls.recv(4096)
                    if not data:
                        return
                    self.bytes_received += len(data)
            except TimeoutError:
                pass
