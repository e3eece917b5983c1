"""Remote media figures against a real server process in pool mode: prints numbers, judges
nothing.

    .venv/bin/python -m loadtests.remote_media_bench [--latency 0.3] [--images 10] [--rooms 5]

- Element's first view of a room: every image and its thumbnail from one address over six
  keep-alive connections, from a TLS peer `--latency` seconds away; then the same view again,
  from the cache.
- Several rooms' first views at once, one address each: wall time and request latencies.
- A tarpit origin flooded by nine clients (ten files each) while /versions is timed: what the
  main pool's own requests cost while the media pool is saturated, against an idle server.
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
from tests.support.browser import Connection, burst
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
            flood = [
                gevent.spawn(
                    Connection(server.client_url, source_ip=f"127.49.0.{c + 1}").get,
                    f"{CLIENT}/download/{TARPIT_IP}:8448/{uuid.uuid4().hex}",
                    headers,
                )
                for c in range(9)
                for _ in range(10)
            ]
            tarpit.wait_accepted(16, timeout=10)
            busy = time_versions(server)
            gevent.joinall(flood)
        refused = sum(1 for g in flood if g.value is not None and g.value.status == 429)
        print(
            f"/versions while idle: p50 {percentile(idle, 0.5):.2f} ms, p99 "
            f"{percentile(idle, 0.99):.2f} ms; with 90 requests on a tarpit ({refused} refused "
            f"at once): p50 {percentile(busy, 0.5):.2f} ms, p99 {percentile(busy, 0.99):.2f} ms"
            f" (mean {statistics.mean(busy):.2f} ms)"
        )
    finally:
        server.stop()
        peer.stop()


if __name__ == "__main__":
    main()
