"""A fake application service: a plain HTTP/1.1 listener that records every request and
either answers it (200 `{}`) or, while `hanging`, reads it and never answers, holding the
connection until the homeserver closes it.

    with FakeAppservice() as appservice:
        appservice.hanging = True
        ...
        assert appservice.wait_current(1)          # one connection held, never more
        appservice.hanging = False                 # back: the next attempt is answered
        appservice.wait_for(lambda: len(appservice.answered) == 3)

`answers` maps a path (without its query) to the (status, JSON body) to answer it with;
any other path is answered 200 `{}`. It runs as greenlets in the test process, so the
server under test, in a subprocess, can reach it on loopback. `current` counts connections
open now, `max_current` the most ever open at once; `max_in_flight` the most requests read
and not yet answered (or hung up on) at once.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from gevent.event import Event
from gevent.server import StreamServer

__all__ = ["FakeAppservice", "Received"]


@dataclass
class Received:
    method: str
    path: str
    headers: dict
    body: dict | None


class FakeAppservice:
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.hanging = False
        self.answers: dict[str, tuple[int, object]] = {}
        self.received: list[Received] = []  # every request read, answered or not
        self.answered: list[Received] = []
        self.current = 0
        self.max_current = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._changed = Event()
        self._server = StreamServer((host, port), self._serve)
        self._server.init_socket()
        self.host, self.port = host, self._server.server_port
        self.url = f"http://{host}:{self.port}"

    def __enter__(self) -> FakeAppservice:
        self._server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._server.stop(timeout=1)

    def wait_for(self, condition, timeout: float = 20) -> bool:
        """Waits until `condition()` holds (re-checked whenever a request or connection
        changes), or the timeout passes."""
        deadline = time.monotonic() + timeout
        while not condition():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._changed.clear()
            if not condition():
                self._changed.wait(left)
        return True

    def transactions(self, answered: bool = True) -> list[Received]:
        seen = self.answered if answered else self.received
        return [r for r in seen if r.path.startswith("/_matrix/app/v1/transactions/")]

    def _note(self) -> None:
        self._changed.set()

    def _serve(self, sock, _address) -> None:
        self.current += 1
        self.max_current = max(self.max_current, self.current)
        self._note()
        reader = sock.makefile("rb")
        try:
            while True:
                request = self._read(reader)
                if request is None:
                    return
                self.received.append(request)
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                self._note()
                try:
                    if not self._answer(sock, reader, request):
                        return
                finally:
                    self.in_flight -= 1
        except OSError:
            return
        finally:
            reader.close()
            sock.close()
            self.current -= 1
            self._note()

    def _answer(self, sock, reader, request: Received) -> bool:
        """Answers `request`, or while `hanging` waits for the peer to hang up (False)."""
        if self.hanging:
            while reader.read(4096):  # never answer; see the peer hang up
                pass
            return False
        self.answered.append(request)
        self._note()
        status, body = self.answers.get(request.path.partition("?")[0], (200, {}))
        raw = json.dumps(body).encode()
        sock.sendall(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\n\r\n".encode()
            + raw
        )
        return True

    @staticmethod
    def _read(reader) -> Received | None:
        line = reader.readline()
        if not line:
            return None
        method, path, _ = line.decode("latin-1").split(" ", 2)
        headers = {}
        while (header := reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = header.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        raw = reader.read(length) if length else b""
        return Received(method, path, headers, json.loads(raw) if raw else None)
