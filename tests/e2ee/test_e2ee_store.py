"""The E2EE store on both engines: the to-device bound, and one-time key claims racing in
greenlets straight on the store; with other instances, key writes heard by the others."""

import gevent
import pytest

from homeserver.storage import streams
from homeserver.storage.accounts import AccountStore
from homeserver.storage.announcements import StreamAnnouncements
from homeserver.storage.database import open_database
from homeserver.storage.e2ee import KEY_WRITES_STREAM, E2eeStore
from homeserver.storage.migrations import migrate
from homeserver.storage.stream_changes import StreamChanges
from homeserver.sync.cluster import ClusterWakes, KeptInMemory
from homeserver.sync.notifier import Notifier
from tests.sync.test_waiting import wait_until


@pytest.fixture
def store(database_url):
    db = open_database(database_url)
    migrate(db)
    accounts = AccountStore(db)
    accounts.create_user("@bob:x", None, False, 1)
    accounts.add_device_token("@bob:x", "PHONE", None, "hash", 1)
    yield E2eeStore(db)
    db.close()


def test_a_full_device_gets_no_more_messages_and_others_still_do(store):
    sender = ("@alice:x", "A")
    for n in range(3):
        stored, full, _ = store.send_to_device(
            sender, f"t{n}", "m.x", [("@bob:x", "PHONE", {"n": n})], 3, 1
        )
        assert stored and full == []
    stored, full, _ = store.send_to_device(
        sender, "t3", "m.x", [("@bob:x", "PHONE", {"n": 3}), ("@bob:x", "LAPTOP", {"n": 3})], 3, 1
    )
    assert stored and full == [("@bob:x", "PHONE")]  # past the bound: the newest is dropped
    held = store.to_device_messages("@bob:x", "PHONE", 0, 10**9, 100)
    assert [m.content["n"] for m in held] == [0, 1, 2]  # the first ones (an Olm pre-key) kept
    assert len(store.to_device_messages("@bob:x", "LAPTOP", 0, 10**9, 100)) == 1
    store.delete_to_device("@bob:x", "PHONE", held[-1].position)
    assert store.send_to_device(sender, "t4", "m.x", [("@bob:x", "PHONE", {})], 3, 1)[1] == []


def test_racing_claims_take_each_one_time_key_once(store):
    keys = [("signed_curve25519", f"K{n}", {"key": f"k{n}"}) for n in range(5)]
    assert store.add_one_time_keys("@bob:x", "PHONE", keys) == []
    store.set_fallback_keys("@bob:x", "PHONE", [("signed_curve25519", "F", {"key": "f"})])
    racers = [
        gevent.spawn(store.claim_key, "@bob:x", "PHONE", "signed_curve25519") for _ in range(12)
    ]
    gevent.joinall(racers, raise_error=True)
    claimed = [g.value[0] for g in racers]
    assert sorted(k for k in claimed if k != "F") == [f"K{n}" for n in range(5)]
    assert claimed.count("F") == 7
    assert store.unused_fallback_key_types("@bob:x", "PHONE") == []


def test_a_key_write_through_another_instance_is_counted_when_heard(pg_cluster):
    """With other instances, a key write announces itself on the `key_writes` stream; the
    other instance, hearing it (sync/cluster.py), stops trusting counts read before, and
    one instance alone takes no position."""
    url = pg_cluster.new_database()
    plain = open_database(url)
    migrate(plain)
    AccountStore(plain).create_user("@bob:x", None, False, 1)
    a, b = (E2eeStore(open_database(url, announce_as=name)) for name in ("a", "b"))
    wakes = ClusterWakes(
        StreamChanges(b.db),
        Notifier(lambda room_id: []),
        lambda user_id: [],
        KeptInMemory(keys_written=b.heard_key_writes),
    )
    listening = StreamAnnouncements(url, "b", wakes.on_positions)
    listening.start()
    try:
        wait_until(lambda: wakes.positions().get(KEY_WRITES_STREAM) == 0)
        read_at = b.key_writes
        a.add_one_time_keys("@bob:x", "PHONE", [("signed_curve25519", "k1", {"key": "x"})])
        wait_until(lambda: not b.keys_unchanged_since(read_at))
        assert wakes.positions()[KEY_WRITES_STREAM] == 1 and b.key_writes == read_at + 1
        assert a.claim_key("@bob:x", "PHONE", "signed_curve25519") is not None
        wait_until(lambda: wakes.positions()[KEY_WRITES_STREAM] == 2)
        assert b.key_writes == read_at + 2
        # One instance alone: counted where written, and no position taken.
        E2eeStore(plain).set_fallback_keys("@bob:x", "PHONE", [("signed_curve25519", "f", {})])
        assert plain.read(lambda tx: streams.current(tx, KEY_WRITES_STREAM)) == 2
    finally:
        listening.stop()
        for db in (plain, a.db, b.db):
            db.close()
