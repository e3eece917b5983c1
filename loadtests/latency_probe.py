"""Times GET requests to one path from a process of its own, and prints the milliseconds each
took as a JSON list (loadtests/waiting_bench.py runs it).

    .venv/bin/python -m loadtests.latency_probe HOST PORT PATH COUNT [--workers 4]
        [--authorization 'Bearer ...']

A process of its own so that what it measures carries none of the load generator's state:
the bench's own process holds as many sockets and greenlets as the server, and its pauses
would show in the server's figures.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import http.client
import json
import sys
import time

import gevent


def latencies(address, path: str, count: int, headers: dict, workers: int) -> list[float]:
    """Milliseconds per request, `workers` keep-alive connections in parallel."""
    samples: list[float] = []

    def worker():
        conn = http.client.HTTPConnection(*address, timeout=60)
        for _ in range(count // workers):
            started = time.perf_counter()
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"{path}: {response.status}")
            samples.append((time.perf_counter() - started) * 1000)
        conn.close()

    gevent.joinall([gevent.spawn(worker) for _ in range(workers)], raise_error=True)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("path")
    parser.add_argument("count", type=int)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--authorization")
    args = parser.parse_args()
    headers = {"Authorization": args.authorization} if args.authorization else {}
    samples = latencies((args.host, args.port), args.path, args.count, headers, args.workers)
    json.dump(samples, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
