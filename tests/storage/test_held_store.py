"""Held PDUs in the received-transaction store, on SQLite and on a real PostgreSQL cluster:
one row per origin and event, the origin's cap shared with its staged transactions (a
transaction staged and held from counted once), one cap on every origin's bytes together, and
the retry schedule."""

import pytest

from homeserver.storage.database import open_database
from homeserver.storage.migrations import migrate
from homeserver.storage.transactions import HeldPdu, ReceivedTransactionStore, StagingCaps

ORIGIN, OTHER = "a.test", "b.test"


def caps(pdus: int, total: int = 10**9) -> StagingCaps:
    return StagingCaps(per_origin_pdus=pdus, per_origin_bytes=10**6, total_bytes=total)


@pytest.fixture
def store(database_url):
    database = open_database(database_url)
    migrate(database)
    yield ReceivedTransactionStore(database)
    database.close()


def held(n: int, origin: str = ORIGIN, next_try: int = 100) -> HeldPdu:
    return HeldPdu(origin, f"$e{n}", {"n": n}, "10.0.0.1", 10, next_try)


def test_a_pdu_is_held_once_and_counts_against_its_origins_cap(store):
    body = {"pdus": [{"n": i} for i in range(3)]}
    assert store.stage(ORIGIN, "t1", body, caps(5), 1)
    # t1's three staged, and two held from t2: the cap of five is full.
    assert store.hold(held(1), "t2", caps(5)) and store.hold(held(2), "t2", caps(5))
    assert not store.hold(held(3), "t2", caps(5))
    assert store.hold(held(1), "t2", caps(5))  # held already: no more room needed
    assert store.hold(held(3, OTHER), "t2", caps(5))  # another origin's own cap
    # Held while t1 itself is applied: its staged row counts them already.
    assert store.hold(held(4), "t1", caps(6))
    assert not store.stage(ORIGIN, "t3", {"pdus": [{}]}, caps(6), 1)
    assert store.held_count() == 4


def test_a_transaction_staged_after_its_pdus_were_held_counts_them_once(store):
    assert store.hold(held(1), "t1", caps(3)) and store.hold(held(2), "t1", caps(3))
    assert store.stage(ORIGIN, "t1", {"pdus": [{}, {}, {}]}, caps(3), 1)
    assert not store.stage(ORIGIN, "t2", {"pdus": [{}]}, caps(3), 1)


def test_every_origins_work_together_has_one_cap_in_bytes(store):
    """A server under many names has each name's own cap: the total bounds them all."""
    body = {"pdus": [{"pad": "x" * 100}]}
    size = len('{"pdus":[{"pad":"' + "x" * 100 + '"}]}')
    total = caps(10, total=3 * size)
    for n in range(3):
        assert store.stage(f"name{n}.test", "t1", body, total, 1)
    assert not store.stage("name3.test", "t1", body, total, 1)
    assert not store.hold(held(1, "name3.test"), "t2", total)
    # The same transaction ID from another origin is another transaction: still counted.
    assert not store.stage("name0.test", "t9", body, total, 1)
    assert store.staged_count() == 3
    store.record("name0.test", "t1", {"pdus": {}}, 2)  # applied: its room is free again
    assert store.stage("name3.test", "t1", body, total, 1)


def test_due_held_pdus_come_in_order_and_are_put_off(store):
    for n, next_try in ((1, 300), (2, 100), (3, 200)):
        store.hold(held(n, next_try=next_try), "t", caps(10))
    store.hold(held(4, OTHER, 150), "t", caps(10))
    assert [h.event_id for h in store.held_due(250, 10)] == ["$e2", "$e4", "$e3"]
    first = store.held_due(100, 10)[0]
    assert (first.pdu, first.source_ip, first.tries) == ({"n": 2}, "10.0.0.1", 0)
    store.retry_held_later(first.row_id, 1, 1000)
    store.postpone_held(ORIGIN, 1000)  # its origin's others wait with it, not OTHER's
    assert [h.event_id for h in store.held_due(999, 10)] == ["$e4"]
    assert store.held_next_try() == 150
    store.release_held(first.row_id)
    assert store.held_count() == 3


def test_each_instance_resumes_and_retries_only_its_own_work(store):
    """Two instances on one database: what one staged or held, the other never applies."""
    other = ReceivedTransactionStore(store.db, "b")
    assert store.stage(ORIGIN, "t1", {"pdus": [{}]}, caps(10), 1)
    assert other.stage(ORIGIN, "t2", {"pdus": [{}]}, caps(10), 1)
    assert [txn for _, txn, _ in store.staged()] == ["t1"]
    assert [txn for _, txn, _ in other.staged()] == ["t2"]
    assert store.hold(held(1), "t1", caps(10))
    assert other.hold(held(2), "t2", caps(10))
    assert other.hold(held(1), "t2", caps(10))  # held already, by main: not held twice
    assert [h.event_id for h in store.held_due(1000, 10)] == ["$e1"]
    assert [h.event_id for h in other.held_due(1000, 10)] == ["$e2"]
    other.postpone_held(ORIGIN, 5000)
    assert [h.event_id for h in store.held_due(1000, 10)] == ["$e1"]
    assert (store.held_count(), other.held_count()) == (1, 1)
    # The caps are the database's: both instances' work counts against the origin's.
    assert not other.stage(ORIGIN, "t3", {"pdus": [{}]}, caps(4), 1)
