"""Prints what waiting costs one server process with the default main_pool_size (1000):
idle keep-alive connections, parked /syncs and a slowloris, and what local requests and
wake-ups take meanwhile (homeserver/http/places.py, docs/operations.md "Sizing").

    .venv/bin/python -m loadtests.waiting_bench [--idle 10000] [--parked 5000]
        [--members 2000] [--few 10] [--rounds 10] [--slow 2000] [--requests 2000]
        [--repeats 15] [--lazy-load-members]

Starts a real server process (`python app.py`, SQLite) whose users and rooms are written
beforehand through the storage layer (loadtests/sync_bench.py's `populate`), then:

1. opens `--idle` keep-alive connections (each answered once, then silent) and parks
   `--parked` syncs (one per user, loadtests/sync_bench.py's `Client`), printing the server's
   RSS and open descriptors after each;
2. `/versions` and local `/publicRooms` p50/p99 on that server and on the baseline, its twin
   (a second server process on a copy of the data) with nothing connected: `--repeats` x
   `--requests` requests for each figure, the two servers' in alternating blocks of 100 so
   that whatever the machine does meanwhile falls on both alike;
3. wake-ups: one message in a room of `--members` parked members, and one in a room of
   `--few` of them while all `--parked` wait: p50/p99 from the send to each woken response,
   with the woken clients syncing again only once the round is woken (the wake-up alone);
4. slowloris: the idle connections close, and `--slow` connections send a request line and
   then one header line every 4 s. `/health` and `/versions` latencies meanwhile, and when
   each slow connection was closed (request_head_timeout, 10 s by default).

The servers run pinned to core 0 (taskset), and the client load in this process on core 1,
within `ulimit -n`: the server needs one descriptor per connection, and so does this process.
The latencies are measured by a process of their own on core 1 (loadtests/latency_probe.py).
Everything stops by itself.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import gc
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import gevent
import requests
from gevent.lock import BoundedSemaphore

from loadtests.sync_bench import (
    READY,
    SYNC_PATH,
    Bench,
    Client,
    percentile,
    populate,
    raise_fd_limit,
    rss_kb,
    stop_server,
)
from loadtests.throughput_bench import cpu_seconds
from tests.support.server import REPO, write_config

VERSIONS = "/_matrix/client/versions"
PUBLIC_ROOMS = "/_matrix/client/v3/publicRooms"
SLOW_INTERVAL = 4.0
# What Element asks of every sync: member events only of those who appear in the timeline.
LAZY_LOADING_FILTER = json.dumps({"room": {"state": {"lazy_load_members": True}}})
PARK_WAVE = 250
# The server on one core (the wake-up target is for one), the load on the other: each
# keeps its own, so neither's latency figures carry the other's turns on a shared core.
SERVER_CORE, CLIENT_CORE = 0, 1


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_quiet(pids: list[int], interval: float = 0.5, limit: float = 60.0) -> float:
    """Waits until none of `pids` used more than one clock tick (10 ms) of CPU in `interval`:
    the figures are of the waiting, not of the parking's aftermath. Returns the wait."""
    one_tick = 1 / os.sysconf("SC_CLK_TCK")
    started = time.monotonic()
    before = [cpu_seconds(pid) for pid in pids]
    while time.monotonic() - started < limit:
        gevent.sleep(interval)
        after = [cpu_seconds(pid) for pid in pids]
        # Half a tick over one: the seconds are whole ticks, divided.
        if all(b - a < 1.5 * one_tick for a, b in zip(before, after)):
            break
        before = after
    return time.monotonic() - started


def figures(pid: int) -> str:
    return f"RSS {rss_kb(pid) / 1024:.0f} MB, {open_fds(pid)} open fds"


def latencies(addresses: list, path: str, count: int, headers: dict) -> list[list[float]]:
    """Milliseconds per request on each server, `count` each, measured by
    loadtests/latency_probe.py in a process of its own: this one holds the load, as many
    sockets and greenlets as the server, and its own pauses would show in the server's
    figures. Several servers' requests alternate in blocks of 100."""
    command = [sys.executable, "-m", "loadtests.latency_probe", path, str(count)]
    command += [f"{host}:{port}" for host, port in addresses]
    if "Authorization" in headers:
        command += ["--authorization", headers["Authorization"]]
    probe = subprocess.run(command, cwd=REPO, capture_output=True, check=True, timeout=600)
    return json.loads(probe.stdout)


def summary(samples: list[float]) -> str:
    return f"p50 {percentile(samples, 50):.1f} ms, p99 {percentile(samples, 99):.1f} ms"


def compare_latencies(servers: dict[str, tuple], count: int, repeats: int, headers: dict):
    """`count` x `repeats` requests of each path on each server, the servers' requests in
    alternating blocks of 100, so that whatever the machine does for longer than a block
    falls on both alike. Prints p50 and p99 of all the requests of each figure, and the p99
    of each `count` of them; returns the p99s of all.

    Measured in turns of 2,000 requests instead, one turn's p99 (its 20 slowest) was about
    1 ms or 3-5 ms on this VM, as a slow spell of its virtual CPU fell in the turn or not, on
    either server alike, and the loaded/baseline ratio moved from 1.0x to 2.1x between runs
    of the same build."""
    paths = (("/versions", VERSIONS), ("local /publicRooms", PUBLIC_ROOMS))
    p99s_of_all = {}
    for name, path in paths:
        found = latencies(list(servers.values()), path, count * repeats, headers)
        for label, every in zip(servers, found):
            p99s_of_all[label, name] = percentile(every, 99)
            parts = [every[i : i + count] for i in range(0, len(every), count)]
            print(
                f"  {label} {name}: {summary(every)} (all {len(every)});"
                f" p99 of each {count}: {', '.join(f'{percentile(p, 99):.1f}' for p in parts)}"
            )
    return p99s_of_all


def open_idle(address, count: int) -> list[socket.socket]:
    """`count` keep-alive connections, each answered once and then left silent."""
    socks: list[socket.socket] = []
    admitted = BoundedSemaphore(200)

    def one():
        with admitted:
            sock = socket.create_connection(address, timeout=60)
            sock.sendall(f"GET {VERSIONS} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
            if not sock.recv(65536).startswith(b"HTTP/1.1 200"):
                raise RuntimeError("an idle connection's first request failed")
            socks.append(sock)

    gevent.joinall([gevent.spawn(one) for _ in range(count)], raise_error=True)
    return socks


def slow_client(address, closed: list, answers: list) -> None:
    """A request line, then a header line every SLOW_INTERVAL until the server closes."""
    sock = socket.create_connection(address, timeout=60)
    started = time.perf_counter()
    sock.sendall(f"GET {VERSIONS} HTTP/1.1\r\nHost: bench\r\n".encode())
    sock.settimeout(SLOW_INTERVAL)
    received = b""
    try:
        for i in range(1000):
            try:
                data = sock.recv(4096)
            except TimeoutError:
                sock.sendall(f"X-Slow-{i}: x\r\n".encode())
                continue
            if not data:
                break
            received += data
    except OSError:
        pass
    closed.append(time.perf_counter() - started)
    answers.append(received.split(b" ", 2)[1] if received else b"none")
    sock.close()


def slowloris(address, count: int, requests_count: int, headers: dict) -> None:
    closed: list[float] = []
    answers: list[bytes] = []
    admitted = BoundedSemaphore(200)

    def one():
        with admitted:
            pass  # connect in waves, like a client would
        slow_client(address, closed, answers)

    slow = [gevent.spawn(one) for _ in range(count)]
    gevent.sleep(SLOW_INTERVAL)  # let them all be sending their heads
    for name, path in (("/health", "/health"), ("/versions", VERSIONS)):
        samples = latencies([address], path, requests_count, headers)[0]
        print(f"  during the slowloris, {name}: {summary(samples)}")
    gevent.joinall(slow, timeout=120)
    statuses = {a.decode(): answers.count(a) for a in set(answers)}
    print(
        f"  {len(closed)} of {count} slow connections closed by the server after"
        f" p50 {percentile(closed, 50):.1f} s, min {min(closed):.1f} s,"
        f" max {max(closed):.1f} s; answers: {statuses}"
    )


def wake_rounds(bench: Bench, label: str, clients: list, send, rounds: int, parked: int):
    samples = []
    before = wakes_by_answer(bench.server_url)
    for _ in range(rounds):
        bench.wait_parked(parked)
        samples += bench.round(clients, send)
    after = wakes_by_answer(bench.server_url)
    answered = ", ".join(f"{k} {after[k] - before.get(k, 0):.0f}" for k in sorted(after))
    print(f"  one event concerning {label}: {summary(samples)} ({len(samples)} wake-ups)")
    print(f"    woken syncs answered from: {answered}")


def wakes_by_answer(server_url: str) -> dict[str, float]:
    """weir_sync_wakes_total by answered_from (homeserver/sync/woken.py)."""
    text = requests.get(server_url + "/metrics", timeout=30).text
    found = re.findall(r'^weir_sync_wakes_total\{answered_from="(\w+)"\} (\S+)$', text, re.M)
    return {name: float(value) for name, value in found}


def start_server(directory: str, settings: dict, processes: list):
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
    processes.append(server)
    for line in server.stdout:
        match = READY.match(line.decode())
        if match:
            return server, (match.group(1), int(match.group(2)))
    raise RuntimeError("server did not start")


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--idle", type=int, default=10_000)
    parser.add_argument("--parked", type=int, default=5000)
    parser.add_argument("--members", type=int, default=2000)
    parser.add_argument("--few", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--slow", type=int, default=2000)
    # Per latency figure, --repeats x --requests requests on each server (compare_latencies):
    # a p99 is its slowest 1%, and a few milliseconds of the machine's own (a stolen slice of
    # a virtual CPU, a client-side pause) move that of a few thousand by half either way.
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--lazy-load-members", action="store_true", help="the syncs use Element's filter"
    )
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    fd_limit = raise_fd_limit()
    if fd_limit < args.idle + args.parked + 500:
        print(f"warning: open-file limit {fd_limit} is low for this bench")
    directory = tempfile.mkdtemp(prefix="weir-waiting-bench-")
    settings = {
        "server_name": "bench.test",
        "data_dir": os.path.join(directory, "data"),
        "database": {"url": f"sqlite:///{directory}/data/homeserver.db"},
        # The default main_pool_size; room for every bench connection in the waiting stage,
        # and idle connections kept for the whole bench.
        "server": {
            "http": {
                "port": 0,
                "max_connections": args.idle + args.parked + 500,
                "keepalive_timeout": 900,
            }
        },
        "federation": {"port": 0},
        "logging": {"level": "WARNING"},
    }
    started = time.perf_counter()
    tokens, (big_room, small_room) = populate(settings, args.parked, [args.members, args.few])
    print(
        f"setup: {args.parked} users, rooms of {args.members} and {args.few} members"
        f" ({time.perf_counter() - started:.0f} s); main_pool_size 1000"
    )
    # The baseline: a twin of the server, on a copy of its data, that nothing connects to.
    twin_directory = os.path.join(directory, "baseline")
    shutil.copytree(settings["data_dir"], os.path.join(twin_directory, "data"))
    twin_settings = {
        **settings,
        "data_dir": os.path.join(twin_directory, "data"),
        "database": {"url": f"sqlite:///{twin_directory}/data/homeserver.db"},
    }
    processes = []
    try:
        server, address = start_server(directory, settings, processes)
        twin, twin_address = start_server(twin_directory, twin_settings, processes)
        os.sched_setaffinity(0, {CLIENT_CORE})
        run(args, server, address, twin, twin_address, tokens, big_room, small_room)
    finally:
        for process in processes:
            stop_server(process)
    return 0


def run(args, server, address, twin, twin_address, tokens, big_room, small_room) -> None:
    url = f"http://{address[0]}:{address[1]}"
    auth = {"Authorization": f"Bearer {tokens[-1]}"}
    pid = server.pid
    print(f"server with nothing connected: {figures(pid)}")

    started = time.perf_counter()
    idle = open_idle(address, args.idle)
    print(
        f"{args.idle} idle keep-alive connections ({time.perf_counter() - started:.0f} s):"
        f" {figures(pid)}"
    )
    rss_idle = rss_kb(pid)

    bench = Bench(url)
    sender = requests.Session()
    sender.headers.update(auth)
    since = sender.get(
        url + SYNC_PATH, params={"filter": json.dumps({"room": {"rooms": []}})}, timeout=60
    ).json()["next_batch"]
    sync_filter = LAZY_LOADING_FILTER if args.lazy_load_members else ""
    clients = [Client(address, tokens[i], since, bench, sync_filter) for i in range(args.parked)]
    admitted = BoundedSemaphore(100)
    started = time.perf_counter()
    greenlets = []
    # In waves: all at once, 5,000 first computations would queue for the 1,000 places past
    # their 10 s wait (a reconnect storm gets 503s with Retry-After; not what this measures).
    for first in range(0, args.parked, PARK_WAVE):
        wave = clients[first : first + PARK_WAVE]
        greenlets += [gevent.spawn(c.run, admitted) for c in wave]
        bench.wait_parked(first + len(wave))
    # This process holds as many sockets and greenlets as the server: its own collections,
    # walking them, would show as pauses in the wake-up figures, which it measures. What
    # exists now stays.
    gc.freeze()
    rss = rss_kb(pid)
    print(
        f"and {args.parked} parked syncs ({time.perf_counter() - started:.0f} s): {figures(pid)};"
        f" the syncs add {(rss - rss_idle) / 1024:.0f} MB"
        f" ({(rss - rss_idle) / args.parked:.1f} KB each)"
    )
    quiet = wait_quiet([pid, os.getpid()])
    print(
        f"latencies (once both processes were quiet, {quiet:.1f} s): the loaded server, and"
        " the baseline, its twin on a copy of its data with nothing connected, in alternating"
        " blocks of 100 requests"
    )
    p99s = compare_latencies(
        {"loaded": address, "baseline": twin_address}, args.requests, args.repeats, auth
    )
    ratios = [
        f"{name} {p99s['loaded', name] / p99s['baseline', name]:.2f}x"
        for label, name in p99s
        if label == "loaded"
    ]
    print(f"  loaded p99 / baseline p99: {', '.join(ratios)} (target: under 1.5x)")
    stop_server(twin)

    transaction_ids = iter(range(10**9))

    def sender_for(room_id):
        def send():
            sender.put(
                f"{url}/_matrix/client/v3/rooms/{room_id}/send/m.room.message/"
                f"t{next(transaction_ids)}",
                json={"body": "wake up"},
                timeout=60,
            ).raise_for_status()

        return send

    bench.park_at_once = False
    print("wake-ups (woken clients sync again once the round is woken):")
    members = clients[: args.members]
    few = clients[args.members : args.members + args.few]
    wake_rounds(
        bench,
        f"{args.members} parked syncs",
        members,
        sender_for(big_room),
        args.rounds,
        args.parked,
    )
    wake_rounds(
        bench,
        f"{args.few} of {args.parked}",
        few,
        sender_for(small_room),
        args.rounds * 2,
        args.parked,
    )

    for sock in idle:
        sock.close()
    print(
        f"slowloris: {args.slow} connections, a header line every {SLOW_INTERVAL:.0f} s"
        f" (the idle connections closed, the syncs still parked)"
    )
    slowloris(address, args.slow, args.requests, auth)
    print(f"server at the end: {figures(pid)}")
    gevent.killall(greenlets, block=True, timeout=30)


if __name__ == "__main__":
    sys.exit(main())
