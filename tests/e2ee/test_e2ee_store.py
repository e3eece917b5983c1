"""The E2EE store on both engines: the to-device bound, and one-time key claims racing in
greenlets straight on the store."""

import gevent
import pytest

from homeserver.storage.accounts import AccountStore
from homeserver.storage.database import open_database
from homeserver.storage.e2ee import E2eeStore
from homeserver.storage.migrations import migrate


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
