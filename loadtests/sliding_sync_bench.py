"""Prints what simplified sliding sync (MSC4186) costs a user in many rooms, and parked
connections, with the issue's targets beside each figure.

    .venv/bin/python -m loadtests.sliding_sync_bench [--rooms 1000] [--active 50]
        [--rounds 50] [--parked 2000] [--wake-rounds 10] [--database-url URL] [--extensions]

Writes one user in `--rooms` rooms, and `--parked` users in one shared room, through the
storage layer (as sync_bench.py does), then starts a real server process (`python app.py`)
pinned to core 0, this process on core 1 (as waiting_bench.py does), and sends one message
in each of `--active` rooms over HTTP, so they lead the list. It prints p50/p99 of:

  - a new connection's first response for a list `[[0, 19]]` with `timeline_limit` 1
    (Element X's first request), each round a connection of its own;
  - an incremental request (the pos of the previous answer, no wait) after one message in
    one of the active rooms, which moves it to the top;
  - the same as a long-poll: from the send to the woken request's response;
  - with each of the `--parked` users' connections parked (a long-poll on a raw keep-alive
    socket each, after its first response), one message in the shared room: from the send
    to each woken connection's response, over `--wake-rounds` rounds (the woken connections
    park again once the round is woken), and the server's CPU per woken connection, without
    and with its next long-poll; with `--extensions`, the connections ask for `to_device`
    and `e2ee` as Element X does;
  - the server's RSS before those connections and with all of them parked, divided, once
    each user's first response has filled the server's caches (bounded whatever the
    connections: events decoded, connections' state), and the RSS that filling took.

The latencies are the client's (loopback HTTP included): the server's own time is less.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import gc
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

import gevent
import gevent.pool
import requests
from gevent.lock import BoundedSemaphore

from homeserver.accounts.service import hash_token
from homeserver.config import parse_config
from homeserver.core.clock import now_ms
from homeserver.rooms.creation import CreateRoomRequest
from homeserver.runtime import HomeserverRuntime
from loadtests.sync_bench import (
    PARK_TIMEOUT_MS,
    READY,
    Bench,
    percentile,
    raise_fd_limit,
    read_response,
    rss_kb,
    stop_server,
)
from tests.support.server import REPO, write_config

SLIDING = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"
USER, TOKEN = "@u0:bench.test", "bench-token-0"
SENDER, SENDER_TOKEN = "@sender:bench.test", "bench-sender"
FIRST = {
    "lists": {
        "all": {
            "ranges": [[0, 19]],
            "timeline_limit": 1,
            "required_state": [["m.room.name", ""], ["m.room.avatar", ""]],
        }
    }
}
SERVER_CORE, CLIENT_CORE = 0, 1
# Connections parked at once at most, as waiting_bench.py's waves: each first request
# computes before it parks.
PARK_WAVE = 250


def populate(settings: dict, rooms: int, parked: int) -> tuple[list[str], str]:
    """The user and their rooms, and `parked` users in one room of the sender's, written
    in process; returns the user's room IDs and the shared room's."""
    rt = HomeserverRuntime(parse_config(settings))
    password_hash = rt.password_hasher.hash("bench")  # one scrypt: never checked
    for user_id, token in [(USER, TOKEN), (SENDER, SENDER_TOKEN)] + [
        (parked_user(i), parked_token(i)) for i in range(parked)
    ]:
        rt.accounts.store.create_user(user_id, password_hash, False, now_ms())
        rt.accounts.store.add_device_token(user_id, "BENCH", None, hash_token(token), now_ms())
    room_ids = [
        rt.room_creator.create(USER, CreateRoomRequest(name=f"room {i}")) for i in range(rooms)
    ]
    shared = rt.room_creator.create(SENDER, CreateRoomRequest(preset="public_chat", name="all"))
    for i in range(parked):
        rt.rooms.update_membership(parked_user(i), shared, parked_user(i), "join")
    rt.close()
    return room_ids, shared


def parked_user(i: int) -> str:
    return f"@p{i}:bench.test"


def parked_token(i: int) -> str:
    return f"bench-parked-{i}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rooms", type=int, default=1000)
    parser.add_argument("--active", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--parked", type=int, default=2000)
    parser.add_argument("--wake-rounds", type=int, default=10)
    parser.add_argument("--database-url", default=None, help="an empty PostgreSQL database")
    parser.add_argument(
        "--extensions",
        action="store_true",
        help="the parked connections ask for to_device and e2ee, as Element X does",
    )
    args = parser.parse_args()
    raise_fd_limit()
    directory = tempfile.mkdtemp(prefix="weir-sliding-bench-")
    settings = {
        "server_name": "bench.test",
        "data_dir": os.path.join(directory, "data"),
        "database": {"url": args.database_url or f"sqlite:///{directory}/data/homeserver.db"},
        "server": {"http": {"port": 0}},
        "federation": {"port": 0},
        "logging": {"level": "WARNING"},
    }
    started = time.perf_counter()
    room_ids, shared = populate(settings, args.rooms, args.parked)
    engine = settings["database"]["url"].split(":")[0]
    print(
        f"setup: 1 user in {args.rooms} rooms, {args.parked} users in one room, {engine}"
        f" ({time.perf_counter() - started:.0f} s); server on core {SERVER_CORE}, clients on"
        f" core {CLIENT_CORE}"
    )
    config_path = os.path.join(directory, "config.toml")
    write_config(config_path, settings)
    server = subprocess.Popen(
        [
            "taskset",
            "-c",
            str(SERVER_CORE),
            sys.executable,
            os.path.join(REPO, "app.py"),
            "--config",
            config_path,
        ],
        stdout=subprocess.PIPE,
        cwd=directory,
    )
    try:
        for line in server.stdout:
            match = READY.match(line.decode())
            if match:
                address = (match.group(1), int(match.group(2)))
                break
        else:
            raise RuntimeError("server did not start")
        os.sched_setaffinity(0, {CLIENT_CORE})
        url = f"http://{address[0]}:{address[1]}"
        run(url, room_ids[: args.active], args.rounds)
        if args.parked:
            run_parked(
                url, address, server.pid, shared, args.parked, args.wake_rounds, args.extensions
            )
    finally:
        stop_server(server)
    return 0


def run(url: str, active: list[str], rounds: int) -> None:
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {TOKEN}"
    txn = iter(range(10**9))

    def send(room_id: str) -> None:
        r = http.put(
            f"{url}/_matrix/client/v3/rooms/{room_id}/send/m.room.message/t{next(txn)}",
            json={"msgtype": "m.text", "body": "news"},
            timeout=60,
        )
        r.raise_for_status()

    def slide(pos=None, timeout=0, conn_id="bench") -> dict:
        params = {"timeout": timeout, **({"pos": pos} if pos else {})}
        r = http.post(f"{url}{SLIDING}", json={**FIRST, "conn_id": conn_id}, params=params)
        r.raise_for_status()
        return r.json()

    for room_id in active:
        send(room_id)
    first = []
    for i in range(rounds):
        began = time.perf_counter()
        body = slide(conn_id=f"first-{i % 5}")
        first.append((time.perf_counter() - began) * 1000)
        assert len(body["rooms"]) == 20
    report("first response, [[0, 19]], timeline_limit 1", first, "p99 <= 50 ms")

    pos = slide()["pos"]
    incremental = []
    for i in range(rounds):
        send(active[i % len(active)])
        began = time.perf_counter()
        body = slide(pos)
        incremental.append((time.perf_counter() - began) * 1000)
        assert len(body["rooms"]) == 1
        pos = body["pos"]
    report("incremental after one message", incremental, "p99 <= 10 ms")

    woken = []
    for i in range(rounds):
        waiting = gevent.spawn(slide, pos, 30_000)
        while parked(url) < 1:
            gevent.sleep(0.01)
        began = time.perf_counter()
        send(active[i % len(active)])
        body = waiting.get(timeout=60)
        woken.append((time.perf_counter() - began) * 1000)
        pos = body["pos"]
    report("send -> woken long-poll's response", woken, "")


class SlidingClient:
    """One user's sliding sync loop on one keep-alive connection: a first request, then a
    long-poll with each answer's pos (sync_bench.py's Client, for sliding sync)."""

    def __init__(self, address, token: str, bench: Bench, extensions: bool = False):
        self.address = address
        self.token = token
        self.bench = bench
        self.request: dict = {**FIRST, "conn_id": "bench"}
        if extensions:  # as Element X asks: each since the previous answer's next_batch
            self.request["extensions"] = {"to_device": {"enabled": True}, "e2ee": {"enabled": True}}

    def run(self, admitted: BoundedSemaphore) -> None:
        admitted.acquire()
        sock = socket.create_connection(self.address)
        reader = sock.makefile("rb")
        pos, parking = "", False
        try:
            while True:
                body = json.dumps(self.request).encode()
                query = f"?timeout={PARK_TIMEOUT_MS}&pos={pos}" if pos else "?timeout=0"
                sock.sendall(
                    f"POST {SLIDING}{query} HTTP/1.1\r\nHost: bench\r\n"
                    f"Authorization: Bearer {self.token}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                if pos and not parking:  # its first long-poll: the next client may start
                    admitted.release()
                    parking = True
                answer = read_response(reader)
                self.bench.woken(self, time.perf_counter())
                answered = json.loads(answer)
                pos = answered["pos"]
                if "extensions" in self.request:
                    next_batch = answered["extensions"]["to_device"]["next_batch"]
                    self.request["extensions"]["to_device"]["since"] = next_batch
                self.bench.may_park_again(self)
        finally:
            sock.close()


def warm_up(url: str, count: int) -> None:
    """Each user's first response once, on a sliding sync connection of its own and an HTTP
    connection closed after it: what the server's caches (each bounded whatever the
    connections) keep of that is then in place, and what the parked connections add is
    theirs."""
    pool = gevent.pool.Pool(50)

    def first(i: int) -> None:
        with requests.Session() as http:
            r = http.post(
                f"{url}{SLIDING}",
                params={"timeout": 0},
                # A connection of its own, kept in the server's memory beside the parked
                # one: what a parked connection keeps is counted, not swapped for this.
                json={**FIRST, "conn_id": "warm-up"},
                headers={"Authorization": f"Bearer {parked_token(i)}"},
                timeout=60,
            )
            r.raise_for_status()

    pool.map(first, range(count))


def run_parked(
    url: str, address, pid: int, shared: str, count: int, rounds: int, extensions: bool
) -> None:
    bench = Bench(url)
    bench.park_at_once = False
    baseline = bench.parking()[0]
    cold = rss_kb(pid)
    warm_up(url, count)
    rss_before = rss_kb(pid)
    print(
        f"  {count} users' first responses, no connection kept: RSS {cold / 1024:.0f} MB ->"
        f" {rss_before / 1024:.0f} MB (caches filled: parsed events, connections)"
    )
    clients = [SlidingClient(address, parked_token(i), bench, extensions) for i in range(count)]
    admitted = BoundedSemaphore(100)
    greenlets = []
    started = time.perf_counter()
    half, waves = rss_before, [rss_before]
    for first in range(0, count, PARK_WAVE):
        wave = clients[first : first + PARK_WAVE]
        greenlets += [gevent.spawn(c.run, admitted) for c in wave]
        bench.wait_parked(baseline + first + len(wave))
        waves.append(rss_kb(pid))
        if first + len(wave) <= count // 2:
            half = waves[-1]
    gc.freeze()  # this process's collections would show as pauses in what it measures
    rss_after = rss_kb(pid)
    each = (rss_after - rss_before) / count
    print(
        f"  {count} parked connections ({time.perf_counter() - started:.0f} s): RSS"
        f" {rss_before / 1024:.0f} MB -> {rss_after / 1024:.0f} MB, {each:.1f} KB each"
        f" (target: <= 30 KB); the second half's, once caches have filled:"
        f" {(rss_after - half) / (count - count // 2):.1f} KB each"
    )
    print(
        f"    KB each, wave by wave ({PARK_WAVE} each):"
        f" {', '.join(f'{(b - a) / PARK_WAVE:.0f}' for a, b in zip(waves, waves[1:]))}"
    )
    sender = requests.Session()
    sender.headers["Authorization"] = f"Bearer {SENDER_TOKEN}"
    txn = iter(range(10**9))

    def send() -> None:
        sender.put(
            f"{url}/_matrix/client/v3/rooms/{shared}/send/m.room.message/w{next(txn)}",
            json={"msgtype": "m.text", "body": "wake up"},
            timeout=60,
        ).raise_for_status()

    samples: list[float] = []
    made, cpu, cycle = lists_made(url), 0.0, 0.0
    bench.wait_parked(baseline + count)
    for _ in range(rounds):
        began = cpu_seconds(pid)
        samples += bench.round(clients, send)
        cpu += cpu_seconds(pid) - began
        bench.wait_parked(baseline + count)  # each woken connection's next long-poll parked
        cycle += cpu_seconds(pid) - began
    report(f"one message -> each of {count} parked connections", samples, "p99 < 500 ms")
    after = lists_made(url)
    print(
        f"    server CPU {cpu * 1000 / (rounds * count):.2f} ms per woken connection,"
        f" {cycle * 1000 / (rounds * count):.2f} ms with its next long-poll parked; room lists"
        + "".join(f", {k} {after[k] - made.get(k, 0):.0f}" for k in sorted(after))
    )
    gevent.killall(greenlets, block=True, timeout=30)


def lists_made(url: str) -> dict[str, float]:
    """weir_sliding_sync_lists_total by made_from (kept, whole: sync/sliding_lists.py)."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    found = re.findall(r'^weir_sliding_sync_lists_total\{made_from="(\w+)"\} (\S+)$', text, re.M)
    return {name: float(value) for name, value in found}


def cpu_seconds(pid: int) -> float:
    """The process's user and system CPU time (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def parked(url: str) -> float:
    """Long-polls registered with the notifier (the weir_sync_waiters gauge)."""
    for line in requests.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("weir_sync_waiters "):
            return float(line.split()[1])
    return 0.0


def report(label: str, samples: list[float], target: str) -> None:
    print(
        f"  {label}: p50 {percentile(samples, 50):.1f} ms, p99 {percentile(samples, 99):.1f} ms,"
        f" max {max(samples):.1f} ms ({len(samples)} requests)"
        + (f" (target: {target})" if target else "")
    )


if __name__ == "__main__":
    sys.exit(main())
