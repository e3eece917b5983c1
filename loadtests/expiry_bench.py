"""What a synchronized wave of lookups at a silent peer costs the server's CPU: prints
numbers, judges nothing.

    .venv/bin/python -m loadtests.expiry_bench [--lookups 200] [--deadline 5]

The client outbound budget bounds how many requests wait on silent peers (half the main
pool), not what they cost the one gevent hub when they start, or end, together. An
attacker can line them up: N lookups admitted at once all run out of their deadline at once.
This measures the real server process's CPU (from /proc) for N lookups admitted together
(discovery, connect, TLS hello), for their expiry together (504s), for N refusals (429) and
for N `/versions`, each as a total and per request. While a wave runs, every other request
waits its turn on the hub: a wave of half a large main pool is a visible pause.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import os
import tempfile
import time

import gevent
import requests

from tests.peers.dns import DnsServer
from tests.peers.tarpit import Tarpit
from tests.support.server import WeirProcess, base_settings, merge

IP = "127.60.250.1"  # the load tests' range; every port here is a free one
V3 = "/_matrix/client/v3"


def report(what: str, n: int, cpu: float, wall: float) -> None:
    print(
        f"  {what:<44} {cpu * 1000:8.0f} ms CPU  {cpu * 1000 / n:6.2f} ms each"
        f"  ({wall:5.2f} s wall)"
    )


def measured(server, what: str, n: int, fn) -> None:
    cpu, wall = server.cpu_seconds(), time.monotonic()
    fn()
    report(what, n, server.cpu_seconds() - cpu, time.monotonic() - wall)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lookups", type=int, default=200)
    parser.add_argument(
        "--deadline",
        type=float,
        default=5.0,
        help="federation.remote_timeout, which caps the 10 s deadline",
    )
    args = parser.parse_args()
    n = args.lookups

    directory = tempfile.mkdtemp(prefix="weir-expiry-bench-")
    with Tarpit(IP, 0) as tarpit, DnsServer(IP, 0) as dns:
        # One address per lookup: nothing is shared, nothing cools down.
        ports = [tarpit.port] + [tarpit.listen(IP)[1] for _ in range(n - 1)]
        names = []
        for i, port in enumerate(ports):
            dns.add_a(f"t{i}.expiry.load", IP)
            names.append(f"t{i}.expiry.load:{port}")
        settings = merge(
            base_settings(os.path.join(directory, "data")),
            {
                "server": {
                    "http": {"main_pool_size": 2 * n + 64, "trusted_proxies": ["127.0.0.0/8"]}
                },
                "federation": {
                    "remote_timeout": args.deadline,
                    "dns_nameservers": [dns.nameserver],
                    "ip_range_allowlist": [f"{IP}/32"],
                },
                "logging": {"level": "WARNING"},
            },
        )
        server = WeirProcess(directory, settings).start()
        try:

            def get(path, client, **params):
                return requests.get(
                    server.url(path), params=params, timeout=60, headers={"X-Forwarded-For": client}
                )

            print(
                f"{n} lookups at a tarpit, deadline {args.deadline:g} s, "
                f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
            )
            lookups = []

            def admit():
                lookups.extend(
                    gevent.spawn(
                        get, f"{V3}/publicRooms", f"10.77.{i // 250}.{i % 250}", server=names[i]
                    )
                    for i in range(n)
                )
                if not tarpit.wait_accepted(n, timeout=args.deadline):
                    raise SystemExit("the lookups were not all admitted before their deadline")

            measured(server, "admitted together (discovery, connect)", n, admit)
            gevent.sleep(max(0.0, args.deadline - 1.5))  # just before they expire
            measured(server, "expired together (504)", n, lambda: gevent.joinall(lookups))
            assert all(job.value.status_code == 504 for job in lookups)

            holder = gevent.spawn(get, f"{V3}/publicRooms", "10.78.0.1", server=names[0])
            tarpit.wait_accepted(n + 1, timeout=args.deadline)
            measured(
                server,
                "refused (429, one client over its cap)",
                n,
                lambda: gevent.joinall(
                    [
                        gevent.spawn(get, f"{V3}/publicRooms", "10.78.0.1", server=names[i % n])
                        for i in range(1, n + 1)
                    ]
                ),
            )
            holder.kill()
            measured(
                server,
                "GET /versions (for comparison)",
                n,
                lambda: gevent.joinall(
                    [gevent.spawn(get, "/_matrix/client/versions", "10.79.0.1") for _ in range(n)]
                ),
            )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
