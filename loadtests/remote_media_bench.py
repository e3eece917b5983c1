"""Remote media figures against a real server process in pool mode: prints numbers, judges
nothing.

    .venv/bin/python -m loadtests.remote_media_bench [--latency 0.3] [--images 10] [--rooms 5]

- Element's first view of a room: every image and its thumbnail from one address over six
  keep-alive connections, from a TLS peer `--latency` seconds away; then the same view again,
  from the cache.
- Element's screen as a real burst: 10 images and their thumbnails, then 40 and theirs, each
  request on a connection of its own, all sent at once from one address (HTTP/2, or a fresh
  page): wall time, statuses, fetches per file. Target: the 10-image burst under 1 s.
- Several rooms' first views at once, one address each: wall time and request latencies.
- A tarpit origin flooded by nine clients (twenty distinct files each) while /versions is
  timed: what the main pool's own requests cost while the media pool is saturated, against an
  idle server; and how fast the requests past the caps are refused (target: under 100 ms).
"""

from gevent import monkey

monkey.patch_all()

import argparse
import os
import statistics
import tempfile
import time
import uuid

import gevent

from tests.media.images import solid
from tests.peers.honest import HonestPeer
from tests.peers.tarpit import Tarpit
from tests.support.browser import Connection, at_once, burst
from tests.support.federation import federation_settings
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge
from tests.support.tls import TestCA

CLIENT = "/_matrix/client/v1/media"
PEER_IP = "127.47.0.1"
TARPIT_IP = "127.47.0.2"


def room_view(peer: HonestPeer, images: int) -> list[str]:
    """The requests of one room's first view: each image next to its thumbnail."""
    paths = []
    for i in range(images):
        media_id = uuid.uuid4().hex
        peer.serve_media(
            media_id, solid(400 + i, 300, "PNG", color=(i * 20 % 255, 90, 160)), "image/png"
        )
        paths += [
            f"{CLIENT}/download/{peer.server_name}/{media_id}",
            f"{CLIENT}/thumbnail/{peer.server_name}/{media_id}?width=96&height=96&method=crop",
        ]
    return paths


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


def time_versions(server: WeirProcess, n: int = 200) -> list[float]:
    conn = Connection(server.client_url)
    try:
        times = []
        for _ in range(n):
            started = time.perf_counter()
            assert conn.get("/_matrix/client/versions").status == 200
            times.append((time.perf_counter() - started) * 1000)
        return times
    finally:
        conn.close()


def tarpit_flood(server: WeirProcess, headers: dict) -> list:
    """Nine clients, twenty distinct files each, every request on its own connection, sent
    together; each greenlet's value is (status, milliseconds)."""
    connections = [
        Connection(server.client_url, source_ip=f"127.49.0.{c + 1}")
        for c in range(9)
        for _ in range(20)
    ]
    for conn in connections:
        conn.connect()

    def one(conn: Connection) -> tuple[int, float]:
        started = time.perf_counter()
        try:
            result = conn.get(f"{CLIENT}/download/{TARPIT_IP}:8448/{uuid.uuid4().hex}", headers)
        finally:
            conn.close()
        return result.status, (time.perf_counter() - started) * 1000

    return [gevent.spawn(one, conn) for conn in connections]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.3, help="peer latency, seconds")
    parser.add_argument("--images", type=int, default=10, help="images in a room")
    parser.add_argument("--rooms", type=int, default=5, help="rooms viewed at once")
    args = parser.parse_args()

    directory = tempfile.mkdtemp(prefix="weir-remote-media-bench-")
    ca = TestCA(os.path.join(directory, "ca"))
    settings = merge(
        base_settings(os.path.join(directory, "data")),
        {"federation": federation_settings(ca, remote_timeout=10)},
    )
    peer = HonestPeer(f"{PEER_IP}:8448", ca, host=PEER_IP, port=8448, latency=args.latency).start()
    server = WeirProcess(directory, settings).start()
    try:
        client = MatrixClient(server.client_url)
        client.register("bench")
        headers = {"Authorization": f"Bearer {client.token}"}

        paths = room_view(peer, args.images)
        started = time.perf_counter()
        results = burst(server.client_url, paths, 6, headers)
        first = time.perf_counter() - started
        assert all(r.status == 200 for r in results)
        fetches = peer.media_fetches()
        started = time.perf_counter()
        burst(server.client_url, paths, 6, headers)
        cached = time.perf_counter() - started
        print(
            f"Element first view, {args.images} images + thumbnails, peer "
            f"{args.latency * 1000:.0f} ms away: {first:.2f} s ({fetches} fetches); "
            f"again from the cache: {cached:.3f} s"
        )

        for images in (10, 40):
            screen = room_view(peer, images)
            before = peer.media_fetches()
            started = time.perf_counter()
            results = at_once(server.client_url, screen, headers, source_ip="127.48.1.1")
            wall = time.perf_counter() - started
            statuses = sorted({r.status for r in results})
            print(
                f"Element's screen at once, {images} images + thumbnails on {len(screen)} "
                f"connections: {wall:.2f} s wall, statuses {statuses}, "
                f"{peer.media_fetches() - before} fetches"
            )

        views = [room_view(peer, args.images) for _ in range(args.rooms)]
        started = time.perf_counter()
        jobs = [
            gevent.spawn(burst, server.client_url, view, 6, headers, f"127.48.0.{i + 1}")
            for i, view in enumerate(views)
        ]
        gevent.joinall(jobs, raise_error=True)
        wall = time.perf_counter() - started
        latencies = [(r.finished - started) * 1000 for job in jobs for r in job.value]
        print(
            f"{args.rooms} first views at once ({args.rooms * len(paths)} requests, "
            f"{args.rooms} addresses): {wall:.2f} s wall; finished after p50 "
            f"{percentile(latencies, 0.5):.0f} ms, p95 {percentile(latencies, 0.95):.0f} ms"
        )

        idle = time_versions(server)
        with Tarpit(TARPIT_IP, 8448) as tarpit:
            flood = tarpit_flood(server, headers)
            tarpit.wait_accepted(16, timeout=10)
            busy = time_versions(server)
            gevent.joinall(flood)
        refusals = [g.value[1] for g in flood if g.value[0] == 429]
        print(
            f"/versions while idle: p50 {percentile(idle, 0.5):.2f} ms, p99 "
            f"{percentile(idle, 0.99):.2f} ms; with 180 requests on a tarpit: p50 "
            f"{percentile(busy, 0.5):.2f} ms, p99 {percentile(busy, 0.99):.2f} ms"
            f" (mean {statistics.mean(busy):.2f} ms)"
        )
        print(
            f"{len(refusals)} of 180 refused with 429: p50 {percentile(refusals, 0.5):.1f} ms,"
            f" p99 {percentile(refusals, 0.99):.1f} ms, slowest {max(refusals):.1f} ms"
        )
    finally:
        server.stop()
        peer.stop()


if __name__ == "__main__":
    main()
