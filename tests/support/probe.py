"""A latency probe in a process of its own: GETs one path on a server over a keep-alive
connection, one request after another, until told to stop, then reports the milliseconds
each took. Its own process, so that what it measures carries none of the test process's
pauses (the test process runs the attackers and the fake peers).

    with LatencyProbe(weir.client_url, "/_matrix/client/versions") as probe:
        ... the attack ...
    assert probe.p99() <= 50
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

_SCRIPT = r"""
import http.client, json, sys, time, urllib.parse, select
url = urllib.parse.urlsplit(sys.argv[1])
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
samples = []
print("started", flush=True)
while not select.select([sys.stdin], [], [], 0)[0]:
    started = time.perf_counter()
    conn.request("GET", sys.argv[2])
    response = conn.getresponse()
    response.read()
    samples.append((time.perf_counter() - started) * 1000)
    time.sleep(0.001)
print(json.dumps(samples), flush=True)
"""


class LatencyProbe:
    def __init__(self, base_url: str, path: str):
        self.base_url = base_url
        self.path = path
        self.samples: list[float] = []
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> LatencyProbe:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SCRIPT, self.base_url, self.path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None and self._proc.stdout.readline() == "started\n"
        return self

    def __exit__(self, *exc) -> None:
        assert self._proc is not None
        out, _ = self._proc.communicate("stop\n", timeout=60)
        self.samples = json.loads(out.strip().splitlines()[-1])

    def p99(self) -> float:
        """The nearest-rank 99th percentile."""
        ordered = sorted(self.samples)
        return ordered[max(0, math.ceil(len(ordered) * 0.99) - 1)]
