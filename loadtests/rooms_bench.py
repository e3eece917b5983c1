"""Prints what rooms cost: event sends per second into one room and across rooms, and the
time of a public room list page as the directory grows.

    .venv/bin/python -m loadtests.rooms_bench [--rooms 2000] [--database-url URL]

Runs the real services in-process on a temporary SQLite file (or the given database), no
HTTP: the figures are the service and storage cost a request pays on top of the web layer.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import tempfile
import time

import gevent

from homeserver.config import parse_config
from homeserver.core.requester import Requester
from homeserver.directory.service import RoomFilter
from homeserver.rooms.creation import CreateRoomRequest
from homeserver.runtime import HomeserverRuntime


def timed(fn, repeat: int = 20) -> float:
    """Median milliseconds of `repeat` calls."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return sorted(samples)[len(samples) // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rooms", type=int, default=2000)
    parser.add_argument("--sends", type=int, default=500)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()

    data_dir = tempfile.mkdtemp(prefix="weir-bench-")
    url = args.database_url or f"sqlite:///{data_dir}/homeserver.db"
    rt = HomeserverRuntime(
        parse_config({"server_name": "bench.test", "data_dir": data_dir, "database": {"url": url}})
    )
    user = rt.accounts.register("bench", "pw")
    requester = Requester(user.user_id, user.device_id, False, "")
    print(f"database: {url.split('://')[0]}")

    room = rt.room_creator.create(user.user_id, CreateRoomRequest())
    started = time.perf_counter()
    for i in range(args.sends):
        rt.rooms.send_message(requester, room, "m.room.message", {"body": str(i)}, f"s{i}")
    elapsed = time.perf_counter() - started
    print(f"sends into one room, one at a time: {args.sends / elapsed:.0f}/s")

    rooms = [rt.room_creator.create(user.user_id, CreateRoomRequest()) for _ in range(8)]
    started = time.perf_counter()
    jobs = [
        gevent.spawn(
            rt.rooms.send_message,
            requester,
            rooms[i % 8],
            "m.room.message",
            {"body": str(i)},
            f"p{i}",
        )
        for i in range(args.sends)
    ]
    gevent.joinall(jobs, raise_error=True)
    elapsed = time.perf_counter() - started
    print(f"sends across 8 rooms, all at once: {args.sends / elapsed:.0f}/s")

    started = time.perf_counter()
    created = 0
    for step in (100, 500, args.rooms):
        while created < step:
            rt.room_creator.create(
                user.user_id,
                CreateRoomRequest(visibility="public", name=f"Room {created}", topic="benchmark"),
            )
            created += 1
        first = rt.directory.public_rooms(20, None, RoomFilter())
        page = timed(lambda: rt.directory.public_rooms(20, None, RoomFilter()))
        later = timed(lambda: rt.directory.public_rooms(20, first["next_batch"], RoomFilter()))
        found = timed(lambda: rt.directory.public_rooms(20, None, RoomFilter("room 4")))
        print(
            f"{created:5d} published rooms: first page {page:.1f} ms, next page {later:.1f} ms,"
            f" search {found:.1f} ms"
        )
    rt.close()


if __name__ == "__main__":
    main()
