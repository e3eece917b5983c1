"""Property: following next_batch from sync to sync, with the gaps of limited timelines
filled through /messages from prev_batch, a client sees every event exactly once, in order,
whatever the sends, syncs and waiting syncs in between."""

import time

import gevent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.rooms.conftest import V3, create_room, send
from tests.sync.conftest import event_ids, metric, sync

operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("send"), st.sampled_from(["alice", "bob"]), st.integers(0, 1), st.integers(1, 4)
        ),
        st.tuples(st.just("state"), st.integers(0, 1)),
        st.tuples(st.just("sync"), st.sampled_from([1, 2, 3, 10])),
        st.tuples(st.just("wait_then_send"), st.sampled_from(["alice", "bob"]), st.integers(0, 1)),
    ),
    min_size=1,
    max_size=10,
)


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        gevent.sleep(0.01)


def test_incremental_tokens_never_lose_or_repeat_an_event(server, user):
    alice, bob = user("alice"), user("bob")
    clients = {"alice": alice, "bob": bob}
    creators = [alice, bob]
    notes = []

    @settings(
        max_examples=12,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(operations)
    def run(ops):
        rooms = [create_room(alice, invite=[bob.user_id]), create_room(bob, invite=[alice.user_id])]
        assert bob.post(f"{V3}/rooms/{rooms[0]}/join", json={}).status_code == 200
        assert alice.post(f"{V3}/rooms/{rooms[1]}/join", json={}).status_code == 200
        only_these = {"room": {"rooms": rooms}}
        start = since = sync(bob, sync_filter=only_these)["next_batch"]
        seen = {room_id: [] for room_id in rooms}

        def take(body: dict, since: str) -> str:
            for room_id, room in body["rooms"]["join"].items():
                events = event_ids(room["timeline"]["events"])
                if room["timeline"]["limited"]:
                    gap = bob.get(
                        f"{V3}/rooms/{room_id}/messages",
                        params={
                            "dir": "b",
                            "from": room["timeline"]["prev_batch"],
                            "to": since,
                            "limit": 1000,
                        },
                    ).json()
                    events = event_ids(gap["chunk"])[::-1] + events
                seen[room_id] += events
            return body["next_batch"]

        for op in ops:
            if op[0] == "send":
                for i in range(op[3]):
                    send(clients[op[1]], rooms[op[2]], f"message {i}")
            elif op[0] == "state":  # by the room's creator, who may set state
                notes.append(len(notes))
                r = creators[op[1]].put(
                    f"{V3}/rooms/{rooms[op[1]]}/state/org.example.note/", json={"n": notes[-1]}
                )
                assert r.status_code == 200, r.text
            elif op[0] == "sync":
                since = take(
                    sync(
                        bob,
                        since,
                        sync_filter={"room": {"rooms": rooms, "timeline": {"limit": op[1]}}},
                    ),
                    since,
                )
            else:
                waiting = gevent.spawn(sync, bob, since, timeout=30_000, sync_filter=only_these)
                wait_until(lambda: metric(server, "weir_sync_waiters") >= 1 or waiting.ready())
                send(clients[op[1]], rooms[op[2]], "woken")
                since = take(waiting.get(timeout=30), since)
        take(sync(bob, since, sync_filter=only_these), since)

        for room_id in rooms:
            truth = bob.get(
                f"{V3}/rooms/{room_id}/messages", params={"dir": "f", "from": start, "limit": 1000}
            ).json()
            assert seen[room_id] == event_ids(truth["chunk"])
            assert len(set(seen[room_id])) == len(seen[room_id])

    run()
