"""Prints what simplified sliding sync (MSC4186) costs a user in many rooms.

    .venv/bin/python -m loadtests.sliding_sync_bench [--rooms 1000] [--active 50]
                                                     [--rounds 50] [--database-url URL]

Writes one user in `--rooms` rooms through the storage layer (as sync_bench.py does), then
starts a real server process (`python app.py`) and sends one message in each of `--active`
rooms over HTTP, so they lead the list. It prints p50/p99 of:

  - a new connection's first response for a list `[[0, 19]]` with `timeline_limit` 1
    (Element X's first request), each round a connection of its own;
  - an incremental request (the pos of the previous answer, no wait) after one message in
    one of the active rooms, which moves it to the top;
  - the same as a long-poll: from the send to the woken request's response.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import os
import subprocess
import sys
import tempfile
import time

import gevent
import requests

from homeserver.accounts.service import hash_token
from homeserver.config import parse_config
from homeserver.core.clock import now_ms
from homeserver.rooms.creation import CreateRoomRequest
from homeserver.runtime import HomeserverRuntime
from loadtests.sync_bench import READY, percentile, stop_server
from tests.support.server import REPO, write_config

SLIDING = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"
USER, TOKEN = "@u0:bench.test", "bench-token-0"
FIRST = {
    "lists": {
        "all": {
            "ranges": [[0, 19]],
            "timeline_limit": 1,
            "required_state": [["m.room.name", ""], ["m.room.avatar", ""]],
        }
    }
}


def populate(settings: dict, rooms: int) -> list[str]:
    """The user and their rooms, written in process; returns the room IDs."""
    rt = HomeserverRuntime(parse_config(settings))
    rt.accounts.store.create_user(USER, rt.password_hasher.hash("bench"), False, now_ms())
    rt.accounts.store.add_device_token(USER, "BENCH", None, hash_token(TOKEN), now_ms())
    room_ids = [
        rt.room_creator.create(USER, CreateRoomRequest(name=f"room {i}")) for i in range(rooms)
    ]
    rt.close()
    return room_ids


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rooms", type=int, default=1000)
    parser.add_argument("--active", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--database-url", default=None, help="an empty PostgreSQL database")
    args = parser.parse_args()
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
    room_ids = populate(settings, args.rooms)
    engine = settings["database"]["url"].split(":")[0]
    print(f"setup: 1 user in {args.rooms} rooms, {engine} ({time.perf_counter() - started:.0f} s)")
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
                url = f"http://{match.group(1)}:{match.group(2)}"
                break
        else:
            raise RuntimeError("server did not start")
        run(url, room_ids[: args.active], args.rounds)
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
    report("first response, [[0, 19]], timeline_limit 1", first)

    pos = slide()["pos"]
    incremental = []
    for i in range(rounds):
        send(active[i % len(active)])
        began = time.perf_counter()
        body = slide(pos)
        incremental.append((time.perf_counter() - began) * 1000)
        assert len(body["rooms"]) == 1
        pos = body["pos"]
    report("incremental after one message", incremental)

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
    report("send -> woken long-poll's response", woken)


def parked(url: str) -> float:
    """Long-polls registered with the notifier (the weir_sync_waiters gauge)."""
    for line in requests.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("weir_sync_waiters "):
            return float(line.split()[1])
    return 0.0


def report(label: str, samples: list[float]) -> None:
    print(
        f"  {label}: p50 {percentile(samples, 50):.1f} ms, p99 {percentile(samples, 99):.1f} ms,"
        f" max {max(samples):.1f} ms ({len(samples)} requests)"
    )


if __name__ == "__main__":
    sys.exit(main())
