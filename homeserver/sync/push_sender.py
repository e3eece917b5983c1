"""The push sender: each pusher's notifications to its push gateway, a queue that outlives
the request (docs/architecture.md, "Pushers").

What is owed is already a record: the `event_push_actions` rows written in each event's own
transaction (sync/push_actions.py). A pusher owes the rows after its `position`
(storage/pushers.py); the sender reads them oldest first, sends one, and moves the position
on only once the gateway answered, so a restart resends nothing sent and loses nothing owed.
A wake-up (`wake`, a listener after the persist) only says where to look.

The rules, those of the federation sender (federation/sender.py) where they fit:
- one notify in flight per pusher, in a pool of its own (`push.max_in_flight`), never the
  main pool, and one total deadline per notify (`push.deadline`), DNS included;
- lanes by evidence: a pusher whose gateway answered its last notify is live, any other
  (never tried, failing) unproven. Live ones are started first and a quarter of the slots
  is theirs alone; unproven ones share the rest, so a dead gateway never delays a live one;
- a failing pusher backs off (1 s, doubling to an hour), then catches up from its position;
- a gateway's `rejected` naming the pushkey removes the pusher (push gateway spec); an
  answer refusing the content (400, 413) skips that notification rather than wedge the
  pusher;
- with several instances, one sends for a pusher at a time: the holder of its lease
  (storage/leases.py), claimed before a notify its lease would not cover, which also reads
  the pusher afresh (another instance may have moved it on, or changed it). Another
  instance with rows owed looks again when the lease lapses, and stops looking once the
  holder has sent them. Pushers set through another instance are found every lease time.

Runs in main only (homeserver/processes/main.py starts and stops it).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from dataclasses import dataclass

import gevent
from gevent.pool import Pool

from budget import OutboundDeadline
from homeserver.federation.errors import DeadlineExceeded, FederationError, RemoteError
from homeserver.storage.leases import QueueLeases, lease_seconds
from homeserver.storage.pushers import PUSHERS, OwedAction, Pusher, PusherKey, PusherStore
from homeserver.sync.push_gateway import EVENT_ID_ONLY, PushGateway, notification

log = logging.getLogger(__name__)

BACKOFF_START = 1.0
BACKOFF_MAX = 3600.0
# Rows read at once; the pusher sends them one by one and reads again.
BATCH = 20
# How long a stop waits for the notifies in flight (drain gives the whole stop 10 s).
STOP_GRACE = 2.0
LIVE, UNPROVEN = "live", "unproven"
# Answers that refuse this notification's content: sending it again would wedge the pusher.
_REFUSED = (400, 413)


@dataclass
class _State:
    pusher: Pusher
    busy: bool = False  # a notify is in flight, or waits for a slot
    pending: bool = False  # rows may be owed
    answered: bool = False  # its gateway answered its last notify
    lane: str = UNPROVEN
    interval: float = 0.0  # the current backoff, 0 when none
    retry_at: float = 0.0  # monotonic
    timer: gevent.Greenlet | None = None  # the end of a backoff, or of another's lease
    held_elsewhere: bool = False  # the timer waits for another instance's lease to lapse
    removed: bool = False


class PushSender:
    def __init__(
        self,
        store: PusherStore,
        gateway: PushGateway,
        max_in_flight: int,
        deadline: float,
        *,
        backoff_start: float = BACKOFF_START,
        backoff_max: float = BACKOFF_MAX,
        leases: QueueLeases | None = None,
        find_every: float | None = None,
    ):
        """`find_every`: with other instances, how often to look for pushers they set."""
        self.store = store
        # Whose pushers these are: the instance's leases (one instance by default).
        self.leases = leases or QueueLeases(store.db, PUSHERS, "main", lease_seconds(0, deadline))
        self.find_every = find_every
        self._finder: gevent.Greenlet | None = None
        self.gateway = gateway
        self.max_in_flight = max_in_flight
        self.deadline = deadline
        self.live_reserved = max(1, max_in_flight // 4)
        self.unproven_limit = max(1, max_in_flight - self.live_reserved)
        self.backoff_start = backoff_start
        self.backoff_max = backoff_max
        self.pool = Pool(max_in_flight)
        self.outcomes = {"success": 0, "failure": 0, "refused": 0, "rejected": 0}
        self._pushers: dict[PusherKey, _State] = {}
        self._by_user: dict[str, set[PusherKey]] = {}
        self._ready: dict[str, deque[PusherKey]] = {LIVE: deque(), UNPROVEN: deque()}
        self._in_flight: dict[PusherKey, str] = {}  # key -> lane
        self._running = False

    # --- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Loads every pusher and resumes each at once: a restart catches up."""
        self._running = True
        pushers = self.store.all_pushers()
        self.wake_pushers(pushers)
        if self.find_every:
            self._finder = gevent.spawn(self._find_pushers, self.find_every)
        log.info("push sender started: %d pushers", len(pushers))

    def _find_pushers(self, every: float) -> None:
        """Pushers set through other instances: this one learns of them within `every`, so
        none is left unsent should the instance that set it die."""
        while self._running:
            gevent.sleep(every)
            try:
                self.wake_pushers(
                    [p for p in self.store.all_pushers() if p.key not in self._pushers]
                )
            except Exception:
                log.exception("push sender: could not read the pushers")

    def stop(self) -> None:
        """Stops sending. A notify in flight has `STOP_GRACE` to be answered and its
        position written (one the gateway took would otherwise come again after a
        restart); past it, it is abandoned, its row still owed."""
        self._running = False
        if self._finder is not None:
            self._finder.kill(block=False)
        for state in self._pushers.values():
            if state.timer is not None:
                state.timer.kill(block=False)
        self.pool.join(timeout=STOP_GRACE)
        self.pool.kill(block=True, timeout=5)
        self.leases.release_all()

    # --- what the rest of the server tells us -------------------------------------------

    def wake(self, user_ids) -> None:
        """New push action rows for these users (after the commit). Never blocks."""
        for user_id in user_ids:
            for key in self._by_user.get(user_id, ()):
                state = self._pushers[key]
                state.pending = True
                self._kick(state)

    def stored_elsewhere(self, after: int, upto: int) -> None:
        """Another instance stored events in (after, upto]: the pushers they notify."""
        self.wake_pushers(self.store.notified_between(after, upto))

    def wake_pushers(self, pushers: list[Pusher]) -> None:
        """These pushers may owe rows: read at start, found set elsewhere, or those of users
        another instance's events notify (runtime/queues.py). Never blocks."""
        for pusher in pushers:
            state = self._pushers.get(pusher.key)
            if state is None:
                state = self._add(pusher)
                state.interval = pusher.retry_interval_ms / 1000
            state.pending = True
            self._kick(state)

    def pusher_set(self, pusher: Pusher, removed: list[PusherKey]) -> None:
        """A pusher was added or changed, and `removed` deleted (service.py's writes)."""
        self.pushers_removed(removed)
        if not self._running:
            return
        state = self._pushers.get(pusher.key)
        if state is None:
            self._add(pusher)
        else:  # a notify in flight may have moved the position on since the write read it
            position = max(state.pusher.position, pusher.position)
            state.pusher = dataclasses.replace(pusher, position=position)

    def pushers_removed(self, keys: list[PusherKey]) -> None:
        for key in keys:
            state = self._pushers.pop(key, None)
            if state is None:
                continue
            state.removed = True
            self.leases.forget(key)
            if state.timer is not None:
                state.timer.kill(block=False)
            users = self._by_user.get(key[0], set())
            users.discard(key)
            if not users:
                self._by_user.pop(key[0], None)

    # --- figures ----------------------------------------------------------------------------

    def in_flight(self) -> int:
        return len(self._in_flight)

    def in_flight_of(self, lane: str) -> int:
        return sum(1 for lane_of in self._in_flight.values() if lane_of == lane)

    def in_backoff(self) -> int:
        now = time.monotonic()
        return sum(1 for s in self._pushers.values() if s.retry_at > now and not s.held_elsewhere)

    def pushers(self) -> int:
        return len(self._pushers)

    # --- scheduling -----------------------------------------------------------------------

    def _add(self, pusher: Pusher) -> _State:
        state = self._pushers[pusher.key] = _State(pusher)
        self._by_user.setdefault(pusher.user_id, set()).add(pusher.key)
        return state

    def _kick(self, state: _State) -> None:
        """Queues the pusher for a slot in its lane unless it is busy, backing off or owes
        nothing."""
        if not self._running or state.removed or state.busy or not state.pending:
            return
        if state.retry_at > time.monotonic():
            return
        state.busy = True
        state.lane = LIVE if state.answered else UNPROVEN
        self._ready[state.lane].append(state.pusher.key)
        self._dispatch()

    def _dispatch(self) -> None:
        """Starts waiting pushers while slots are free: live first, then unproven within
        their share; each lane first come, first served."""
        while self._running and self.pool.free_count() > 0:
            if self._ready[LIVE]:
                lane = LIVE
            elif self._ready[UNPROVEN] and self.in_flight_of(UNPROVEN) < self.unproven_limit:
                lane = UNPROVEN
            else:
                return
            key = self._ready[lane].popleft()
            state = self._pushers.get(key)
            if state is None:  # removed while it waited
                continue
            self._in_flight[key] = lane
            runner = self.pool.spawn(self._run, state)  # never blocks: a place is free
            # The pool's own link (which frees the place) was made first, so it runs first.
            runner.link(lambda _: self._dispatch())

    def _run(self, state: _State) -> None:
        try:
            while self._running and not state.removed and self._send_some(state):
                pass
        except Exception:
            log.exception("push sender: %s", state.pusher.key[:2])
            self._failed(state)
        finally:
            self._in_flight.pop(state.pusher.key, None)
            state.busy = False
            self._kick(state)  # rows that arrived while it ran

    # --- notifications --------------------------------------------------------------------

    def _send_some(self, state: _State) -> bool:
        """Sends what the pusher owes, a batch at most; True if more may be owed now."""
        state.pending = False
        if not self._hold(state):
            return False
        pusher = state.pusher
        rows = self.store.owed(pusher.user_id, pusher.position, BATCH)
        for owed in rows:
            if not self._running or not self._hold(state):
                return False
            if owed.stream_ordering <= state.pusher.position:
                continue  # taken by the gateway while another instance held the lease
            outcome = self._send(state, owed)
            if outcome == "failure":
                self._failed(state)
            elif outcome == "rejected":
                log.info("push gateway rejected %s's pushkey: pusher removed", pusher.user_id)
                self.store.delete(pusher.key)
                self.pushers_removed([pusher.key])
            else:
                self.store.advance(pusher.key, owed.stream_ordering)
                # From state: the pusher's fields may have changed (pusher_set) meanwhile.
                state.pusher = dataclasses.replace(state.pusher, position=owed.stream_ordering)
                self._succeeded(state)
            self.outcomes[outcome] += 1  # once its effects are written
            if outcome in ("failure", "rejected"):
                return False
        if len(rows) == BATCH:
            state.pending = True
        return state.pending

    def _hold(self, state: _State) -> bool:
        """Whether this instance holds the pusher's lease through one more notify; when not
        sure, claims it and reads the pusher afresh. False while another holds it (this one
        looks again when it lapses if rows are still owed then), or once it is gone."""
        key = state.pusher.key
        if self.leases.covers(key, self.deadline):
            return True
        pusher, claimed, lapses_in = self.store.claim(self.leases, key)
        if pusher is None:  # deleted through another instance
            self.pushers_removed([key])
            return False
        # Its position as stored: this instance's notifies are written before the next.
        state.pusher = pusher
        if claimed:
            return True
        if self.store.owed(pusher.user_id, pusher.position, 1):
            state.held_elsewhere, state.pending = True, True
            self._wait(state, lapses_in)
        return False

    def _send(self, state: _State, owed: OwedAction) -> str:
        """One notify: "success", "rejected", "refused" or "failure"."""
        pusher = state.pusher
        counts = self.store.badge_counts(pusher.user_id)
        only_ids = pusher.data.get("format") == EVENT_ID_ONLY
        sender = owed.event.get("sender")
        labels = None if only_ids else self.store.room_labels(owed.room_id, str(sender))
        body = notification(pusher, owed, counts, labels)
        url = pusher.data["url"]
        deadline = OutboundDeadline(self.deadline, what=f"push to {pusher.app_id}")
        try:
            rejected = self.gateway.notify(url, body, deadline)
        except RemoteError as e:
            if e.status in _REFUSED:
                log.warning("push gateway refused a notification for %s: %s", pusher.user_id, e)
                return "refused"
            log.info("push to %s failed: %s", pusher.app_id, e)
            return "failure"
        except (FederationError, DeadlineExceeded) as e:  # unreachable, late, malformed
            log.info("push to %s failed: %s", pusher.app_id, e)
            return "failure"
        return "rejected" if pusher.pushkey in rejected else "success"

    def _succeeded(self, state: _State) -> None:
        state.answered = True
        if state.interval:
            state.interval, state.retry_at = 0.0, 0.0

    def _failed(self, state: _State) -> None:
        state.answered = False
        state.pending = True
        interval = self.backoff_start if not state.interval else state.interval * 2
        state.interval = min(interval, self.backoff_max)
        if not state.removed:
            self.store.set_retry(state.pusher.key, int(state.interval * 1000))
        self._wait(state, state.interval)

    def _wait(self, state: _State, seconds: float) -> None:
        """Tries the pusher again in `seconds`: a backoff, or the end of another's lease."""
        seconds = max(0.05, seconds)
        state.retry_at = time.monotonic() + seconds
        if state.timer is not None:
            state.timer.kill(block=False)
        state.timer = gevent.spawn_later(seconds, self._retry, state)

    def _retry(self, state: _State) -> None:
        state.timer = None
        state.retry_at = 0.0
        state.held_elsewhere = False
        self._kick(state)
