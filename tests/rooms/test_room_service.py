"""The room service in-process, on a real database: the persist hook, locks, tokens."""

import gevent
import pytest
from gevent.event import Event as GEvent

from homeserver.config import parse_config
from homeserver.core.concurrency import KeyedLocks
from homeserver.core.requester import Requester
from homeserver.rooms.creation import CreateRoomRequest
from homeserver.runtime import HomeserverRuntime
from tests.rooms.conftest import V3, create_room, send
from tests.support.server import MatrixClient


@pytest.fixture
def runtime(tmp_path, database_url):
    rt = HomeserverRuntime(
        parse_config(
            {"server_name": "hs.test", "data_dir": str(tmp_path), "database": {"url": database_url}}
        )
    )
    yield rt
    rt.close()


def test_persist_listeners_hear_every_event_in_stream_order(runtime):
    heard = []
    runtime.rooms.add_persist_listener(lambda events: heard.extend(events))
    runtime.rooms.add_persist_listener(lambda events: 1 / 0)  # a failing listener is contained
    alice = runtime.accounts.register("alice", "pw")
    requester = Requester(alice.user_id, alice.device_id, False, "")
    room_id = runtime.room_creator.create(alice.user_id, CreateRoomRequest(name="Heard"))
    jobs = [
        gevent.spawn(
            runtime.rooms.send_message,
            requester,
            room_id,
            "m.room.message",
            {"body": str(i)},
            f"t{i}",
        )
        for i in range(5)
    ]
    gevent.joinall(jobs, raise_error=True)

    positions = [s.stream_ordering for s in heard]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert positions[-1] == runtime.rooms.store.stream_position()
    assert [s.event.type for s in heard][:2] == ["m.room.create", "m.room.member"]
    assert {j.value for j in jobs} == {s.event.event_id for s in heard[-5:]}


def test_keyed_locks_serialise_one_key_and_forget_idle_keys():
    locks = KeyedLocks()
    inside, release = GEvent(), GEvent()
    order = []

    def holder():
        with locks.hold("!a"):
            order.append("first in")
            inside.set()
            release.wait()
            order.append("first out")

    def waiter():
        with locks.hold("!a"):
            order.append("second in")

    first = gevent.spawn(holder)
    inside.wait()
    second = gevent.spawn(waiter)
    killed = gevent.spawn(waiter)
    gevent.sleep(0)  # both waiters now wait on the lock
    with locks.hold("!b"):  # another key does not wait
        order.append("other key")
    killed.kill()  # a waiter that gives up leaves nothing behind
    release.set()
    gevent.joinall([first, second])
    assert order == ["first in", "other key", "first out", "second in"]
    assert len(locks) == 0


def test_messages_tokens_survive_a_restart(start_weir, database_url):
    weir = start_weir({"database": {"url": database_url}})
    alice = MatrixClient(weir.client_url)
    alice.register("alice")
    room_id = create_room(alice)
    sent = [send(alice, room_id, f"m{i}") for i in range(6)]
    page = alice.get(f"{V3}/rooms/{room_id}/messages", params={"dir": "b", "limit": 2}).json()
    assert [e["event_id"] for e in page["chunk"]] == sent[:-3:-1]

    weir.stop()
    weir.start()
    alice = MatrixClient(weir.client_url)
    alice.login("alice")
    after = alice.get(
        f"{V3}/rooms/{room_id}/messages", params={"dir": "b", "limit": 2, "from": page["end"]}
    ).json()
    assert [e["event_id"] for e in after["chunk"]] == [sent[3], sent[2]]
