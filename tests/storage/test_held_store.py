"""Held PDUs in the received-transaction store, on SQLite and on a real PostgreSQL cluster:
one row per origin and event, the origin's cap shared with its staged transactions (a
transaction staged and held from counted once), and the retry schedule."""

import pytest

from homeserver.storage.database import open_database
from homeserver.storage.migrations import migrate
from homeserver.storage.transactions import HeldPdu, ReceivedTransactionStore

ORIGIN, OTHER = "a.test", "b.test"


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
    assert store.stage(ORIGIN, "t1", body, 5, 10**6, 1)
    # t1's three staged, and two held from t2: the cap of five is full.
    assert store.hold(held(1), "t2", 5, 10**6) and store.hold(held(2), "t2", 5, 10**6)
    assert not store.hold(held(3), "t2", 5, 10**6)
    assert store.hold(held(1), "t2", 5, 10**6)  # held already: no more room needed
    assert store.hold(held(3, OTHER), "t2", 5, 10**6)  # another origin's own cap
    # Held while t1 itself is applied: its staged row counts them already.
    assert store.hold(held(4), "t1", 6, 10**6)
    assert not store.stage(ORIGIN, "t3", {"pdus": [{}]}, 6, 10**6, 1)
    assert store.held_count() == 4


def test_a_transaction_staged_after_its_pdus_were_held_counts_them_once(store):
    assert store.hold(held(1), "t1", 3, 10**6) and store.hold(held(2), "t1", 3, 10**6)
    assert store.stage(ORIGIN, "t1", {"pdus": [{}, {}, {}]}, 3, 10**6, 1)
    assert not store.stage(ORIGIN, "t2", {"pdus": [{}]}, 3, 10**6, 1)


def test_due_held_pdus_come_in_order_and_are_put_off(store):
    for n, next_try in ((1, 300), (2, 100), (3, 200)):
        store.hold(held(n, next_try=next_try), "t", 10, 10**6)
    store.hold(held(4, OTHER, 150), "t", 10, 10**6)
    assert [h.event_id for h in store.held_due(250, 10)] == ["$e2", "$e4", "$e3"]
    first = store.held_due(100, 10)[0]
    assert (first.pdu, first.source_ip, first.tries) == ({"n": 2}, "10.0.0.1", 0)
    store.retry_held_later(first.row_id, 1, 1000)
    store.postpone_held(ORIGIN, 1000)  # its origin's others wait with it, not OTHER's
    assert [h.event_id for h in store.held_due(999, 10)] == ["$e4"]
    assert store.held_next_try() == 150
    store.release_held(first.row_id)
    assert store.held_count() == 3
