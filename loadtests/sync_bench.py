"""Prints what waiting /syncs cost one server process, and how fast the right ones wake.

    .venv/bin/python -m loadtests.sync_bench [--parked 5000] [--members 100] [--few 10]
                                             [--rounds 20] [--database-url URL]

Starts a real server process (`python app.py`, SQLite) whose users and rooms are written
beforehand through the storage layer (registering thousands of users over HTTP would be
scrypt-bound and measure nothing of interest). Then it parks `--parked` concurrent syncs,
one per user, each on its own raw keep-alive socket (a greenlet reading it: a cheap load
generator), and prints:

  - the server's RSS with every sync parked (VmRSS from /proc/<pid>/status);
  - p50/p99 from the start of a send to the end of each woken sync's response, for a room
    whose `--members` members are all waiting;
  - the same for a room of `--few` members while all `--parked` syncs wait (the other
    syncs must not be touched: waking is indexed by user, not a scan).

Both latencies are measured twice: with the woken clients syncing again only once the whole
round is woken (the wake-up alone), and with each syncing again at once with its new
next_batch, as real clients do (so the round's later wake-ups share the server with the
earlier clients' next syncs). A round starts when all syncs are parked again (the server's
weir_sync_waiters gauge).
"""

from gevent import monkey

monkey.patch_all()

import argparse
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from urllib.parse import quote

import gevent
import requests
from gevent.event import Event
from gevent.lock import BoundedSemaphore

from homeserver.accounts.service import hash_token
from homeserver.config import parse_config
from homeserver.core.clock import now_ms
from homeserver.rooms.creation import CreateRoomRequest
from homeserver.runtime import HomeserverRuntime
from tests.support.server import REPO, write_config

SYNC_PATH = "/_matrix/client/v3/sync"
READY = re.compile(r"^weir ready client=http://([^:]+):(\d+)")
PARK_TIMEOUT_MS = 300_000


def raise_fd_limit() -> int:
    """As many open files as the hard limit allows; the server process inherits it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def populate(settings: dict, users: int, groups: list[int]) -> tuple[list[str], list[str]]:
    """Creates `users` users with known access tokens, and one room per group size whose
    first members are the next users in order. Returns (tokens, room IDs); the room's
    creator and sender is an extra user whose token comes last."""
    rt = HomeserverRuntime(parse_config(settings))
    # One scrypt for everyone: the hash is never checked.
    password_hash = rt.password_hasher.hash("bench")
    tokens = []
    for i in range(users + 1):
        user_id, token = f"@u{i}:bench.test", f"bench-token-{i}"
        rt.accounts.store.create_user(user_id, password_hash, False, now_ms())
        rt.accounts.store.add_device_token(user_id, "BENCH", None, hash_token(token), now_ms())
        tokens.append(token)
    sender = f"@u{users}:bench.test"
    rooms, first = [], 0
    for size in groups:
        room_id = rt.room_creator.create(sender, CreateRoomRequest(preset="public_chat"))
        for i in range(first, first + size):
            rt.rooms.update_membership(f"@u{i}:bench.test", room_id, f"@u{i}:bench.test", "join")
        rooms.append(room_id)
        first += size
    rt.close()
    return tokens, rooms


class Client:
    """One user's sync loop on one keep-alive connection."""

    def __init__(self, address, token: str, since: str, bench: "Bench", sync_filter: str = ""):
        self.address = address
        self.token = token
        self.since = since
        self.bench = bench
        self.index = None
        # A filter's JSON, as a client passes it (Element lazy-loads members).
        self.filter_param = f"&filter={quote(sync_filter)}" if sync_filter else ""

    def run(self, admitted: BoundedSemaphore) -> None:
        admitted.acquire()
        sock = socket.create_connection(self.address)
        reader = sock.makefile("rb")
        try:
            first = True
            while True:
                sock.sendall(
                    f"GET {SYNC_PATH}?since={quote(self.since)}&timeout={PARK_TIMEOUT_MS}"
                    f"{self.filter_param}"
                    f" HTTP/1.1\r\nHost: bench\r\n"
                    f"Authorization: Bearer {self.token}\r\n\r\n".encode()
                )
                if first:
                    admitted.release()
                    first = False
                body = read_response(reader)
                self.bench.woken(self, time.perf_counter(), body)
                self.since = json.loads(body)["next_batch"]
                self.bench.may_park_again(self)
        finally:
            sock.close()


def read_response(reader) -> bytes:
    status = reader.readline()
    if not status.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"sync failed: {status!r}")
    length = 0
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return reader.read(length)


class Bench:
    def __init__(self, server_url: str):
        self.server_url = server_url
        # Where the syncs park: one server, or several instances of one.
        self.server_urls = [server_url]
        self.expected: set = set()
        self.times: dict = {}
        self.all_woken = Event()
        self.send_ms: list[float] = []
        # True: a woken client syncs again at once, as real clients do, so the woken syncs
        # compete with their successors. False: the round's clients sync again only once
        # all of them are woken, which leaves the wake-up itself to be measured.
        self.park_at_once = True
        self.started = 0.0  # when the last round's send began (perf_counter)

    def may_park_again(self, client: Client) -> None:
        if not self.park_at_once and client in self.expected:
            self.all_woken.wait()

    def woken(self, client: Client, at: float, body: bytes = b"") -> None:
        if client in self.expected and client not in self.times:
            self.times[client] = at
            if len(self.times) == len(self.expected):
                self.all_woken.set()

    def parking(self) -> tuple[int, int]:
        """(syncs registered, requests running in the main pool). A sync registers before
        it computes its first answer, and gives its work place back once parked."""
        parked = running = 0
        for url in self.server_urls:
            text = requests.get(url + "/metrics", timeout=30).text
            waiters = re.search(r"^weir_sync_waiters (\S+)$", text, re.M)
            busy = re.search(r'^weir_pool_greenlets\{pool="main"\} (\S+)$', text, re.M)
            parked += int(float(waiters.group(1)))
            running += int(float(busy.group(1)))
        return parked, running

    def wait_parked(self, count: int, timeout: float = 600) -> None:
        """Until `count` syncs are parked and none is computing still: what is measured next
        does not queue behind the last ones' first answers. (The scrape itself runs in the
        main pool.)"""
        deadline = time.monotonic() + timeout
        while True:
            parked, running = self.parking()
            if parked >= count and running <= len(self.server_urls):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{parked} of {count} syncs parked, {running} requests running")
            gevent.sleep(0.1)

    def round(self, clients: list, send) -> list[float]:
        """Milliseconds from the start of `send()` to each of `clients` getting its
        response."""
        self.expected, self.times, self.all_woken = set(clients), {}, Event()
        started = self.started = time.perf_counter()
        send()
        self.send_ms.append((time.perf_counter() - started) * 1000)
        if not self.all_woken.wait(60):
            raise RuntimeError(f"{len(self.times)} of {len(clients)} woke")
        return [(t - started) * 1000 for t in self.times.values()]


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1))


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parked", type=int, default=5000)
    parser.add_argument("--members", type=int, default=100)
    parser.add_argument("--few", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--database-url",
        default=None,
        help="an empty PostgreSQL database; default: SQLite in a temporary folder",
    )
    args = parser.parse_args()
    if args.members + args.few > args.parked:
        parser.error("--members + --few must not exceed --parked")

    fd_limit = raise_fd_limit()
    # Server side: the connection and the disconnect watch's duplicate, per parked sync.
    if fd_limit < 2 * args.parked + 200:
        print(f"warning: open-file limit {fd_limit} is low for {args.parked} parked syncs")
    directory = tempfile.mkdtemp(prefix="weir-sync-bench-")
    settings = {
        "server_name": "bench.test",
        "data_dir": os.path.join(directory, "data"),
        "database": {"url": args.database_url or f"sqlite:///{directory}/data/homeserver.db"},
        "server": {"http": {"port": 0, "main_pool_size": args.parked + 200}},
        "federation": {"port": 0},
        "logging": {"level": "WARNING"},
    }
    started = time.perf_counter()
    tokens, (big_room, small_room) = populate(settings, args.parked, [args.members, args.few])
    print(
        f"setup: {args.parked} users, rooms of {args.members} and {args.few} waiting members,"
        f" {settings['database']['url'].split(':')[0]} ({time.perf_counter() - started:.0f} s)"
    )

    config_path = os.path.join(directory, "config.toml")
    write_config(config_path, settings)
    server = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "app.py"), "--config", config_path],
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
        url = f"http://{address[0]}:{address[1]}"
        bench = Bench(url)
        print(f"server RSS before any sync: {rss_kb(server.pid) / 1024:.0f} MB")

        sender = requests.Session()
        sender.headers["Authorization"] = f"Bearer {tokens[-1]}"
        since = sender.get(
            url + SYNC_PATH, params={"filter": json.dumps({"room": {"rooms": []}})}, timeout=60
        ).json()["next_batch"]
        clients = [Client(address, tokens[i], since, bench) for i in range(args.parked)]
        admitted = BoundedSemaphore(100)  # connecting at most this many at once
        started = time.perf_counter()
        greenlets = [gevent.spawn(c.run, admitted) for c in clients]
        bench.wait_parked(args.parked)
        print(f"parked {args.parked} syncs in {time.perf_counter() - started:.1f} s")
        rss = rss_kb(server.pid)
        print(
            f"server RSS with {args.parked} waiting syncs: {rss / 1024:.0f} MB"
            f" ({rss / args.parked:.1f} KB per sync, process included)"
        )

        transaction_ids = iter(range(10**9))  # a repeated one would send nothing new

        def sender_for(room_id):
            def send():
                r = sender.put(
                    f"{url}/_matrix/client/v3/rooms/{room_id}/send/m.room.message/"
                    f"t{next(transaction_ids)}",
                    json={"body": "wake up"},
                    timeout=60,
                )
                r.raise_for_status()

            return send

        scenarios = [
            (f"{args.members} waiting members of the room", clients[: args.members], big_room),
            (
                f"{args.few} concerned of {args.parked} parked",
                clients[args.members : args.members + args.few],
                small_room,
            ),
        ]
        for park_at_once in (False, True):
            bench.park_at_once = park_at_once
            print(
                "woken clients sync again "
                + (
                    "at once, as real clients do:"
                    if park_at_once
                    else "once the whole round is woken (the wake-up alone):"
                )
            )
            for label, members, room_id in scenarios:
                samples, bench.send_ms = [], []
                send = sender_for(room_id)
                for _ in range(args.rounds):
                    bench.wait_parked(args.parked)
                    samples += bench.round(members, send)
                print(
                    f"  send -> wake-up, {label}: p50 {percentile(samples, 50):.1f} ms,"
                    f" p99 {percentile(samples, 99):.1f} ms, max {max(samples):.1f} ms"
                    f" ({len(samples)} wake-ups over {args.rounds} sends; the send itself:"
                    f" p50 {percentile(bench.send_ms, 50):.1f} ms)"
                )
        print(f"server RSS at the end: {rss_kb(server.pid) / 1024:.0f} MB")
        gevent.killall(greenlets, block=True, timeout=30)
    finally:
        stop_server(server)
    return 0


def stop_server(process: subprocess.Popen) -> None:
    """SIGTERM, then a kill if it has not ended within a minute."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


if __name__ == "__main__":
    sys.exit(main())
