"""Clients that behave like a browser, for load-shaped tests.

A browser talks HTTP/1.1 over a few keep-alive connections (six per host), handing each
request to the next free connection in page order. `burst` does the same from one source
address, which is one client key to the server; other loopback source addresses (127.x.y.z)
are other clients.

    results = burst(weir.client_url, paths, connections=6, headers=auth)
    assert [r.status for r in results] == [200] * len(paths)
"""

from __future__ import annotations

import http.client
import json
import time
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

import gevent


@dataclass
class Result:
    path: str
    status: int
    headers: dict  # lower-cased names
    body: bytes
    finished: float  # time.monotonic() when the whole body was in

    def json(self):
        return json.loads(self.body)


class Connection:
    """One HTTP/1.1 keep-alive connection, optionally from a given source address."""

    def __init__(self, base_url: str, source_ip: str | None = None, timeout: float = 60):
        parts = urlsplit(base_url)
        self._conn = http.client.HTTPConnection(
            parts.hostname,
            parts.port,
            timeout=timeout,
            source_address=(source_ip, 0) if source_ip else None,
        )

    def connect(self) -> None:
        """Opens the connection now rather than at the first request."""
        self._conn.connect()

    def get(self, path: str, headers: dict | None = None) -> Result:
        self._conn.request("GET", path, headers=headers or {})
        response = self._conn.getresponse()
        body = response.read()
        return Result(
            path,
            response.status,
            {k.lower(): v for k, v in response.getheaders()},
            body,
            time.monotonic(),
        )

    def close(self) -> None:
        self._conn.close()


def burst(
    base_url: str,
    paths: list[str],
    connections: int = 6,
    headers: dict | None = None,
    source_ip: str | None = None,
) -> list[Result]:
    """Every path, in order, over `connections` keep-alive connections working in parallel;
    the results in the order of `paths`."""
    queue = deque(enumerate(paths))
    results: list[Result | None] = [None] * len(paths)

    def work():
        conn = Connection(base_url, source_ip)
        try:
            while queue:
                index, path = queue.popleft()
                results[index] = conn.get(path, headers)
        finally:
            conn.close()

    gevent.joinall([gevent.spawn(work) for _ in range(connections)], raise_error=True)
    return results


def at_once(
    base_url: str,
    paths: list[str],
    headers: dict | None = None,
    source_ip: str | None = None,
) -> list[Result]:
    """Every path on a connection of its own, all connected first and then sent together, as
    a browser on HTTP/2 (or opening a fresh page) fires a screen's images; the results in
    the order of `paths`."""
    connections = [Connection(base_url, source_ip) for _ in paths]
    try:
        for conn in connections:
            conn.connect()
        jobs = [gevent.spawn(c.get, p, headers) for c, p in zip(connections, paths)]
        gevent.joinall(jobs, raise_error=True)
        return [job.value for job in jobs]
    finally:
        for conn in connections:
            conn.close()
