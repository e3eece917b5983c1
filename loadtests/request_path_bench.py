"""Prints what the request path costs per request, in process: µs per `GET /versions` for
a plain WSGI function, bare Flask and Weir, each served by Weir's gevent server, and Weir's
authenticated `/account/whoami` and OPTIONS preflight.

    .venv/bin/python -m loadtests.request_path_bench [--requests 5000] [--rounds 7]
                                                     [--log-level INFO] [--log-format text]

One keep-alive connection on loopback, one request at a time, from a client greenlet in the
same process: the client's share is the same for all rows, so the differences between
them are what each layer adds. Best of `--rounds` (the least disturbed by whatever else
the machine runs) and the median, in wall time and in the process's CPU time (which a
busy shared machine disturbs less). The log is configured as the server configures it
(homeserver/logs.py), at INFO by default as in production, writing to a temporary file;
`--log-level WARNING` measures the path without the access log.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import logging
import os
import socket
import statistics
import tempfile
import time
from types import SimpleNamespace

from flask import Flask, Response

from homeserver.api.app import create_flask_app
from homeserver.config import parse_config
from homeserver.http.places import WorkPool
from homeserver.http.server import WeirWSGIServer
from homeserver.logs import ACCESS_LOG, configure_logging
from homeserver.runtime import HomeserverRuntime

PATH = "/_matrix/client/versions"
WHOAMI = "/_matrix/client/v3/account/whoami"
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


def weir_app(with_token: bool = False):
    """Weir's app on a fresh runtime; with a user's access token, if asked."""
    data_dir = tempfile.mkdtemp(prefix="weir-bench-")
    runtime = HomeserverRuntime(
        parse_config(
            {
                "server_name": "bench.test",
                "data_dir": data_dir,
                "database": {"url": f"sqlite:///{data_dir}/homeserver.db"},
            }
        )
    )
    app = create_flask_app(runtime)
    if not with_token:
        return app, None
    return app, runtime.accounts.register("bench", "bench-password").access_token


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


class Target:
    """One app on its own server, and one keep-alive connection to it."""

    def __init__(
        self,
        app,
        method: str = "GET",
        path: str = PATH,
        token: str | None = None,
        access_log: bool = True,
    ):
        # The access log is Weir's, written by its server's handler: the plain and bare rows
        # run without it, as the throughput bench's bare Flask process does.
        self.access_log = access_log
        self.server = WeirWSGIServer(("127.0.0.1", 0), app, pool=WorkPool(10), keepalive_timeout=30)
        self.server.start()
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self.request = (
            f"{method} {path} HTTP/1.1\r\nHost: bench\r\nOrigin: https://app.example\r\n{auth}\r\n"
        ).encode()
        self.sock = socket.create_connection(("127.0.0.1", self.server.server_port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffered = bytearray()
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def run(self, requests: int) -> None:
        for _ in range(requests):
            self.sock.sendall(self.request)
            response = read_response(self.sock, self.buffered)
            if not response.startswith((b"HTTP/1.1 200", b"HTTP/1.1 204")):
                raise RuntimeError(f"{self.request!r}: {response[:40]!r}")

    def round(self, requests: int) -> None:
        """One round: µs per request, in wall time and in the process's CPU time."""
        logging.getLogger(ACCESS_LOG.logger.name).disabled = not self.access_log
        started, started_cpu = time.perf_counter(), time.process_time()
        self.run(requests)
        self.wall.append((time.perf_counter() - started) / requests * 1e6)
        self.cpu.append((time.process_time() - started_cpu) / requests * 1e6)

    def close(self) -> None:
        self.sock.close()
        self.server.stop(timeout=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", default="text", choices=["text", "json"])
    args = parser.parse_args()
    log_file = tempfile.NamedTemporaryFile("w", prefix="weir-bench-", suffix=".log")
    configure_logging(
        SimpleNamespace(level=args.log_level, format=args.log_format), stream=log_file
    )

    weir, _ = weir_app()
    authenticated, token = weir_app(with_token=True)
    targets = {
        "plain WSGI function": Target(plain_wsgi, access_log=False),
        "bare Flask": Target(bare_flask(), access_log=False),
        "Weir": Target(weir),
        "Weir /account/whoami": Target(authenticated, path=WHOAMI, token=token),
        "Weir, OPTIONS preflight": Target(weir, method="OPTIONS"),
    }
    try:
        for target in targets.values():
            target.run(200)  # warm up
        # The targets take turns, so that a disturbance on a shared machine falls on all.
        for _ in range(args.rounds):
            for target in targets.values():
                target.round(args.requests)
    finally:
        for target in targets.values():
            target.close()
    print(
        f"{args.requests} requests down one connection, {args.rounds} rounds; µs/request; "
        f"log at {args.log_level} ({args.log_format}); load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'app':<26}{'best':>8}{'median':>8}{'vs plain':>10}{'cpu best':>10}{'median':>8}")
    plain = targets["plain WSGI function"]
    for name, t in targets.items():
        print(
            f"{name:<26}{min(t.wall):>8.1f}{statistics.median(t.wall):>8.1f}"
            f"{min(t.wall) - min(plain.wall):>+10.1f}{min(t.cpu):>10.1f}"
            f"{statistics.median(t.cpu):>8.1f}"
        )
    log_file.close()


if __name__ == "__main__":
    main()
