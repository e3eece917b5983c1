"""UploadWaiters: downloads of pending media are woken by the upload, and leave no entry."""

import gevent
from gevent.event import Event

from homeserver.config import parse_config
from homeserver.media.waiters import UploadWaiters
from homeserver.runtime import HomeserverRuntime
from tests.support.server import base_settings


def test_an_upload_wakes_every_waiter_and_the_entry_goes():
    waiters = UploadWaiters()
    watching = [Event(), Event()]

    def wait(i):
        with waiters.watching("m1") as uploaded:
            watching[i].set()
            return uploaded.wait(30)

    workers = [gevent.spawn(wait, i) for i in range(2)]
    for event in watching:
        event.wait()
    assert waiters.watched == 1
    waiters.uploaded("m1")
    assert [w.get() for w in workers] == [True, True]
    assert waiters.watched == 0


def test_a_timed_out_or_killed_waiter_leaves_nothing():
    waiters = UploadWaiters()
    with waiters.watching("m1") as uploaded:
        assert not uploaded.wait(0.01)
    assert waiters.watched == 0

    inside = Event()

    def wait():
        with waiters.watching("m2") as uploaded:
            inside.set()
            uploaded.wait()

    worker = gevent.spawn(wait)
    inside.wait()
    worker.kill()
    assert waiters.watched == 0


def test_a_watcher_after_an_upload_gets_a_fresh_event():
    waiters = UploadWaiters()
    with waiters.watching("m1") as first:
        waiters.uploaded("m1")
        assert first.is_set()
        with waiters.watching("m1") as second:
            assert second is not first and not second.is_set()
        assert waiters.watched == 0
    assert waiters.watched == 0
    waiters.uploaded("nobody-waits")  # harmless


def test_content_written_by_another_process_is_served_when_the_wait_ends(tmp_path):
    # Federation shards serve /_matrix/federation/v1/media/download with their own waiters,
    # while content is uploaded through main: a shard is never woken. Content that landed
    # during its wait must still be served when timeout_ms runs out, not 504
    # M_NOT_YET_UPLOADED (spec: that error means the content has not been uploaded).
    config = parse_config(base_settings(str(tmp_path / "data")), str(tmp_path))
    main, shard = HomeserverRuntime(config), HomeserverRuntime(config)
    try:
        media_id = main.media.create("@alice:weir.test")["content_uri"].rsplit("/", 1)[1]
        waiting = gevent.spawn(shard.media.local_media, media_id, legacy=False, timeout_ms=2000)
        # Hold the shard's event for this id to see when its download is blocked on it.
        with shard.media.waiters.watching(media_id) as uploaded:
            with gevent.Timeout(10):
                while uploaded.linkcount() == 0:
                    gevent.sleep(0.005)
            main.media.upload_to(
                "@alice:weir.test", "weir.test", media_id, [b"late"], None, "text/plain", None
            )
            assert not uploaded.is_set()  # another process's upload wakes nobody here
            media = waiting.get(timeout=10)
        assert media.uploaded and media.media_length == 4
    finally:
        main.close()
        shard.close()
