"""A latency probe in a process of its own: a GET of one path on a fresh connection every
INTERVAL milliseconds until a line arrives on stdin, then the requests as JSON, each
``[started, milliseconds]`` (``started`` by ``time.monotonic()``, the system-wide clock, so
the caller can keep the requests of a time window). loadtests/big_room_bench.py runs it.

    .venv/bin/python -m loadtests.stall_probe URL PATH INTERVAL_MS

A fresh connection each time, so a request waits for the server's accept as a new client
would; a process of its own, so the caller's pauses are not in its figures. No gevent: one
request at a time, the next one INTERVAL after the last one started, or at once if late.
"""

import http.client
import json
import select
import sys
import time
import urllib.parse


def probe(host: str, port: int, path: str, interval: float) -> list[list[float]]:
    samples: list[list[float]] = []
    next_at = time.monotonic()
    # select() on stdin is the pause between requests, and the stop signal.
    while not select.select([sys.stdin], [], [], max(0.0, next_at - time.monotonic()))[0]:
        started = time.monotonic()
        conn = http.client.HTTPConnection(host, port, timeout=60)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
        finally:
            conn.close()
        if response.status != 200:
            raise RuntimeError(f"{path}: {response.status}")
        samples.append([started, (time.monotonic() - started) * 1000])
        next_at = started + interval
    return samples


def main() -> int:
    url, path, interval_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
    parts = urllib.parse.urlsplit(url)
    print("started", flush=True)
    samples = probe(parts.hostname, parts.port, path, interval_ms / 1000)
    print(json.dumps(samples), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
