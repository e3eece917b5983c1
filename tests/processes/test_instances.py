"""Several Weir instances on one PostgreSQL, as real processes: another instance's message
wakes a parked /sync, answered from memory (after a lost listening connection too, and for
a local message after an unheard one of the other), tokens travel between instances,
concurrent writes through both reach every sync once and in order, a join elsewhere
reaches push rules, one instance at a time sends to a destination (and resends the
transaction a killed holder left unanswered, same ID); and the refusals: SQLite with
several instances or a second process on one SQLite file, and a duplicate instance_name,
exit 2 with one line."""

import itertools
import json
import os
import signal
import time

import gevent
import pytest

from tests.peers.origins import OriginKeyServer
from tests.peers.receiver import TransactionSink
from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.metrics import metric, wait_for_metric
from tests.support.remote_room import room_joined_by
from tests.support.server import (
    MatrixClient,
    WeirProcess,
    base_settings,
    merge,
    run_app,
    write_config,
)

SYNC = "/_matrix/client/v3/sync"
WEIR_IP, SENDER_PEER_IP = "127.66.0.1", "127.66.0.2"
# No timeline gaps: every event a sync answers is in its timeline.
FILTER = json.dumps({"room": {"timeline": {"limit": 1000}}})


@pytest.fixture
def two_instances(pg_cluster, start_weir, tmp_path):
    """Instances "a" and "b" of one server: one database, one data directory (the signing
    key and media are the server's, not an instance's)."""
    url = pg_cluster.new_database()
    shared = {
        "database": {"url": url},
        "data_dir": str(tmp_path / "shared-data"),
        "cluster": {"instances": 2},
    }
    a = start_weir(merge(shared, {"instance_name": "a"}), name="a")
    b = start_weir(merge(shared, {"instance_name": "b"}), name="b")
    return a, b, url


def client(proc: WeirProcess, token: str | None = None) -> MatrixClient:
    return MatrixClient(proc.client_url, token)


def sync(proc: WeirProcess, token: str, since: str | None = None, timeout_ms: int = 0) -> dict:
    params = {"timeout": timeout_ms, "filter": FILTER}
    if since:
        params["since"] = since
    r = client(proc, token).get(SYNC, params=params, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def timeline(answer: dict, room_id: str) -> list[dict]:
    room = answer.get("rooms", {}).get("join", {}).get(room_id)
    if room is None:
        return []
    assert not room["timeline"].get("limited"), "a gap in the timeline"
    return room["timeline"]["events"]


def shared_room(a: WeirProcess, b: WeirProcess) -> tuple[MatrixClient, MatrixClient, str]:
    """alice on a, bob on b, both joined to a room alice made."""
    alice, bob = client(a), client(b)
    alice.register("alice")
    bob.register("bob")
    r = alice.post("/_matrix/client/v3/createRoom", json={"invite": ["@bob:weir.test"]})
    assert r.status_code == 200, r.text
    room_id = r.json()["room_id"]
    r = bob.post(f"/_matrix/client/v3/rooms/{room_id}/join", json={})
    assert r.status_code == 200, r.text
    return alice, bob, room_id


def send(c: MatrixClient, room_id: str, body: str) -> str:
    r = c.put(
        f"/_matrix/client/v3/rooms/{room_id}/send/m.room.message/{body}",
        json={"msgtype": "m.text", "body": body},
    )
    assert r.status_code == 200, r.text
    return r.json()["event_id"]


def test_a_message_through_one_instance_wakes_a_sync_parked_on_the_other(two_instances):
    a, b, _ = two_instances
    alice, bob, room_id = shared_room(a, b)
    since = sync(b, bob.token)["next_batch"]
    parked = gevent.spawn(sync, b, bob.token, since, 30_000)
    wait_for_metric(b.client_url, "weir_sync_waiters", 1, timeout=15)
    started = time.monotonic()
    event_id = send(alice, room_id, "hello-from-a")
    answer = parked.get(timeout=30)
    # Well within the 30 s long-poll: woken, not timed out.
    assert time.monotonic() - started < 10
    assert [e["event_id"] for e in timeline(answer, room_id)] == [event_id]
    assert metric(b.client_url, "weir_cluster_wakes_total") >= 1
    # B read a's event once, and the woken sync answered from memory, as on a.
    wakes = "weir_sync_wakes_total"
    assert metric(b.client_url, wakes, answered_from="recent_events") == 1
    assert metric(b.client_url, wakes, answered_from="database") == 0
    # A's token works on B and the other way round: the same positions.
    from_a = sync(a, bob.token)["next_batch"]
    assert timeline(sync(b, bob.token, from_a), room_id) == []
    later = send(bob, room_id, "hello-from-b")
    assert [e["event_id"] for e in timeline(sync(a, bob.token, from_a), room_id)] == [later]


def test_other_streams_wake_a_sync_parked_on_the_other_instance(two_instances):
    a, b, _ = two_instances
    alice, bob, room_id = shared_room(a, b)
    event_id = send(alice, room_id, "read me")
    since = sync(a, alice.token)["next_batch"]
    parked = gevent.spawn(sync, a, alice.token, since, 30_000)
    wait_for_metric(a.client_url, "weir_sync_waiters", 1, timeout=15)
    r = bob.post(f"/_matrix/client/v3/rooms/{room_id}/receipt/m.read/{event_id}", json={})
    assert r.status_code == 200, r.text
    answer = parked.get(timeout=30)
    ephemeral = answer["rooms"]["join"][room_id]["ephemeral"]["events"]
    receipts = [e for e in ephemeral if e["type"] == "m.receipt"]
    assert receipts and "@bob:weir.test" in receipts[0]["content"][event_id]["m.read"]
    # Account data written on b wakes alice's own sync on a.
    since = answer["next_batch"]
    parked = gevent.spawn(sync, a, alice.token, since, 30_000)
    wait_for_metric(a.client_url, "weir_sync_waiters", 1, timeout=15)
    r = client(b, alice.token).put(
        "/_matrix/client/v3/user/@alice:weir.test/account_data/org.example.x", json={"v": 1}
    )
    assert r.status_code == 200, r.text
    answer = parked.get(timeout=30)
    types = [e["type"] for e in answer["account_data"]["events"]]
    assert "org.example.x" in types


def test_concurrent_writes_through_both_reach_every_sync_once_in_order(two_instances):
    a, b, url = two_instances
    alice, bob, shared = shared_room(a, b)
    own = {}
    for name, c in (("alice", alice), ("bob", bob)):
        r = c.post("/_matrix/client/v3/createRoom", json={})
        assert r.status_code == 200, r.text
        own[name] = r.json()["room_id"]
    n = 30
    sent: dict[str, list[str]] = {"alice": [], "bob": []}

    def writer(name: str, c: MatrixClient) -> None:
        for i in range(n):
            sent[name].append(send(c, shared, f"{name}-shared-{i}"))
            send(c, own[name], f"{name}-own-{i}")

    def reader(token: str, procs: tuple[WeirProcess, ...], since: str) -> list[str]:
        """Incremental syncs while the writes go on, each on the next instance in turn."""
        seen: list[str] = []
        turn = 0
        with gevent.Timeout(120, AssertionError(f"saw {len(seen)} of {2 * n}")):
            while len(seen) < 2 * n:
                turn += 1
                answer = sync(procs[turn % len(procs)], token, since, 2_000)
                seen += [e["event_id"] for e in timeline(answer, shared)]
                since = answer["next_batch"]
        return seen

    # Tokens taken before the writes: every message arrives through incremental syncs.
    readers = [
        gevent.spawn(reader, token, procs, sync(procs[0], token)["next_batch"])
        for token, procs in ((alice.token, (a, b)), (bob.token, (b, a)), (bob.token, (b,)))
    ]
    writers = [gevent.spawn(writer, "alice", alice), gevent.spawn(writer, "bob", bob)]
    gevent.joinall(writers, raise_error=True)
    seen = [r.get(timeout=150) for r in readers]
    for sequence in seen:
        assert len(sequence) == len(set(sequence)) == 2 * n  # once each, none missing
        assert set(sequence) == set(sent["alice"]) | set(sent["bob"])
        for name in sent:  # each writer's messages in the order it sent them
            assert [e for e in sequence if e in sent[name]] == sent[name]
    # The same order on both instances, whichever instance each sync asked.
    assert seen[0] == seen[1] == seen[2]
    # And /messages agrees on the room's order, on either instance.
    for proc in (a, b):
        r = client(proc, bob.token).get(
            f"/_matrix/client/v3/rooms/{shared}/messages", params={"dir": "b", "limit": 1000}
        )
        ids = [e["event_id"] for e in r.json()["chunk"] if e["event_id"] in seen[0]]
        assert list(reversed(ids)) == seen[0]
    # Writers to one room take turns across instances: each event follows the one before,
    # and the room never forked.
    assert prev_counts(url, shared) == {1}


def prev_counts(url: str, room_id: str) -> set[int]:
    """How many prev_events the room's events after its create event name."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT json FROM events WHERE room_id = %s AND type <> 'm.room.create'", (room_id,)
        ).fetchall()
    return {len(json.loads(text)["prev_events"]) for (text,) in rows}


def test_a_duplicate_instance_name_exits_2(pg_cluster, start_weir, tmp_path):
    url = pg_cluster.new_database()
    settings = {"database": {"url": url}, "cluster": {"instances": 2}, "instance_name": "a"}
    start_weir(settings, name="first")
    config = write_settings(tmp_path / "second", settings)
    result = run_app(["--config", config], cwd=str(tmp_path / "second"))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "weir: an instance named 'a' already serves this database:"
        " instance_name must be unique per instance"
    ]


def test_sqlite_with_several_instances_exits_2(tmp_path):
    config = write_settings(tmp_path / "one", {"cluster": {"instances": 2}})
    result = run_app(["--config", config], cwd=str(tmp_path / "one"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "config: cluster.instances: several instances need PostgreSQL:"
        " SQLite is served by one process."
    ]


def test_a_second_process_on_one_sqlite_file_exits_2(start_weir, tmp_path):
    first = start_weir({}, name="first")
    database = os.path.join(tmp_path, "first", "data", "homeserver.db")
    assert os.path.exists(database)
    config = write_settings(tmp_path / "second", {"database": {"url": f"sqlite:///{database}"}})
    result = run_app(["--config", config], cwd=str(tmp_path / "second"))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("weir: another Weir process serves")
    # The first is unharmed.
    assert client(first).get("/_matrix/client/versions").status_code == 200


def write_settings(directory, overrides: dict) -> str:
    directory.mkdir(exist_ok=True)
    path = str(directory / "config.toml")
    write_config(path, merge(base_settings(str(directory / "data")), overrides))
    return path


def test_a_join_through_one_instance_is_counted_by_the_others_push_rules(two_instances):
    """Push actions keep each room's members in memory: a join through b makes a forget
    them, so alice's next message through a notifies bob."""
    a, b, _ = two_instances
    alice, bob = client(a), client(b)
    alice.register("alice")
    bob.register("bob")
    r = alice.post("/_matrix/client/v3/createRoom", json={"invite": ["@bob:weir.test"]})
    room_id = r.json()["room_id"]
    send(alice, room_id, "before-bob")  # a keeps the room's members: alice alone
    since = sync(a, alice.token)["next_batch"]
    parked = gevent.spawn(sync, a, alice.token, since, 30_000)
    wait_for_metric(a.client_url, "weir_sync_waiters", 1, timeout=15)
    r = bob.post(f"/_matrix/client/v3/rooms/{room_id}/join", json={})
    assert r.status_code == 200, r.text
    # a woke alice for the join, which it does after forgetting the room's members.
    joined = [e for e in timeline(parked.get(timeout=30), room_id) if e["type"] == "m.room.member"]
    assert [e["state_key"] for e in joined] == ["@bob:weir.test"]
    send(alice, room_id, "for-bob")
    room = sync(b, bob.token)["rooms"]["join"][room_id]
    assert room["unread_notifications"]["notification_count"] == 1


@pytest.fixture(scope="module")
def sender_keys(test_ca, dns):
    with OriginKeyServer("instances.test", test_ca, dns, host=SENDER_PEER_IP) as server:
        yield server


def test_one_instance_at_a_time_sends_to_a_destination(
    pg_cluster, start_weir, tmp_path, test_ca, dns, sender_keys
):
    """Both instances write events a remote server must get; the destination's lease lets
    one send at a time: every PDU arrives once, never two transactions at once; and when
    the holder is killed, the other takes the destination over."""
    sink = TransactionSink(sender_keys)
    fed = federation_settings(test_ca, dns, remote_timeout=2)
    fed.update(tls_listener_settings(test_ca, "weir.test", WEIR_IP, port=0))
    shared = {
        "database": {"url": pg_cluster.new_database()},
        "data_dir": str(tmp_path / "shared-data"),
        # A destination's lease lasts remote_timeout + 2 s: 4 s.
        "cluster": {"instances": 2, "queue_lease": 1},
        "federation": fed,
    }
    a = start_weir(merge(shared, {"instance_name": "a"}), name="a")
    b = start_weir(merge(shared, {"instance_name": "b"}), name="b")
    sink.trust("weir.test", a.federation_url, test_ca)  # one signing key: the shared data_dir
    origin = sender_keys.add_origin("remote")
    alice, bob = client(a), client(b)
    alice.register("alice")
    bob.register("bob")
    room, _ = room_joined_by(a, test_ca, alice, origin)
    r = bob.post(f"/_matrix/client/v3/rooms/{room.room_id}/join", json={})
    assert r.status_code == 200, r.text
    expected = {f"{who}-{i}" for who in ("alice", "bob") for i in range(10)}
    writers = [
        gevent.spawn(lambda c=c, who=who: [send(c, room.room_id, f"{who}-{i}") for i in range(10)])
        for c, who in ((alice, "alice"), (bob, "bob"))
    ]
    gevent.joinall(writers, raise_error=True)

    def bodies() -> list:
        return [p["content"].get("body") for p in sink.pdus(origin.name)]

    # Each instance's events wake the holder (runtime/queues.py), or the other looks again
    # when the lease lapses: well within this wait.
    assert sink.wait_until(lambda: expected <= set(bodies()), timeout=60), sink.attempts(
        origin.name
    )
    messages = [body for body in bodies() if body in expected]
    assert len(messages) == len(expected)  # none sent twice
    assert sink.max_in_flight[origin.name] == 1  # one sender at a time
    holder = lease_owner(shared["database"]["url"], origin.name)
    read_receipt_goes_through_the_holder(sink, origin, room.room_id, holder, alice, bob)
    # The holder dies in a call, its transaction received and unanswered; a message
    # through the other instance waits for the holder's lease to lapse (4 s after its
    # last claim), then that instance takes over: the same transaction first, same ID.
    dead, taker, through = (a, "b", bob) if holder == "a" else (b, "a", alice)
    sink.hold(origin.name)
    send(alice if holder == "a" else bob, room.room_id, "held")
    assert sink.wait_until(lambda: sink.in_flight.get(origin.name, 0) == 1, timeout=30)
    dead.proc.send_signal(signal.SIGKILL)
    dead.proc.wait()
    received = len(sink.transactions)
    sink.release(origin.name)  # answered to nobody
    assert sink.wait_until(lambda: len(sink.transactions) > received)
    unanswered = sink.transactions[received]
    send(through, room.room_id, "after-the-holder")
    assert sink.wait_until(lambda: {"held", "after-the-holder"} <= set(bodies()), timeout=60)
    assert lease_owner(shared["database"]["url"], origin.name) == taker
    again = [t for t in sink.attempts(origin.name) if t.txn_id == unanswered.txn_id]
    assert len(again) == 2 and again[1].body["pdus"] == unanswered.body["pdus"]
    assert_each_in_one_transaction(sink, origin.name, expected | {"held", "after-the-holder"})


def assert_each_in_one_transaction(sink, destination: str, expected: set[str]) -> None:
    """Every message arrived, each under one transaction ID (sent again only as the same
    transaction), and different transactions have different IDs."""
    assert sink.ids_keep_their_pdus(destination)
    ids_of: dict[str, set[str]] = {}  # each PDU (by its content hash): the IDs it came in
    for t in sink.accepted(destination):
        for pdu in t.body["pdus"]:
            ids_of.setdefault(pdu["hashes"]["sha256"], set()).add(t.txn_id)
    bodies = {p["content"].get("body") for t in sink.accepted(destination) for p in t.body["pdus"]}
    assert expected <= bodies
    assert all(len(ids) == 1 for ids in ids_of.values()), ids_of


def read_receipt_goes_through_the_holder(sink, origin, room_id, holder, alice, bob) -> None:
    """While the holder of the destination's lease keeps sending (so it never lapses), a
    read receipt through the other instance, which only that instance's memory holds,
    reaches the destination: handed over through the durable outbox, the holder told."""
    keeps, other = (alice, bob) if holder == "a" else (bob, alice)
    event_id = send(other, room_id, "read-me")

    def receipted() -> bool:
        receipts = [e for e in sink.edus(origin.name) if e["edu_type"] == "m.receipt"]
        return any(event_id in json.dumps(e["content"]) for e in receipts)

    def keep_sending() -> None:
        for i in itertools.count():
            send(keeps, room_id, f"keep-{i}")

    busy = gevent.spawn(keep_sending)
    try:
        r = other.post(f"/_matrix/client/v3/rooms/{room_id}/receipt/m.read/{event_id}", json={})
        assert r.status_code == 200, r.text
        assert sink.wait_until(receipted, timeout=30), "the receipt never left its instance"
    finally:
        busy.kill()
    assert sink.max_in_flight[origin.name] == 1


def lease_owner(url: str, destination: str) -> str:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT lease_owner FROM federation_destinations WHERE destination = %s",
            (destination,),
        ).fetchone()
    return row[0]


def test_a_lost_listening_connection_is_replaced_and_misses_nothing(two_instances):
    """b's LISTEN connection is ended by the database; a message sent through a before b
    listens again still wakes bob's sync on b, read from where b had got to."""
    a, b, url = two_instances
    alice, bob, room_id = shared_room(a, b)
    since = sync(b, bob.token)["next_batch"]
    parked = gevent.spawn(sync, b, bob.token, since, 30_000)
    wait_for_metric(b.client_url, "weir_sync_waiters", 1, timeout=15)
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        ended = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'weir-listen-b'"
        ).fetchall()
        assert ended == [(True,)]
        # Sent while b is not listening: b reconnects a second after it notices.
        started = time.monotonic()
        event_id = send(alice, room_id, "while-b-was-away")
    answer = parked.get(timeout=30)
    assert time.monotonic() - started < 10  # woken, not the long-poll's end
    assert [e["event_id"] for e in timeline(answer, room_id)] == [event_id]
    assert metric(b.client_url, "weir_cluster_listen_reconnects_total") == 1


def test_a_local_message_after_an_unheard_one_from_the_other_wakes_from_memory(two_instances):
    """a does not hear b for a while (its LISTEN connection ended): carol's message through
    b, then alice's through a. a reads carol's before waking bob's sync for alice's, and
    answers it from memory, not from the database."""
    a, b, url = two_instances
    alice, bob, room_id = shared_room(a, b)
    carol = client(b)
    carol.register("carol")
    r = carol.post("/_matrix/client/v3/createRoom", json={})
    assert r.status_code == 200, r.text
    carols = r.json()["room_id"]
    since = sync(a, bob.token)["next_batch"]
    parked = gevent.spawn(sync, a, bob.token, since, 30_000)
    wait_for_metric(a.client_url, "weir_sync_waiters", 1, timeout=15)
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        ended = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'weir-listen-a'"
        ).fetchall()
        assert ended == [(True,)]
    send(carol, carols, "unheard-on-a")  # a listens again a second after it notices
    event_id = send(alice, room_id, "after-it")
    answer = parked.get(timeout=30)
    assert [e["event_id"] for e in timeline(answer, room_id)] == [event_id]
    assert carols not in answer["rooms"]["join"]
    wakes = "weir_sync_wakes_total"
    assert metric(a.client_url, wakes, answered_from="recent_events") == 1
    assert metric(a.client_url, wakes, answered_from="database") == 0
