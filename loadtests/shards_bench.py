"""Signed inbound transactions per second through 0 (main alone), 1, 2 and 4 federation
worker shards: prints numbers, judges nothing.

    .venv/bin/python -m loadtests.shards_bench [--senders 16] [--empty 2000] [--with-pdus 400]

Against the real server processes (SQLite, plain-HTTP federation listener as behind a TLS
load balancer), with fake origins whose keys a TLS key server in this process serves (fetched
once each, before timing). Every transaction and its X-Matrix signature is made before the
clock starts, so the figures are the server's work:

- empty: X-Matrix check only (each shard on its own; scales with the shards and the cores);
- 5 PDUs: each message's signature and hash checked in the shard, relayed to main, checked
  again there, authorised and stored (main and its one SQLite writer bound).

The load generator runs on the same machine and takes CPU of its own: read the figures
relative to each other, and mind the core count printed first.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import json
import os
import tempfile
import time
from urllib.parse import quote, urlsplit

import gevent
import psutil
from geventhttpclient import HTTPClient

from tests.peers.dns import DnsServer
from tests.peers.origins import OriginKeyServer, transaction_body
from tests.support.remote_room import room_joined_by
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge
from tests.support.tls import TestCA

PDUS_PER_TRANSACTION = 5


def signed(origin, txn_id: str, pdus: list) -> tuple[str, bytes, dict]:
    uri = f"/_matrix/federation/v1/send/{quote(txn_id, safe='')}"
    content = transaction_body(origin, pdus)
    return (
        uri,
        json.dumps(content).encode(),
        {
            "Authorization": origin.sign_request("weir.test", "PUT", uri, content),
            "Content-Type": "application/json",
        },
    )


def server_cpu_seconds(weir: WeirProcess) -> float:
    """CPU time used so far by main and its shards."""
    main = psutil.Process(weir.proc.pid)
    total = 0.0
    for process in [main, *main.children()]:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def run(weir: WeirProcess, lanes: list[list[tuple]]) -> tuple[float, float]:
    """Sends every lane's transactions in order, lanes concurrently, each on one keep-alive
    connection. Returns (transactions per second, server CPU ms per transaction)."""
    url = urlsplit(weir.federation_url)

    def lane(transactions):
        client = HTTPClient(url.hostname, url.port, network_timeout=60)
        try:
            for uri, body, headers in transactions:
                response = client.request("PUT", uri, body=body, headers=headers)
                answer = json.loads(response.read())
                assert response.status_code == 200 and all(
                    v == {} for v in answer["pdus"].values()
                ), answer
        finally:
            client.close()

    count = sum(len(t) for t in lanes)
    cpu = server_cpu_seconds(weir)
    started = time.perf_counter()
    gevent.joinall([gevent.spawn(lane, t) for t in lanes], raise_error=True)
    elapsed = time.perf_counter() - started
    return count / elapsed, (server_cpu_seconds(weir) - cpu) * 1000 / count


def bench(shards: int, args, ca, dns, keys) -> tuple[tuple, tuple]:
    directory = tempfile.mkdtemp(prefix=f"weir-shards-bench-{shards}-")
    settings = merge(
        base_settings(os.path.join(directory, "data")),
        {
            "federation": {
                "ca_file": ca.ca_path,
                "dns_nameservers": [dns.nameserver],
                "ip_range_allowlist": ["127.0.0.0/8"],
                "worker": {"shards": shards},
            },
            # Not what is measured: every sender's key is fetched once, from this one address.
            "security": {
                "federation": {
                    "key_resolution_per_ip_rate": {"max_requests": 1000, "per_seconds": 60}
                }
            },
            "logging": {"level": "WARNING"},
        },
    )
    weir = WeirProcess(directory, settings).start()
    try:
        alice = MatrixClient(weir.client_url)
        alice.register("alice")
        origins = [keys.add_origin(f"b{shards}-{i}") for i in range(args.senders)]
        # One room per sender, each joined by its sender's user: keys fetched, rooms linear.
        rooms, tips = zip(*(room_joined_by(weir, ca, alice, origin) for origin in origins))

        per_lane = args.empty // args.senders
        empty = [[signed(o, f"e{i}", []) for i in range(per_lane)] for o in origins]
        per_lane = args.with_pdus // args.senders
        with_pdus = []
        for origin, room, tip in zip(origins, rooms, tips):
            transactions, auth = [], room.auth_for(origin.user("bob"))
            for i in range(per_lane):
                ids, pdus = room.messages(
                    origin,
                    "bob",
                    [f"m{i}-{n}" for n in range(PDUS_PER_TRANSACTION)],
                    prev=tip,
                    auth=auth,
                )
                tip = ids[-1]
                transactions.append(signed(origin, f"p{i}", pdus))
            with_pdus.append(transactions)
        return run(weir, empty), run(weir, with_pdus)
    finally:
        weir.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--senders", type=int, default=16)
    parser.add_argument("--empty", type=int, default=2000)
    parser.add_argument("--with-pdus", type=int, default=400)
    parser.add_argument("--shards", default="0,1,2,4")
    args = parser.parse_args()
    ca = TestCA(tempfile.mkdtemp(prefix="weir-shards-bench-ca-"))
    print(f"cores: {os.cpu_count()}; {args.senders} senders on keep-alive connections; SQLite")
    print("server CPU ms/txn: CPU time of main and shards per transaction (lower is cheaper)")
    print(
        f"{'shards':>6}  {'empty txn/s':>11} {'CPU ms':>6}  "
        f"{f'{PDUS_PER_TRANSACTION}-PDU txn/s':>11} {'CPU ms':>6}  {'PDUs/s':>6}"
    )
    with (
        DnsServer("127.0.0.1") as dns,
        OriginKeyServer("bench.test", ca, dns, host="127.63.0.1") as keys,
    ):
        for shards in (int(n) for n in args.shards.split(",")):
            (empty, empty_cpu), (with_pdus, pdus_cpu) = bench(shards, args, ca, dns, keys)
            print(
                f"{shards:>6}  {empty:>11.0f} {empty_cpu:>6.2f}  {with_pdus:>11.0f} "
                f"{pdus_cpu:>6.2f}  {with_pdus * PDUS_PER_TRANSACTION:>6.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
