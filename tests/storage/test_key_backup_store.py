"""The key backup store on SQLite and on a real PostgreSQL cluster: version numbers, the
current version, cascades, paging, and one user's writes racing in greenlets."""

import gevent
import pytest

from homeserver.e2ee.key_backup import keep_new
from homeserver.storage.accounts import AccountStore
from homeserver.storage.database import open_database
from homeserver.storage.key_backup import (
    KeyBackupStore,
    NotCurrentVersion,
    RoomKey,
    UnknownVersion,
)
from homeserver.storage.migrations import migrate

ALICE = "@alice:x"
ROOM = "!r:x"


@pytest.fixture
def store(database_url):
    database = open_database(database_url)
    migrate(database)
    AccountStore(database).create_user(ALICE, None, False, 1)
    yield KeyBackupStore(database)
    database.close()


def key(index: int = 0, forwarded: int = 0, verified: bool = False, mark: str = "k") -> RoomKey:
    return RoomKey(index, forwarded, verified, {"ciphertext": mark})


def test_versions_are_numbered_per_user_and_never_reused(store):
    assert store.version(ALICE) is None
    assert [store.create_version(ALICE, "alg", {"n": i}) for i in range(3)] == [1, 2, 3]
    assert store.version(ALICE).version == 3
    assert store.delete_version(ALICE, 3) and store.delete_version(ALICE, 3)
    assert not store.delete_version(ALICE, 4)
    assert store.version(ALICE).version == 2
    assert store.create_version(ALICE, "alg", {}) == 4
    found = store.version(ALICE, 1)
    assert (found.algorithm, found.auth_data, found.etag, found.count) == ("alg", {"n": 0}, 0, 0)
    assert store.update_version(ALICE, 1, {"n": 9}) and store.version(ALICE, 1).auth_data == {
        "n": 9
    }
    assert not store.update_version(ALICE, 3, {})


def test_writes_go_to_the_current_version_only(store):
    v1 = store.create_version(ALICE, "alg", {})
    v2 = store.create_version(ALICE, "alg", {})
    with pytest.raises(NotCurrentVersion) as info:
        store.put_keys(ALICE, v1, {ROOM: {"s": key()}}, keep_new)
    assert info.value.current == v2
    with pytest.raises(UnknownVersion):
        store.put_keys(ALICE, 9, {ROOM: {"s": key()}}, keep_new)
    with pytest.raises(UnknownVersion):
        store.delete_keys(ALICE, 9)
    assert store.put_keys(ALICE, v2, {ROOM: {"s": key()}}, keep_new).count == 1


def test_deleting_a_version_removes_its_keys_and_only_its(store):
    v1 = store.create_version(ALICE, "alg", {})
    store.put_keys(ALICE, v1, {ROOM: {f"s{i}": key() for i in range(5)}}, keep_new)
    v2 = store.create_version(ALICE, "alg", {})
    store.put_keys(ALICE, v2, {ROOM: {"s0": key()}}, keep_new)
    store.delete_version(ALICE, v1)
    rows = store.db.read(
        lambda tx: tx.fetchall(
            "SELECT version, session_id FROM key_backup_keys WHERE user_id = ?", (ALICE,)
        )
    )
    assert [(int(v), s) for v, s in rows] == [(v2, "s0")]


def test_pages_cover_every_key_once_in_order(store):
    v = store.create_version(ALICE, "alg", {})
    rooms = {f"!r{r}:x": {f"s{i:03}": key(i) for i in range(7)} for r in range(5)}
    store.put_keys(ALICE, v, rooms, keep_new)
    read = [(room, session) for room, session, _ in store.key_pages(ALICE, v, page=3)]
    assert read == sorted((r, s) for r, sessions in rooms.items() for s in sessions)
    one_room = list(store.key_pages(ALICE, v, "!r2:x", page=2))
    assert [s for _, s, _ in one_room] == sorted(rooms["!r2:x"])
    assert one_room[4][2] == key(4)


def test_racing_uploads_of_one_session_keep_the_best_key(store):
    """Greenlets upload ranked keys for the same sessions at once: each session ends with the
    best key, the count is each session once, and the etag moved once per stored change."""
    v = store.create_version(ALICE, "alg", {})
    candidates = [key(i % 4, i % 3, i % 5 == 0, mark=str(i)) for i in range(20)]
    best = min(
        candidates, key=lambda k: (not k.is_verified, k.first_message_index, k.forwarded_count)
    )

    def upload(k: RoomKey):
        return store.put_keys(ALICE, v, {ROOM: {"a": k, "b": k}, "!other:x": {"c": k}}, keep_new)

    results = [
        g.get()
        for g in gevent.joinall([gevent.spawn(upload, k) for k in candidates], raise_error=True)
    ]
    assert all(r.count == 3 for r in results)
    stored = {s: k for _, s, k in store.key_pages(ALICE, v)}
    assert stored["a"] == stored["b"] == stored["c"]
    assert (
        stored["a"].is_verified,
        stored["a"].first_message_index,
        stored["a"].forwarded_count,
    ) == (
        best.is_verified,
        best.first_message_index,
        best.forwarded_count,
    )
    # Every successful upload that changed something moved the etag by exactly one.
    assert store.version(ALICE, v).etag == len({r.etag for r in results})


def test_racing_version_creation_hands_out_distinct_numbers(store):
    jobs = [gevent.spawn(store.create_version, ALICE, "alg", {"i": i}) for i in range(10)]
    gevent.joinall(jobs, raise_error=True)
    assert sorted(j.value for j in jobs) == list(range(1, 11))
    assert store.version(ALICE).version == 10
