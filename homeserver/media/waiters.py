"""Downloads waiting for an async upload's content: woken by an event, not a poll."""

from __future__ import annotations

import contextlib

from gevent.event import Event


class UploadWaiters:
    """One gevent Event per media id that someone is waiting on.

    A waiter registers (`watching`) BEFORE it checks the database, then waits on the event:
    content that arrives between the check and the wait still wakes it. An entry lives only
    while someone watches, so abandoned waits leave nothing behind.
    """

    def __init__(self):
        self._events: dict[str, tuple[Event, int]] = {}

    @contextlib.contextmanager
    def watching(self, media_id: str):
        event, count = self._events.get(media_id, (None, 0))
        if event is None:
            event = Event()
        self._events[media_id] = (event, count + 1)
        try:
            yield event
        finally:
            current = self._events.get(media_id)
            if current is not None and current[0] is event:  # not yet woken and replaced
                if current[1] == 1:
                    del self._events[media_id]
                else:
                    self._events[media_id] = (event, current[1] - 1)

    def uploaded(self, media_id: str) -> None:
        """Wakes everyone waiting on `media_id`; later watchers get a fresh event."""
        entry = self._events.pop(media_id, None)
        if entry is not None:
            entry[0].set()

    @property
    def watched(self) -> int:
        return len(self._events)
