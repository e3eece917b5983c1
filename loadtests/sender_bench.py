"""Local requests and delivery to a live server while 200 dead members' servers hold the
federation sender: prints numbers, judges nothing.

    .venv/bin/python -m loadtests.sender_bench [--dead 200] [--requests 400] [--messages 10]
        [--died]

Against the real server process (SQLite, default `federation.sender.max_in_flight` 64 and
`remote_timeout` 60 s). A room has one live member's server (a TLS peer recording the
transactions it gets) and `--dead` members whose servers are TLS tarpits: their keys were
fetched while they were up, then their names move to a tarpit on the same port, which
accepts and never answers. Printed:

- /versions and /sync (incremental, timeout 0) p50/p99 at baseline, then while the tarpits
  hold the sender's connections;
- the latency from a message's 200 to its arrival at the live server, p50/p99 and max;
- how many connections the tarpits held at most (never above max_in_flight);
- with `--died`, the room's dead servers answer a message of ours first (they are live when
  they die), and after their first failure: delivery to the live server, the sender's
  slots by lane, and, once 20 of them come back and each sends us a transaction, how long
  each took to get our latest message.

The load generator runs on the same machine: read the figures relative to each other.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import os
import statistics
import tempfile
import time

import gevent
import requests

from tests.peers.dns import DnsServer
from tests.peers.origins import OriginKeyServer, send_transaction
from tests.peers.receiver import TransactionSink
from tests.peers.tarpit import Tarpit
from tests.support.remote_room import RemoteRoom, room_joined_by
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge
from tests.support.tls import TestCA

V3 = "/_matrix/client/v3"


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered) * 1000:7.1f} ms  p99 {p99 * 1000:7.1f} ms"


def local_latencies(weir: WeirProcess, token: str, count: int, lanes: int = 4) -> dict:
    """Seconds per request of /versions and of an incremental /sync, `lanes` at a time."""
    headers = {"Authorization": f"Bearer {token}"}
    since = requests.get(weir.client_url + V3 + "/sync", headers=headers, timeout=30).json()
    results: dict[str, list[float]] = {"/versions": [], "/sync": []}

    def lane():
        session = requests.Session()
        for _ in range(count // lanes):
            for name, url, params in (
                ("/versions", weir.client_url + "/_matrix/client/versions", {}),
                ("/sync", weir.client_url + V3 + "/sync", {"since": since["next_batch"]}),
            ):
                started = time.perf_counter()
                r = session.get(url, params={**params, "timeout": 0}, headers=headers, timeout=30)
                r.raise_for_status()
                results[name].append(time.perf_counter() - started)

    gevent.joinall([gevent.spawn(lane) for _ in range(lanes)], raise_error=True)
    return results


def deliveries(alice, room_id: str, sink, live, count: int, tag: str) -> list[float]:
    """Seconds from each message's 200 to its arrival at the live server."""
    latencies = []
    for i in range(count):
        before = len(sink.pdus(live.name))
        r = alice.put(
            f"{V3}/rooms/{room_id}/send/m.room.message/{tag}{i}",
            json={"msgtype": "m.text", "body": f"{tag}{i}"},
        )
        r.raise_for_status()
        started = time.perf_counter()
        assert sink.wait_pdus(live.name, before + 1, timeout=120), "never delivered"
        latencies.append(time.perf_counter() - started)
    return latencies


def setup_room(weir, ca, dns, keys, alice, live, dead: int) -> tuple[str, list]:
    room = RemoteRoom.create(alice)
    origins = [keys.add_origin(f"dead{i}") for i in range(dead)]
    for i, origin in enumerate([live, *origins]):
        host = origin.name.split(":")[0]
        if origin is not live:
            dns.remove(host)
            dns.add_a(host, keys.host, ttl=1)
        join_id, join = room.join_pdu(origin, "m")
        r = send_transaction(weir.federation_url, origin, "weir.test", f"j{i}", [join], ca)
        assert r.json() == {"pdus": {join_id: {}}}, r.text
    return room.room_id, origins


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dead", type=int, default=200)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--died", action="store_true", help="dead servers answered first")
    args = parser.parse_args()
    ca = TestCA(tempfile.mkdtemp(prefix="weir-sender-bench-ca-"))
    directory = tempfile.mkdtemp(prefix="weir-sender-bench-")
    with (
        DnsServer("127.0.0.1") as dns,
        OriginKeyServer("senderbench.test", ca, dns, host="127.63.1.1") as keys,
    ):
        sink = TransactionSink(keys)
        settings = merge(
            base_settings(os.path.join(directory, "data")),
            {
                "server_name": "weir.test",
                "federation": {
                    "ca_file": ca.ca_path,
                    "dns_nameservers": [dns.nameserver],
                    "ip_range_allowlist": ["127.0.0.0/8"],
                },
                "security": {
                    "federation": {
                        "key_resolution_per_ip_rate": {"max_requests": 10000, "per_seconds": 60}
                    }
                },
                "logging": {"level": "WARNING"},
            },
        )
        weir = WeirProcess(directory, settings).start()
        try:
            run(weir, ca, dns, keys, sink, args)
        finally:
            weir.stop()


def run(weir, ca, dns, keys, sink, args) -> None:
    sink.trust("weir.test", weir.federation_url, ca)
    alice = MatrixClient(weir.client_url)
    alice.register("alice")
    live = keys.add_origin("live")
    warm, _ = room_joined_by(weir, ca, alice, live, localpart="warm")
    print(f"cores: {os.cpu_count()}; {args.dead} dead members, max_in_flight 64, SQLite")
    base = deliveries(alice, warm.room_id, sink, live, args.messages, "warm")
    print(f"{'delivery, no dead members':<38} {percentiles(base)}  max {max(base) * 1000:.1f} ms")
    for name, samples in local_latencies(weir, alice.token, args.requests).items():
        print(f"{name + ', baseline':<38} {percentiles(samples)}")

    room_id, dead = setup_room(weir, ca, dns, keys, alice, live, args.dead)
    if args.died:
        deliveries(alice, room_id, sink, live, 1, "answered")
        assert sink.wait_until(lambda: all(sink.pdus(o.name) for o in dead), timeout=300)
    with Tarpit("127.63.2.1", keys.port) as tarpit:
        for origin in dead:
            point(dns, origin, tarpit.host, ttl=1)
        gevent.sleep(1.5)  # the old answers were cached for 1 s
        if args.died:  # their first failure makes them unproven
            failures = sender_figure(weir, "weir_federation_transactions_total")
            deliveries(alice, room_id, sink, live, 1, "prime")
            while sender_figure(weir, "weir_federation_transactions_total") < failures + len(dead):
                gevent.sleep(0.5)
        held = deliveries(alice, room_id, sink, live, args.messages, "held")
        lanes = {
            lane: sender_figure(weir, f"weir_federation_sender_{lane}_in_flight")
            for lane in ("live", "unproven")
        }
        print(f"{'sender slots in flight by lane, after':<38} {lanes}")
        # (After their first failure the dead back off: held now or not, they were tried.)
        assert tarpit.current > 0 or args.died, "the tarpits hold nothing: nothing measured"
        label = "delivery, dead members held"
        print(f"{label:<38} {percentiles(held)}  max {max(held) * 1000:.1f} ms")
        for name, samples in local_latencies(weir, alice.token, args.requests).items():
            print(f"{name + ', tarpits held':<38} {percentiles(samples)}")
        print(
            f"tarpit connections: held now {tarpit.current}, at most {tarpit.max_concurrent},"
            f" accepted {tarpit.accepted}"
        )
        if args.died:
            revivals(weir, ca, dns, keys, sink, dead[:20], f"held{args.messages - 1}")


def point(dns, origin, ip: str, ttl: int) -> None:
    host = origin.name.split(":")[0]
    dns.remove(host)
    dns.add_a(host, ip, ttl=ttl)


def sender_figure(weir, name: str) -> float:
    """One of the sender's figures from /metrics (failures, for the transaction counter)."""
    text = requests.get(weir.client_url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(name) and (
            name != "weir_federation_transactions_total" or 'outcome="failure"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def revivals(weir, ca, dns, keys, sink, back: list, latest: str) -> None:
    """`back` come back up and each sends us a transaction: seconds until each has `latest`."""
    for origin in back:
        point(dns, origin, keys.host, ttl=1)
    gevent.sleep(1.5)
    took = []
    for i, origin in enumerate(back):
        r = send_transaction(weir.federation_url, origin, "weir.test", f"back{i}", [], ca, edus=[])
        r.raise_for_status()
        started = time.perf_counter()

        def has_latest(o=origin):
            return latest in [p["content"].get("body") for p in sink.pdus(o.name)]

        assert sink.wait_until(has_latest, timeout=120), f"{origin.name} never caught up"
        took.append(time.perf_counter() - started)
    label = "revived, until the latest message"
    print(f"{label:<38} {percentiles(took)}  max {max(took) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
