"""Greenlet coordination by key.

SingleFlight: at most one call per key in flight; concurrent callers share its outcome.

The call runs in the greenlet of the caller that started it (the leader), so it is bounded
by that caller's deadline and admission slot, and nothing runs that nobody waits for. Other
callers (waiters) wait within their own deadlines. If the leader fails with an Exception,
every waiter gets that exception: a failure is shared, never cached. If the leader is
stopped from outside (its client hung up, its deadline fired: a BaseException), the call's
outcome is unknown, so each waiter tries again, and one of them leads the next attempt.

KeyedLocks: per-key locks that exist only while someone holds or waits for them.

GatheredReads: reads that greenlets woken together each ask for, made as one.

let_io_run: the pause of a greenlet that works in turns.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager
from typing import Any, Callable, Generic, Hashable, Iterable, Iterator, TypeVar

import gevent
from gevent.event import AsyncResult
from gevent.lock import Semaphore

# A greenlet that works in turns (a large body decoded a piece at a time) pauses this long
# between them. Not sleep(0): that puts it back on the hub's queue of callbacks, which the hub
# works through before it polls its sockets again (it looks at the clock only every 50
# callbacks), so three such greenlets left a waiting request unread for hundreds of
# milliseconds (tests/federation/test_hostile_peer.py). A timer lets the hub poll in between.
TURN_PAUSE_SECONDS = 0.001

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


def let_io_run() -> None:
    """Pauses the current greenlet long enough for the hub to serve ready sockets."""
    gevent.sleep(TURN_PAUSE_SECONDS)


def in_turns(items: Iterable[T], per_turn: int) -> Iterator[T]:
    """`items`, with `let_io_run()` after every `per_turn` of them: a loop over a big room's
    members holds the hub for one turn at most."""
    for n, item in enumerate(items, 1):
        yield item
        if n % per_turn == 0:
            let_io_run()


class _LeaderGone(Exception):
    pass


class SingleFlight:
    def __init__(self):
        self._calls: dict[Hashable, AsyncResult] = {}

    def in_flight(self, key: Hashable) -> bool:
        return key in self._calls

    def __len__(self) -> int:
        return len(self._calls)

    def run(
        self,
        key: Hashable,
        fn: Callable[[], Any],
        on_wait: Callable[[], None] | None = None,
        admit: Callable[[], AbstractContextManager[object]] | None = None,
    ):
        """fn() once for all concurrent callers with this key; returns its result.

        `on_wait` runs each time a caller is about to wait on another's call. `admit`, if
        given, is entered by a caller each time it is about to lead, and held for the call:
        it may refuse that caller (raise) without the refusal being shared. Entering it must
        not yield, or another caller could lead the same key meanwhile.
        """
        while True:
            pending = self._calls.get(key)
            if pending is None:
                if admit is None:
                    return self._lead(key, fn)
                with admit():
                    return self._lead(key, fn)
            if on_wait is not None:
                on_wait()
            try:
                return pending.get()
            except _LeaderGone:
                continue

    def _lead(self, key: Hashable, fn: Callable[[], Any]):
        result = AsyncResult()
        self._calls[key] = result
        try:
            value = fn()
        except Exception as e:
            result.set_exception(e)
            raise
        except BaseException:
            result.set_exception(_LeaderGone())
            raise
        else:
            result.set(value)
            return value
        finally:
            del self._calls[key]


class KeyedLocks:
    """`with locks.hold(room_id):` serialises the greenlets working on one room, and no
    other. An entry is dropped when its last holder or waiter leaves, so memory stays
    proportional to the rooms in use right now, not to every room ever touched."""

    def __init__(self):
        self._entries: dict[str, list] = {}  # key -> [Semaphore, holders and waiters]

    @contextmanager
    def hold(self, key: str):
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = [Semaphore(1), 0]
        entry[1] += 1
        try:
            # A Timeout or kill while waiting leaves the semaphore untouched; the count is
            # undone in `finally` either way.
            with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)


class _Gathering:
    __slots__ = ("keys", "result")

    def __init__(self) -> None:
        self.keys: dict = {}  # asked for, in order, once each
        self.result: AsyncResult = AsyncResult()


class GatheredReads(Generic[K, T]):
    """One message wakes thousands of syncs at once, and each asks the database for its own
    user's row. The first to ask (the leader) gives the others one turn of the hub to ask
    too (sleep(0): the greenlets woken with it are queued before it), then reads every key
    asked for in one read. A failure of that read is every asker's; a leader stopped from
    outside leaves each waiter to read its own key alone."""

    def __init__(self, read_many: Callable[[list[K]], dict[K, T]], read_one: Callable[[K], T]):
        """`read_many(keys)` must give a value for every key."""
        self._read_many = read_many
        self._read_one = read_one
        self._open: _Gathering | None = None
        self.reads = 0  # gathered reads made

    def get(self, key: K) -> T:
        gathering = self._open
        if gathering is None:
            gathering = self._open = _Gathering()
            gathering.keys[key] = None
            self._lead(gathering)
        else:
            gathering.keys[key] = None
            gathering.result.wait()  # this greenlet's own stop raises here
        result = gathering.result
        if result.successful():
            return result.value[key]
        if isinstance(result.exception, _LeaderGone):
            return self._read_one(key)
        raise result.exception

    def _lead(self, gathering: _Gathering) -> None:
        try:
            gevent.sleep(0)
            self._open = None
            self.reads += 1
            found = self._read_many(list(gathering.keys))
        except Exception as e:
            self._forget(gathering)
            gathering.result.set_exception(e)
            raise
        except BaseException:
            self._forget(gathering)
            gathering.result.set_exception(_LeaderGone())
            raise
        gathering.result.set(found)

    def _forget(self, gathering: _Gathering) -> None:
        if self._open is gathering:
            self._open = None
