"""The load test's federation peers, in a process of their own.

    python -m loadtests.peers [--ip auto] [--tarpit-addresses 64] [--names-per-address 4]
                              [--drip-interval 2] [--honest-latency 0.2] [--counters PATH]

Everything listens on one loopback address (``--ip``; ``auto`` picks a free one in
127.60.0.0/16, which is ours on this machine, below 127.60.200.0), on free ports except the
well-known hang, which must be on 443:

- a TLS tarpit (tests/peers/tarpit.py): accepts and never answers, not even the TLS
  handshake. It listens on ``--tarpit-addresses`` ports: the address cool-down is per
  (ip, port), so each port is another address an attacker can aim at.
- a slow-drip peer (tests/peers/slow.py): answers the head, then a byte of the body every
  ``--drip-interval`` seconds, which no per-read timeout catches.
- a well-known hang on 443: completes TLS, reads the well-known request, never answers.
- an honest slow peer (tests/peers/honest.py and directory.py): keys, public rooms, an
  alias, and images over federation media (a set per phase, so that each phase's first
  views miss Weir's cache), each answer ``--honest-latency`` seconds late.
- a loopback DNS server (tests/peers/dns.py) that points many names at the tarpit, the
  drip and the hang; a hang name's SRV record sends whoever gets past the well-known to a
  tarpit port.

It prints ``peers ready {json}`` once serving: the DNS server, the CA file, the address to
allow, and the server names of each kind. ``SIGUSR1`` prints ``counters {json}`` (every
peer's accepted connections, concurrent maximum, bytes; and the maximum of the three silent
peers' connections summed, which is what the budgets bound). ``SIGTERM`` prints them once
more, writes them to ``--counters`` if given, and exits.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import errno
import io
import json
import os
import random
import signal
import sys
import tempfile

import gevent
from gevent.event import Event
from PIL import Image

from tests.peers.directory import room, serve_directory
from tests.peers.dns import DnsServer
from tests.peers.honest import HonestPeer
from tests.peers.slow import HangingPeer, SlowDripPeer
from tests.peers.tarpit import Tarpit
from tests.support.tls import TestCA

# Loopback addresses of this machine that the load test may take (the others belong to
# other test suites running beside it); 127.60.200.0 and up are left to fixed-address tests.
OUR_RANGE = (60, 0, 0)  # 127.60.0.0/16
HANG_PORT = 443  # where discovery looks for /.well-known/matrix/server
DRIP_NAMES = 64
HANG_NAMES = 64
HONEST_ROOMS = 25
HONEST_IMAGES = 40  # per phase
PHASES = ("baseline", "attack")

TARPIT_DOMAIN = "tarpit.load"
DRIP_DOMAIN = "drip.load"
HANG_DOMAIN = "hang.load"
HONEST_HOST = "honest.load"


class LoadPeers:
    def __init__(
        self,
        directory: str,
        ip: str,
        *,
        tarpit_addresses: int,
        names_per_address: int,
        drip_interval: float,
        honest_latency: float,
    ):
        self.directory = directory
        self.ip = ip
        self.tarpit_addresses = tarpit_addresses
        self.names_per_address = names_per_address
        self.drip_interval = drip_interval
        self.honest_latency = honest_latency
        self.silent_current = 0
        self.silent_max_concurrent = 0
        self._silent: list[Tarpit] = []

    def start(self) -> dict:
        ca = TestCA(os.path.join(self.directory, "ca"))
        # The hang first: port 443 is the one that may be taken.
        self.hang = HangingPeer(
            ca, (f"*.{HANG_DOMAIN}",), self.ip, HANG_PORT, on_change=self._count_silent
        ).start()
        self.tarpit = Tarpit(self.ip, 0, on_change=self._count_silent).start()
        tarpit_ports = [self.tarpit.port] + [
            self.tarpit.listen(self.ip)[1] for _ in range(self.tarpit_addresses - 1)
        ]
        self.drip = SlowDripPeer(
            ca,
            (f"*.{DRIP_DOMAIN}",),
            self.ip,
            0,
            interval=self.drip_interval,
            on_change=self._count_silent,
        ).start()
        self._silent = [self.tarpit, self.drip, self.hang]

        self.honest = HonestPeer(
            HONEST_HOST, ca, self.ip, 0, cert_names=(HONEST_HOST,), latency=self.honest_latency
        ).start()
        # Its port is known only now, and it is part of its server name.
        self.honest.server_name = f"{HONEST_HOST}:{self.honest.port}"
        rooms = [
            room(f"!r{i}:{HONEST_HOST}", f"Honest room {i}", 100 - i, topic="load test")
            for i in range(HONEST_ROOMS)
        ]
        serve_directory(
            self.honest, rooms, aliases={f"#lobby:{self.honest.server_name}": rooms[0]["room_id"]}
        )
        images = {phase: [f"{phase}-{i}" for i in range(HONEST_IMAGES)] for phase in PHASES}
        for n, media_id in enumerate(m for ids in images.values() for m in ids):
            self.honest.serve_media(media_id, photo(n), "image/png", f"{media_id}.png")

        self.dns = DnsServer(self.ip, 0).start()
        self.dns.add_a(HONEST_HOST, self.ip)
        tarpit_names = []
        for i, port in enumerate(tarpit_ports):
            for j in range(self.names_per_address):
                host = f"t{i}-{j}.{TARPIT_DOMAIN}"
                self.dns.add_a(host, self.ip)
                tarpit_names.append(f"{host}:{port}")
        drip_names = []
        for j in range(DRIP_NAMES):
            host = f"d{j}.{DRIP_DOMAIN}"
            self.dns.add_a(host, self.ip)
            drip_names.append(f"{host}:{self.drip.port}")
        hang_names = []
        for j in range(HANG_NAMES):
            host = f"h{j}.{HANG_DOMAIN}"
            self.dns.add_a(host, self.ip)
            # Past the hanging well-known, discovery finds a tarpit port through SRV.
            i = j % len(tarpit_ports)
            self.dns.add_srv(f"_matrix-fed._tcp.{host}", f"t{i}-0.{TARPIT_DOMAIN}", tarpit_ports[i])
            hang_names.append(host)
        return {
            "ip": self.ip,
            "dns": self.dns.nameserver,
            "ca_file": ca.ca_path,
            "allow": f"{self.ip}/32",
            "targets": {"tarpit": tarpit_names, "drip": drip_names, "hang": hang_names},
            "honest": self.honest.server_name,
            "honest_alias": f"#lobby:{self.honest.server_name}",
            "honest_images": images,
        }

    def _count_silent(self) -> None:
        self.silent_current = sum(p.current for p in self._silent)
        self.silent_max_concurrent = max(self.silent_max_concurrent, self.silent_current)

    def counters(self) -> dict:
        honest_hits: dict[str, int] = {}
        for seen in self.honest.requests:
            path = seen.path.rsplit("/", 1)[0] + "/*" if "/media/" in seen.path else seen.path
            honest_hits[path] = honest_hits.get(path, 0) + 1
        return {
            "tarpit": self.tarpit.counters(),
            "drip": self.drip.counters(),
            "hang": self.hang.counters(),
            "silent_combined": {
                "current": self.silent_current,
                "max_concurrent": self.silent_max_concurrent,
            },
            "honest": {"requests": len(self.honest.requests), "by_path": honest_hits},
            "dns": {"queries": self.dns.total_queries},
        }

    def stop(self) -> None:
        for peer in (self.tarpit, self.drip, self.hang, self.honest, self.dns):
            peer.stop()


def photo(n: int) -> bytes:
    """A small PNG that Weir can thumbnail, different for each n."""
    image = Image.new("RGB", (640, 480), ((n * 37) % 256, (n * 91) % 256, (n * 53) % 256))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def pick_ip() -> str:
    """A free address in our range: one whose port 443 nobody holds."""
    for _ in range(100):
        ip = f"127.{OUR_RANGE[0]}.{random.randint(1, 199)}.{random.randint(1, 254)}"
        probe = gevent.socket.socket()
        try:
            probe.bind((ip, HANG_PORT))
            return ip
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
        finally:
            probe.close()
    raise RuntimeError("no free address with port 443 in 127.60.0.0/16")


def print_table(counters: dict, out) -> None:
    print("peer      accepted  max concurrent  bytes in  bytes out", file=out)
    for name in ("tarpit", "drip", "hang"):
        c = counters[name]
        print(
            f"{name:<8}  {c['accepted']:>8}  {c['max_concurrent']:>14}  "
            f"{c['bytes_received']:>8}  {c['bytes_sent']:>9}",
            file=out,
        )
    print(
        f"silent peers together: max concurrent {counters['silent_combined']['max_concurrent']}",
        file=out,
    )
    print(
        f"honest peer: {counters['honest']['requests']} requests; "
        f"DNS: {counters['dns']['queries']} queries",
        file=out,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--ip", default="auto", help="loopback address to listen on")
    parser.add_argument(
        "--tarpit-addresses",
        type=int,
        default=64,
        help="ports the tarpit listens on (each a separate address)",
    )
    parser.add_argument(
        "--names-per-address", type=int, default=4, help="server names pointing at each tarpit port"
    )
    parser.add_argument(
        "--drip-interval",
        type=float,
        default=2.0,
        help="seconds between two bytes of the slow drip",
    )
    parser.add_argument(
        "--honest-latency",
        type=float,
        default=0.2,
        help="seconds the honest peer waits before each answer",
    )
    parser.add_argument("--directory", default=None, help="where the test CA is written")
    parser.add_argument("--counters", default=None, help="JSON file written at exit")
    args = parser.parse_args(argv)

    directory = args.directory or tempfile.mkdtemp(prefix="weir-load-peers-")
    ip = pick_ip() if args.ip == "auto" else args.ip
    peers = LoadPeers(
        directory,
        ip,
        tarpit_addresses=args.tarpit_addresses,
        names_per_address=args.names_per_address,
        drip_interval=args.drip_interval,
        honest_latency=args.honest_latency,
    )
    info = peers.start()

    stop = Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(sig, stop.set)
    gevent.signal_handler(
        signal.SIGUSR1, lambda: print("counters", json.dumps(peers.counters()), flush=True)
    )
    print("peers ready", json.dumps(info), flush=True)
    stop.wait()

    counters = peers.counters()
    peers.stop()
    if args.counters:
        with open(args.counters, "w") as f:
            json.dump(counters, f, indent=2)
    print("counters", json.dumps(counters), flush=True)
    print_table(counters, sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
