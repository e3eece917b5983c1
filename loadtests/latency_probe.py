"""Times GET requests to one path on one or more servers from a process of its own, and
prints the milliseconds each took as JSON: a list per server (loadtests/waiting_bench.py
runs it).

    .venv/bin/python -m loadtests.latency_probe PATH COUNT HOST:PORT [HOST:PORT ...]
        [--workers 4] [--block 100] [--authorization 'Bearer ...']

A process of its own so that what it measures carries none of the load generator's state:
the bench's own process holds as many sockets and greenlets as the server, and its pauses
would show in the server's figures.

With several servers, their requests alternate in blocks of `--block` (each block `workers`
keep-alive connections in parallel, then the next server's): whatever the machine does for
longer than a block, a slow spell of its virtual CPU, falls on every server alike, and only
one server works at a time.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import http.client
import json
import sys
import time

import gevent


def block(connections: list, path: str, count: int, headers: dict, samples: list) -> None:
    """`count` requests over `connections` in parallel, their milliseconds to `samples`."""

    def worker(conn):
        for _ in range(count // len(connections)):
            started = time.perf_counter()
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"{path}: {response.status}")
            samples.append((time.perf_counter() - started) * 1000)

    gevent.joinall([gevent.spawn(worker, conn) for conn in connections], raise_error=True)


def latencies(
    addresses: list, path: str, count: int, headers: dict, workers: int, block_size: int
) -> list[list[float]]:
    """Milliseconds per request, `count` for each server, in alternating blocks."""
    connections = [
        [http.client.HTTPConnection(*address, timeout=60) for _ in range(workers)]
        for address in addresses
    ]
    found: list[list[float]] = [[] for _ in addresses]
    for _ in range(0, count, block_size):
        for conns, samples in zip(connections, found):
            block(conns, path, block_size, headers, samples)
    for conns in connections:
        for conn in conns:
            conn.close()
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("count", type=int)
    parser.add_argument("servers", nargs="+", help="HOST:PORT")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--authorization")
    args = parser.parse_args()
    headers = {"Authorization": args.authorization} if args.authorization else {}
    addresses = [(host, int(port)) for host, _, port in (s.rpartition(":") for s in args.servers)]
    found = latencies(addresses, args.path, args.count, headers, args.workers, args.block)
    json.dump(found, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
