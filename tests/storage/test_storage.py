"""The database layer and the account store, on SQLite and on a real PostgreSQL cluster."""

import time

import gevent
import pytest

from homeserver.storage.accounts import AccountStore
from homeserver.storage.database import SqliteDatabase, open_database
from homeserver.storage.migrations import available_migrations, migrate


def test_migrations_apply_once_and_record_the_version(db):
    latest = available_migrations()[-1][0]
    assert migrate(db) == latest  # a second run applies nothing and reports the same version
    rows = db.read(lambda tx: tx.fetchall("SELECT version FROM schema_version ORDER BY version"))
    assert [r[0] for r in rows] == [v for v, _, _ in available_migrations()]


def test_transaction_rolls_back_on_error(db):
    def failing(tx):
        tx.execute("INSERT INTO users (user_id, created_ts) VALUES (?, ?)", ("@a:x", 1))
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        db.write(failing)
    assert db.read(lambda tx: tx.fetchone("SELECT COUNT(*) FROM users"))[0] == 0


def test_unique_violation_is_recognised(db):
    db.write(
        lambda tx: tx.execute("INSERT INTO users (user_id, created_ts) VALUES (?, ?)", ("@a:x", 1))
    )
    with pytest.raises(Exception) as info:
        db.write(
            lambda tx: tx.execute(
                "INSERT INTO users (user_id, created_ts) VALUES (?, ?)", ("@a:x", 2)
            )
        )
    assert db.is_unique_violation(info.value)


def test_account_store_round_trip(db):
    store = AccountStore(db)
    assert store.create_user("@alice:x", "hash", False, 1000)
    assert not store.create_user("@alice:x", "other", True, 2000)
    user = store.get_user("@alice:x")
    assert (user.user_id, user.password_hash, user.admin, user.deactivated) == (
        "@alice:x",
        "hash",
        False,
        False,
    )
    assert store.get_user("@bob:x") is None

    store.add_device_token("@alice:x", "DEV1", "phone", "t1", 1000)
    store.add_device_token("@alice:x", "DEV2", None, "t2", 1000)
    assert store.token_owner("t1").device_id == "DEV1"
    # A new login on the same device replaces that device's token.
    store.add_device_token("@alice:x", "DEV1", "phone", "t3", 2000)
    assert store.token_owner("t1") is None
    assert store.token_owner("t3").user_id == "@alice:x"

    store.remove_device("@alice:x", "DEV1")
    assert store.token_owner("t3") is None
    assert store.token_owner("t2") is not None
    store.remove_all_devices("@alice:x")
    assert store.token_owner("t2") is None
    assert store.count_users() == 1


def test_concurrent_writers_and_readers(db):
    store = AccountStore(db)
    jobs = [gevent.spawn(store.create_user, f"@u{i}:x", None, False, i) for i in range(40)]
    jobs += [gevent.spawn(store.count_users) for _ in range(20)]
    gevent.joinall(jobs, raise_error=True)
    assert all(j.value for j in jobs[:40])
    assert store.count_users() == 40


def test_long_sqlite_query_does_not_stall_the_hub(tmp_path):
    db = SqliteDatabase(str(tmp_path / "hub.db"))
    try:
        ticks = []

        def ticker():
            while True:
                ticks.append(time.monotonic())
                gevent.sleep(0.005)

        def slow_count(tx):
            # A recursive CTE that keeps SQLite busy in C for a good fraction of a second.
            return tx.fetchone(
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c"
                " WHERE x < 3000000) SELECT COUNT(*) FROM c"
            )[0]

        tick = gevent.spawn(ticker)
        started = time.monotonic()
        assert db.read(slow_count) == 3000000
        finished = time.monotonic()
        tick.kill()
        during = [t for t in ticks if started <= t <= finished]
        # Had the query run on the hub, the ticker could not have run at all meanwhile.
        assert len(during) >= 5, (len(during), finished - started)
    finally:
        db.close()


def test_killed_reader_does_not_lose_its_connection(tmp_path):
    db = SqliteDatabase(str(tmp_path / "kill.db"), readers=1)
    try:

        def slow(tx):
            return tx.fetchone(
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c"
                " WHERE x < 2000000) SELECT COUNT(*) FROM c"
            )[0]

        g = gevent.spawn(db.read, slow)
        gevent.sleep(0)  # g runs until it blocks waiting on the threadpool
        assert not g.dead
        g.kill()  # the thread keeps running; its connection must come back when it is done
        assert db.read(lambda tx: tx.fetchone("SELECT 1")[0]) == 1
    finally:
        db.close()


def test_a_receipt_never_moves_back_when_two_writes_race_on_postgresql(pg_cluster):
    # Receipts only move forward (0008_sync.sql). PostgreSQL runs writers concurrently (READ
    # COMMITTED): a write that read the old receipt before another committed a later one
    # must not then overwrite it. SQLite runs one writer at a time, so this is PostgreSQL's.
    url = pg_cluster.new_database()
    db = open_database(url)
    try:
        _race_two_receipts(db, url)
    finally:
        db.close()


def _race_two_receipts(db, url):
    import psycopg

    from homeserver.storage.sync import Receipt, SyncStore

    migrate(db)
    room, user = "!r:x", "@u:x"

    def add_room(tx):
        tx.execute(
            "INSERT INTO rooms (room_id, room_version, creator, created_ts) VALUES (?, '10', ?, 0)",
            (room, user),
        )
        for ordering in (1, 2):
            tx.execute(
                "INSERT INTO events (stream_ordering, event_id, room_id, type, sender,"
                " depth, origin_server_ts, json) VALUES (?, ?, ?, 'm.room.message', ?,"
                " ?, 0, '{}')",
                (ordering, f"${ordering}", room, user, ordering),
            )

    db.write(add_room)
    store = SyncStore(db)
    holder = psycopg.connect(url)
    try:
        # Hold the receipts stream's row, so both writes read the receipt, then queue.
        holder.execute(
            "SELECT position FROM stream_positions WHERE stream_name = 'receipts' FOR UPDATE"
        )
        with psycopg.connect(url, autocommit=True) as watcher:

            def queued(n):
                deadline = time.monotonic() + 10
                while (
                    watcher.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname ="
                        " current_database() AND wait_event_type = 'Lock'"
                    ).fetchone()[0]
                    < n
                ):
                    assert time.monotonic() < deadline, "the write never queued"
                    gevent.sleep(0.01)

            later = gevent.spawn(store.put_receipt, Receipt(room, "m.read", user, "", "$2", 1))
            queued(1)
            earlier = gevent.spawn(store.put_receipt, Receipt(room, "m.read", user, "", "$1", 2))
            queued(2)
            holder.rollback()
            gevent.joinall([later, earlier], raise_error=True)
    finally:
        holder.close()
    assert later.value is not None and earlier.value is None
    assert db.read(lambda tx: tx.fetchone("SELECT event_id FROM receipts"))[0] == "$2"


def test_an_error_that_ended_the_sqlite_transaction_is_the_one_raised(tmp_path):
    # Some SQLite errors roll the transaction back themselves (here a trigger's
    # RAISE(ROLLBACK)); our ROLLBACK must not then fail and hide the real error.
    import sqlite3

    db = SqliteDatabase(str(tmp_path / "rollback.db"))
    try:
        db.write(lambda tx: tx.execute("CREATE TABLE t (x INTEGER)"))
        db.write(
            lambda tx: tx.execute(
                "CREATE TRIGGER refuse BEFORE INSERT ON t BEGIN SELECT RAISE(ROLLBACK, 'refused');"
                " END"
            )
        )
        with pytest.raises(sqlite3.IntegrityError, match="refused"):
            db.write(lambda tx: tx.execute("INSERT INTO t VALUES (1)"))
        # The writer connection is still in a usable state.
        db.write(lambda tx: tx.execute("DROP TRIGGER refuse"))
        db.write(lambda tx: tx.execute("INSERT INTO t VALUES (2)"))
        assert db.read(lambda tx: tx.fetchone("SELECT COUNT(*) FROM t"))[0] == 1
    finally:
        db.close()


def test_a_pipelined_write_commits_whole_or_not_at_all(db):
    """`write_pipelined`: its function's answer is read once committed, and an error in a
    statement after the last read rolls back every statement, on both engines."""

    def add(tx, user_id: str, then_twice: bool):
        tx.execute("INSERT INTO users (user_id, created_ts) VALUES (?, ?)", (user_id, 1))
        count = tx.execute("SELECT COUNT(*) FROM users")  # read only once committed
        if then_twice:  # fails at the end, after the read above was sent
            tx.execute("INSERT INTO users (user_id, created_ts) VALUES (?, ?)", (user_id, 2))
        return lambda: count.fetchone()[0]

    assert db.write_pipelined(add, "@a:x", False) == 1
    with pytest.raises(Exception) as info:
        db.write_pipelined(add, "@b:x", True)
    assert db.is_unique_violation(info.value)
    rows = db.read(lambda tx: tx.fetchall("SELECT user_id FROM users ORDER BY user_id"))
    assert rows == [("@a:x",)]
    assert db.write_pipelined(add, "@c:x", False) == 2  # the connection is fine after it
