"""UploadWaiters: downloads of pending media are woken by the upload, and leave no entry."""

import gevent
from gevent.event import Event

from homeserver.media.waiters import UploadWaiters


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
