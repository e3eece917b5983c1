"""A native thread pool that counts the work waiting for one of its threads."""

from __future__ import annotations

from gevent.threadpool import ThreadPool


class CountedThreadPool(ThreadPool):
    """gevent's ThreadPool, which queues one task past its busy threads and then blocks
    `spawn` (and so `apply`); `queued` counts both kinds of waiting, for /metrics."""

    _blocked = 0

    def spawn(self, func, *args, **kwargs):
        self._blocked += 1
        try:
            return super().spawn(func, *args, **kwargs)
        finally:
            self._blocked -= 1

    @property
    def queued(self) -> int:
        return self._blocked + self.task_queue.qsize()
