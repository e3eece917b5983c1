"""SQLite reads queued while every reader is busy run in batches: one transaction each, one
trip through the threadpool (homeserver/storage/database.py)."""

import sqlite3

import gevent
import pytest
from gevent import monkey

from homeserver.storage.database import SqliteDatabase

# A read blocks its native thread on this until the test lets it go.
NativeEvent = monkey.get_original("threading", "Event")


@pytest.fixture
def db(tmp_path):
    database = SqliteDatabase(str(tmp_path / "reads.db"), readers=1)
    database.write(lambda tx: tx.execute("CREATE TABLE t (v INTEGER)"))
    database.write(lambda tx: tx.execute("INSERT INTO t VALUES (1)"))
    yield database
    database.close()


def value(tx) -> int:
    return tx.fetchone("SELECT v FROM t")[0]


def hold_the_reader(db):
    """The one reader, busy until the returned event is set."""
    started, release = NativeEvent(), NativeEvent()

    def blocking(tx):
        started.set()
        release.wait(10)
        return "held"

    holder = gevent.spawn(db.read, blocking)
    with gevent.Timeout(10):
        while not started.is_set():
            gevent.sleep(0.001)  # a native event has no greenlet to wake
    return holder, release


def test_reads_queued_behind_a_busy_reader_share_one_transaction(db, tmp_path):
    """The first queued read changes the row through a connection of its own; the second
    still sees the old value: both ran in one read transaction, on one snapshot."""
    holder, release = hold_the_reader(db)

    def read_then_write_elsewhere(tx):
        before = value(tx)  # the read transaction's snapshot starts here
        other = sqlite3.connect(str(tmp_path / "reads.db"), isolation_level=None)
        other.execute("UPDATE t SET v = 2")
        other.close()
        return before

    first = gevent.spawn(db.read, read_then_write_elsewhere)
    second = gevent.spawn(db.read, value)
    gevent.sleep(0)
    assert db.waiting_reads == 2
    release.set()
    assert (holder.get(), first.get(), second.get()) == ("held", 1, 1)
    assert db.read(value) == 2  # a later transaction sees the write
    assert db.waiting_reads == 0


def test_a_failing_read_fails_alone_and_a_read_given_up_never_runs(db):
    holder, release = hold_the_reader(db)
    ran = []

    def failing(tx):
        raise ValueError("no such thing")

    def abandoned(tx):
        ran.append("abandoned")

    bad = gevent.spawn(db.read, failing)
    gone = gevent.spawn(db.read, abandoned)
    good = gevent.spawn(db.read, value)
    gevent.sleep(0)
    gone.kill()  # its client hung up while it waited
    assert db.waiting_reads == 2
    release.set()
    assert holder.get() == "held" and good.get() == 1
    with pytest.raises(ValueError):
        bad.get()
    assert ran == [] and db.waiting_reads == 0
