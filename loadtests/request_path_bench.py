"""Prints what the request path costs per request, in process: µs per `GET /versions` for
a plain WSGI function, bare Flask and Weir, each served by Weir's gevent server.

    .venv/bin/python -m loadtests.request_path_bench [--requests 5000] [--rounds 7]

One keep-alive connection on loopback, one request at a time, from a client greenlet in the
same process: the client's share is the same for all three, so the differences between
the rows are what each layer adds. Best of `--rounds` (the least disturbed by whatever
else the machine runs) and the median. The access log is at WARNING, as in production;
`--log-level INFO` measures it writing.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import logging
import socket
import statistics
import tempfile
import time

from flask import Flask, Response

from homeserver.api.app import create_flask_app
from homeserver.config import parse_config
from homeserver.http.places import WorkPool
from homeserver.http.server import WeirWSGIServer
from homeserver.runtime import HomeserverRuntime

PATH = "/_matrix/client/versions"
BODY = b'{"versions":["v1.11"],"unstable_features":{}}'


def plain_wsgi(environ, start_response):
    start_response(
        "200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(BODY)))]
    )
    return [BODY]


def bare_flask() -> Flask:
    app = Flask("bare")

    @app.get(PATH)
    def versions():
        return Response(BODY, mimetype="application/json")

    return app


def weir_app():
    data_dir = tempfile.mkdtemp(prefix="weir-bench-")
    runtime = HomeserverRuntime(parse_config({"server_name": "bench.test", "data_dir": data_dir}))
    return create_flask_app(runtime)


def read_response(sock, buffered: bytearray) -> bytes:
    """One response with a Content-Length (or none: a 204); what follows stays in
    `buffered`."""
    while True:
        end = buffered.find(b"\r\n\r\n")
        if end >= 0:
            head = bytes(buffered[:end])
            _, _, rest = head.lower().partition(b"content-length:")
            length = int(rest.split(b"\r\n", 1)[0]) if rest else 0
            total = end + 4 + length
            if len(buffered) >= total:
                response = bytes(buffered[:total])
                del buffered[:total]
                return response
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buffered += chunk


def measure(app, requests: int, rounds: int, method: str = "GET") -> list[float]:
    """µs per request, for each round."""
    server = WeirWSGIServer(("127.0.0.1", 0), app, pool=WorkPool(10), keepalive_timeout=30)
    server.start()
    request = (
        f"{method} {PATH} HTTP/1.1\r\nHost: bench\r\nOrigin: https://app.example\r\n\r\n"
    ).encode()
    results = []
    try:
        sock = socket.create_connection(("127.0.0.1", server.server_port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffered = bytearray()
        for _ in range(200):  # warm up
            sock.sendall(request)
            read_response(sock, buffered)
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(requests):
                sock.sendall(request)
                read_response(sock, buffered)
            results.append((time.perf_counter() - started) / requests * 1e6)
        sock.close()
    finally:
        server.stop(timeout=1)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level, handlers=[logging.NullHandler()])

    rows = [
        ("plain WSGI function", plain_wsgi, "GET"),
        ("bare Flask", bare_flask(), "GET"),
        ("Weir", weir_app(), "GET"),
        ("Weir, OPTIONS preflight", weir_app(), "OPTIONS"),
    ]
    print(f"{args.requests} requests down one connection, {args.rounds} rounds; µs/request")
    print(f"{'app':<26}{'best':>8}{'median':>8}{'vs plain':>10}")
    plain = None
    for name, app, method in rows:
        samples = measure(app, args.requests, args.rounds, method)
        best = min(samples)
        plain = plain or best
        print(f"{name:<26}{best:>8.1f}{statistics.median(samples):>8.1f}{best - plain:>+10.1f}")


if __name__ == "__main__":
    main()
