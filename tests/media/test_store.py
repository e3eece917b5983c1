"""MediaStore on SQLite and on a real PostgreSQL cluster."""

import gevent
import pytest

from homeserver.storage.database import open_database
from homeserver.storage.media import (
    LocalMedia,
    MediaStore,
    RemoteMedia,
    StoredThumbnail,
    ThumbnailSource,
)
from homeserver.storage.migrations import migrate


@pytest.fixture
def store(database_url):
    database = open_database(database_url)
    migrate(database)
    yield MediaStore(database)
    database.close()


@pytest.fixture
def stores(database_url, store):
    """Several stores on their own connections to one database, as concurrent as it gets."""
    databases = [open_database(database_url) for _ in range(4)]
    yield [MediaStore(db) for db in databases]
    for db in databases:
        db.close()


def test_local_media_round_trip(store):
    media = LocalMedia("abc", "@a:x", "image/png", "cat.png", 10, "f00", 1000, True)
    assert store.insert_local_media(media, 1000)
    assert not store.insert_local_media(media, 2000)  # the id is taken
    assert store.get_local_media("abc") == media
    assert store.get_local_media("nope") is None


def test_pending_limit_counts_only_live_pending_ids(store):
    for i in range(3):
        assert store.create_pending(f"p{i}", "@a:x", 1000 + i, 0, 3, True) is None
    # The fourth is refused, naming the oldest live pending id's creation time.
    assert store.create_pending("p3", "@a:x", 2000, 0, 3, True) == 1000
    assert store.create_pending("q0", "@b:x", 2000, 0, 3, True) is None  # per user
    # Ids created before live_since (expired) no longer count.
    assert store.create_pending("p3", "@a:x", 2000, 1000, 3, True) is None
    pending = store.get_local_media("p0")
    assert not pending.uploaded and pending.authenticated and pending.content_type is None
    # Content frees a place, and can be given only once.
    assert store.complete_pending("p1", "text/plain", "a.txt", 5, "beef", 3000)
    assert not store.complete_pending("p1", "text/plain", "b.txt", 6, "cafe", 3001)
    done = store.get_local_media("p1")
    assert (done.media_length, done.upload_name, done.sha256) == (5, "a.txt", "beef")
    assert store.create_pending("p4", "@a:x", 3000, 1000, 3, True) is None


def test_concurrent_creates_cannot_both_pass_the_limit(stores):
    for attempt in range(5):
        user = f"@u{attempt}:x"
        results = gevent.joinall(
            [
                gevent.spawn(s.create_pending, f"c{attempt}-{i}", user, 1000, 0, 2, False)
                for i, s in enumerate(stores * 2)
            ]
        )
        assert [g.value for g in results].count(None) == 2


def test_thumbnail_rows(store):
    assert store.get_thumbnail_source("weir.test", "abc") is None
    source = ThumbnailSource(1000, 500, False, None)
    store.record_thumbnail_source("weir.test", "abc", source)
    store.record_thumbnail_source(
        "weir.test", "abc", ThumbnailSource(None, None, False, "too_large")
    )
    assert store.get_thumbnail_source("weir.test", "abc") == source  # the first stays
    thumb = StoredThumbnail(96, 96, "crop", "image/png", False, 1234)
    store.add_thumbnail("weir.test", "abc", thumb, 1000)
    store.add_thumbnail("weir.test", "abc", thumb, 2000)  # a concurrent twin: no error
    store.add_thumbnail("other.server", "abc", thumb, 1000)
    assert store.get_thumbnails("weir.test", "abc") == [thumb]


def test_remote_media_cache_rows(store):
    assert store.get_remote_media("remote.test", "abc") is None
    first = RemoteMedia("remote.test", "abc", "image/png", "cat.png", 10, "f00", 1000, True)
    assert store.insert_remote_media(first)
    # A second copy's row never displaces the first: its file was dropped, the first's kept.
    assert not store.insert_remote_media(
        RemoteMedia("remote.test", "abc", "text/plain", None, 11, "bad", 2000, False)
    )
    assert store.get_remote_media("remote.test", "abc") == first
    # Keyed by origin and id: the same id on another server is another file.
    other = RemoteMedia("other.test", "abc", "text/plain", None, 3, "c0de", 3000, False)
    assert store.insert_remote_media(other)
    assert store.get_remote_media("other.test", "abc") == other
    assert store.get_local_media("abc") is None
