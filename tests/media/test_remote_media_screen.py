"""A screen of remote images against the real server process in pool mode: every request of
a browser's burst is served, and the per-client caps still hold against a tarpit
(homeserver/http/handoff.py, budget/queued.py).

Each request here has a connection of its own, all opened first and then sent together, as
Element fires a screen's images over HTTP/2 or on a fresh page. Loopback source addresses
are distinct clients.
"""

import io
import time

import gevent
import pytest
import requests
from gevent.event import Event
from PIL import Image

from tests.media.images import solid
from tests.media.test_remote_media import (
    CLIENT,
    LEGACY,
    assert_budgets_back_to_zero,
    auth,
    new_id,
    weir_settings,
)
from tests.peers.tarpit import Tarpit
from tests.support.browser import Connection, at_once
from tests.support.metrics import in_flight, metric, wait_for_metric
from tests.support.server import MatrixClient, WeirProcess

PER_CLIENT, QUEUED_PER_CLIENT, TOTAL, THREADS = 8, 32, 64, 16  # the defaults
REMOTE_TIMEOUT = 7  # under the 10 s connect cap, so the deadline is what a tarpit hits


@pytest.fixture(scope="module")
def weir(test_ca, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-remote-screen"))
    settings = weir_settings(test_ca, directory)
    settings["federation"]["remote_timeout"] = REMOTE_TIMEOUT
    proc = WeirProcess(directory, settings).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def token(weir) -> str:
    return MatrixClient(weir.client_url).register("screen")["access_token"]


def screen(peer, images: int) -> tuple[dict[str, bytes], list[str]]:
    """`images` files on the peer, and a screen's requests: each image and its thumbnail."""
    files = {
        new_id(): solid(300 + i, 200, "PNG", color=(6 * i % 255, 80, 160)) for i in range(images)
    }
    paths = []
    for media_id, data in files.items():
        peer.serve_media(media_id, data, "image/png", f"{media_id}.png")
        paths += [
            f"{CLIENT}/download/{peer.server_name}/{media_id}",
            f"{CLIENT}/thumbnail/{peer.server_name}/{media_id}?width=96&height=96&method=crop",
        ]
    return files, paths


def test_elements_screen_as_a_real_burst(weir, token, start_peer):
    """10 images with their thumbnails, then 40, from one address, all at once, from a peer
    300 ms away: every request is served, from one fetch per file."""
    peer = start_peer("127.44.10.1:8448", "127.44.10.1", latency=0.3)
    for images in (10, 40):
        files, paths = screen(peer, images)
        started = time.monotonic()
        results = at_once(weir.client_url, paths, auth(token), source_ip="127.45.10.1")
        wall = time.monotonic() - started
        print(f"\n{images} images and their thumbnails at once, peer 300 ms away: {wall:.2f} s")

        assert [r.status for r in results] == [200] * len(paths), [
            r.body[:200] for r in results if r.status != 200
        ]
        for media_id, download, thumbnail in zip(files, results[0::2], results[1::2]):
            assert download.body == files[media_id]
            assert Image.open(io.BytesIO(thumbnail.body)).size == (96, 96)
            assert peer.media_fetches(media_id) == 1
    assert_budgets_back_to_zero(weir)


class Fired:
    """Requests from one client address, one connection each, sent together; outcomes
    collected as they come back."""

    def __init__(self, weir, client: int, n: int, path, headers: dict):
        self.client = client
        self.outcomes: list[tuple[int, float, object]] = []  # (status, seconds, result)
        self.refused = Event()
        self._refusals_expected = 0
        connections = [
            Connection(weir.client_url, source_ip=f"127.45.0.{client + 1}") for _ in range(n)
        ]
        for conn in connections:
            conn.connect()
        self.connections = connections
        self.jobs = [gevent.spawn(self._one, conn, path(), headers) for conn in connections]

    def _one(self, conn: Connection, path: str, headers: dict) -> None:
        started = time.monotonic()
        try:
            result = conn.get(path, headers)
        finally:
            conn.close()
        self.outcomes.append((result.status, time.monotonic() - started, result))
        if self.count(429) >= self._refusals_expected > 0:
            self.refused.set()

    def count(self, status: int) -> int:
        return sum(1 for s, _, _ in self.outcomes if s == status)

    def wait_refusals(self, n: int, timeout: float) -> None:
        """Until `n` of them were refused."""
        self._refusals_expected = n
        if self.count(429) < n:
            assert self.refused.wait(timeout), self.outcomes


def test_caps_against_a_tarpit(weir, token):
    """Nine clients fire distinct files at a peer that never answers. One client's 45: 8 run,
    32 queue behind them, 5 are refused at once. The others', 20 each: running and queued up
    to 64 fetches in all, the rest refused at once. No client runs more than 8 fetches, the
    tarpit never holds more than `media_fetch_threads` connections, local requests are
    served meanwhile, and every budget and queue is back to zero after the deadline."""
    headers = auth(token)
    with Tarpit("127.44.2.1", 8448) as tarpit:

        def path() -> str:
            return f"{CLIENT}/download/127.44.2.1:8448/{new_id()}"

        local = MatrixClient(weir.client_url, token).post(
            f"{LEGACY}/upload", data=b"local bytes", headers={"Content-Type": "text/plain"}
        )
        local_path = f"{CLIENT}/download/{local.json()['content_uri'][6:]}"

        first = Fired(weir, 0, 45, path, headers)
        first.wait_refusals(45 - PER_CLIENT - QUEUED_PER_CLIENT, timeout=REMOTE_TIMEOUT / 2)
        wait_for_metric(weir.client_url, "weir_budget_queued", 32, budget="media_fetch")
        assert tarpit.wait_accepted(PER_CLIENT, timeout=5)
        # The queued 32 wait for the client's own running fetches, not for free pool places.
        assert metric(weir.client_url, "weir_pool_greenlets", pool="media") == PER_CLIENT
        assert tarpit.current == PER_CLIENT

        second = Fired(weir, 1, 20, path, headers)
        wait_for_metric(weir.client_url, "weir_budget_queued", 44, budget="media_fetch")
        assert tarpit.wait_accepted(THREADS, timeout=5)

        # 60 fetches held: 4 more fit under the global cap, 136 are refused at once.
        rest = [Fired(weir, c, 20, path, headers) for c in range(2, 9)]
        with gevent.Timeout(REMOTE_TIMEOUT / 2, AssertionError("refusals were not at once")):
            while sum(f.count(429) for f in rest) < 7 * 20 - (TOTAL - 60):
                gevent.sleep(0.02)
        assert in_flight(weir.client_url, "media_fetch") == TOTAL
        assert metric(weir.client_url, "weir_pool_greenlets", pool="media") == THREADS
        # Requests that never leave the server are served meanwhile.
        assert requests.get(weir.url("/_matrix/client/versions"), timeout=10).status_code == 200
        served = requests.get(weir.url(local_path), headers=headers, timeout=10)
        assert (served.status_code, served.content) == (200, b"local bytes")
        everyone = [first, second, *rest]
        # Every refusal came back while the admitted requests were still waiting.
        assert all(status == 429 for f in everyone for status, _, _ in f.outcomes)

        gevent.joinall([job for f in everyone for job in f.jobs], raise_error=True)
        assert tarpit.max_concurrent <= THREADS

    refusals = [(seconds, r) for f in everyone for s, seconds, r in f.outcomes if s == 429]
    slowest = max(seconds for seconds, _ in refusals)
    print(f"\n{len(refusals)} refusals, the slowest after {slowest * 1000:.0f} ms")
    assert len(refusals) == 5 + 136
    for _, result in refusals:
        assert result.json()["errcode"] == "M_LIMIT_EXCEEDED"
        assert result.headers["retry-after"] == "1"
    admitted = [(f.client, r) for f in everyone for s, _, r in f.outcomes if s != 429]
    assert len(admitted) == TOTAL
    assert sum(1 for c, _ in admitted if c == 0) == PER_CLIENT + QUEUED_PER_CLIENT
    # Parked until the deadline, which covers the queues for a turn and a pool place too.
    assert {(r.status, r.json()["errcode"]) for _, r in admitted} == {(504, "M_UNKNOWN")}, {
        (r.status, r.body) for _, r in admitted
    }
    assert_budgets_back_to_zero(weir)
