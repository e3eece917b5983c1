"""The auth chain index (storage/auth_chains.py) against the definition: for random auth
graphs, indexed in batches in any order, and for events stored before the index existed
(migrated by storage/schema_steps.py), its auth difference is the one a walk gives. On
SQLite and on a real PostgreSQL cluster."""

from __future__ import annotations

import random

import pytest

from homeserver.core.events import Event
from homeserver.storage import auth_chains
from homeserver.storage.database import open_database
from homeserver.storage.event_rows import insert_event_row
from homeserver.storage.migrations import migrate

ROOM = "!room:weir.test"


def random_graph(seed: int, size: int) -> list[Event]:
    """`size` state events, oldest first, each citing 1 to 4 older ones as auth events
    (one of them often the newest: long chains and wide fans both), and now and then an
    auth event that was never stored."""
    rng = random.Random(seed)
    events: list[Event] = []
    for n in range(size):
        auth: set[str] = set()
        if events:
            auth.add(events[-1].event_id if rng.random() < 0.3 else rng.choice(events).event_id)
            auth.update(rng.choice(events).event_id for _ in range(rng.randint(0, 3)))
        if rng.random() < 0.05:
            auth.add(f"$unknown{n}")
        pdu = {
            "room_id": ROOM,
            "type": "m.room.member",
            "state_key": f"@u{n}:weir.test",
            "sender": f"@u{n}:weir.test",
            "content": {"membership": "join"},
            "auth_events": sorted(auth),
            "prev_events": [],
            "depth": n + 1,
            "origin_server_ts": n,
        }
        events.append(Event(f"$e{n}", pdu))
    return events


def walked_difference(events: list[Event], state_sets: list[dict]) -> set[str]:
    """The definition: each set's events and everything reachable through auth_events,
    stored ones only; in some of those chains and not in all."""
    known = {e.event_id: e for e in events}

    def chain(ids) -> set[str]:
        found, todo = set(), [i for i in ids if i in known]
        while todo:
            event_id = todo.pop()
            if event_id not in found:
                found.add(event_id)
                todo.extend(a for a in known[event_id].auth_event_ids if a in known)
        return found

    chains = [chain(s.values()) for s in state_sets]
    return set().union(*chains) - set.intersection(*chains)


def random_state_sets(events: list[Event], rng: random.Random) -> list[dict]:
    """Two or three sets that share most of their events, as forked states do."""
    shared = rng.sample(events, len(events) // 3)
    sets = []
    for _ in range(rng.randint(2, 3)):
        own = rng.sample(events, rng.randint(1, 20))
        sets.append({(e.type, e.state_key): e.event_id for e in [*shared, *own]})
    return sets


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_difference_is_the_walked_one_whatever_the_batches(db, seed):
    """Indexed in batches of any size, each given newest first (as history stores them):
    every event is placed after its auth events, and the differences match the walk."""
    rng = random.Random(seed)
    events = random_graph(seed, 400)
    start = 0
    while start < len(events):
        size = rng.randint(1, 60)
        batch = events[start : start + size]
        db.write(auth_chains.index_events, list(reversed(batch)))
        start += size
    db.write(auth_chains.index_events, events[:50])  # again: nothing changes
    positions = db.read(lambda tx: tx.fetchone("SELECT COUNT(*) FROM event_auth_positions")[0])
    assert positions == len(events)
    for _ in range(30):
        sets = random_state_sets(events, rng)
        assert db.read(auth_chains.auth_difference, sets) == walked_difference(events, sets)


def test_an_event_not_stored_yet_counts_as_its_auth_events_and_itself(db):
    """The received event whose resolution it is: in one set, not stored, not indexed."""
    events = random_graph(5, 120)
    db.write(auth_chains.index_events, events[:-1])
    received = events[-1]
    rng = random.Random(5)
    for _ in range(20):
        sets = random_state_sets(events[:-1], rng)
        sets[0][("received", "")] = received.event_id
        pending = {received.event_id: received.auth_event_ids}
        found = db.read(auth_chains.auth_difference, sets, pending)
        assert found == walked_difference(events, sets)
        assert received.event_id in found


def test_an_unindexed_event_asks_for_a_walk(db):
    events = random_graph(7, 20)
    db.write(auth_chains.index_events, events[:10])
    sets = [{("a", ""): events[3].event_id}, {("a", ""): events[15].event_id}]
    assert db.read(auth_chains.auth_difference, sets) is None


def test_messages_are_not_indexed(db):
    message = Event("$m", {"room_id": ROOM, "type": "m.room.message", "auth_events": []})
    db.write(auth_chains.index_events, [message])
    assert db.read(lambda tx: tx.fetchone("SELECT COUNT(*) FROM event_auth_positions")[0]) == 0


def test_events_stored_before_the_index_are_indexed_by_the_migration(empty_database_url):
    """A database at schema 27 holding a room's events opens, migrates, and its index gives
    the walked differences; events indexed after it continue its chains."""
    db = open_database(empty_database_url)
    try:
        migrate(db, until=27)
        events = random_graph(11, 300)
        rng = random.Random(11)
        order = events[:250]
        rng.shuffle(order)  # stored in any order, as history and outliers are

        def store(tx):
            tx.execute(
                "INSERT INTO rooms (room_id, room_version, creator, created_ts)"
                " VALUES (?, '10', '@u0:weir.test', 0)",
                (ROOM,),
            )
            for position, event in enumerate(order, start=1):
                insert_event_row(tx, event, position)

        db.write(store)
        migrate(db)
        for _ in range(20):
            sets = random_state_sets(events[:250], rng)
            assert db.read(auth_chains.auth_difference, sets) == walked_difference(events, sets)
        db.write(auth_chains.index_events, events[250:])
        for _ in range(20):
            sets = random_state_sets(events, rng)
            assert db.read(auth_chains.auth_difference, sets) == walked_difference(events, sets)
    finally:
        db.close()
