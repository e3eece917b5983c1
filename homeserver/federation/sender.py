"""The federation sender: our PDUs and EDUs to every other server in the room.

PDUs come from the outbox (homeserver/storage/outbox.py), written in the transaction that
stored the event, so nothing is lost to a restart or a `kill -9`; the sender only reads and
clears it. EDUs other servers must not miss (to-device messages, device list and signing key
updates) are durable the same way: written with the local change that made them, sent in
order, gone only once delivered or refused `MAX_EDU_REFUSALS` times, and a destination owed
`max_queued_edus` of them gets no more (counted, never silent). Typing and receipts are
ephemeral and wait in memory, per destination.

The rules (server-server spec, "Transactions"; docs/architecture.md, "Processes"):
- one transaction in flight per destination, at most 50 PDUs and 100 EDUs, oldest first;
  a transaction ID is taken from the database and never used again, even for a retry;
  one whose sender died before its answer (a `kill -9`, or another instance's death) is
  sent again, same ID and same PDUs and durable EDUs, by the next to hold the destination;
- a pool of its own (`federation.sender.max_in_flight`), never the main pool, and one total
  deadline per transaction, discovery included (the client's, capped by `remote_timeout`);
- a failed destination backs off (10 s, doubling to 1 h); a success or an inbound transaction
  from it resets that, and it then catches up: oldest first, or only the newest PDUs of a
  room past a limit, the peer fetching the gap;
- lanes by recent evidence (docs/architecture.md, "The sender's lanes"): a destination is
  live while its last transaction succeeded and it answered within `live_window`; any other
  is unproven. Each lane waits its turn in arrival order. Live destinations are started
  first and a quarter of the slots is theirs alone; unproven ones share the rest, and an
  unproven attempt has `unproven_timeout` to answer, not the whole `remote_timeout`. An
  inbound transaction from a server ends its backoff, and its backlog goes next;
- a transaction is late once it has waited `late_after` (10 times its destination's last
  answer time, at least the `late_after` setting, at most `unproven_timeout`). While a live
  destination waits and every slot is taken, the most overdue late one gives up its slot:
  it counts as a failure (backoff, unproven), its PDUs stay in the outbox.

Runs in main only (homeserver/processes/main.py starts and stops it). With several instances
on one database, each destination's row carries a lease (storage/leases.py): only its
holder sends, and another instance looks again when it lapses.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable
from urllib.parse import quote

import gevent
from gevent.pool import Pool

from homeserver.core.clock import now_ms
from homeserver.federation.client import FederationClient
from homeserver.federation.errors import DeadlineExceeded, FederationError, RemoteError
from homeserver.storage.leases import Claim, QueueLeases, lease_seconds
from homeserver.storage.outbox import DESTINATIONS, OutboxStore

log = logging.getLogger(__name__)

# Spec: "Transactions are limited in size; they can have at most 50 PDUs and 100 EDUs."
MAX_PDUS = 50
MAX_EDUS = 100
# Ephemeral EDUs (typing, receipts) waiting for one destination; past this the oldest go.
MAX_QUEUED_EDUS = 1000
# federation.sender.max_queued_edus's default: durable EDUs owed to one destination.
MAX_QUEUED_DURABLE_EDUS = 10_000
# A durable EDU in this many refused transactions goes: its content is what the peer refuses.
MAX_EDU_REFUSALS = 3
# Catching up after a failure: a room with more PDUs owed than this sends only its newest
# this many, and the peer fetches the gap (/get_missing_events, /state_ids).
CATCH_UP_ROOM_LIMIT = 50
BACKOFF_START = 10.0
BACKOFF_MAX = 3600.0
# The lanes' defaults (federation.sender.live_window, federation.sender.unproven_timeout).
LIVE_WINDOW_SECONDS = 300.0
UNPROVEN_TIMEOUT_SECONDS = 10.0
# federation.sender.late_after's default; a transaction is late past this many of its
# destination's last answer times (docs/architecture.md, "The sender's lanes").
LATE_AFTER_SECONDS = 0.5
LATE_AFTER_ANSWERS = 10
LIVE, UNPROVEN = "live", "unproven"
LANES = (LIVE, UNPROVEN)
# Answers meaning the peer refuses this content: retrying it would wedge the destination, so
# its PDUs are dropped. Anything else (429, 5xx, no answer) is a failure to retry later.
_REFUSED = (400, 403, 413)


class Preempted(gevent.GreenletExit):
    """Thrown into a late transaction's greenlet: its slot goes to a live destination. A
    GreenletExit, so that a database call it lands in is cancelled as for any kill."""


@dataclass
class _Destination:
    name: str
    busy: bool = False  # a transaction is in flight, or waiting for a slot
    pending: bool = False  # the outbox may hold PDUs for it
    failing: bool = False  # the last attempt failed
    answered_at: float | None = None  # when it last answered one of our transactions
    lane: str = UNPROVEN  # the lane it waits or runs in
    ready_at: float = 0.0  # when it joined its lane's queue
    catching_up: bool = False
    interval: float = 0.0  # the current backoff, 0 when none
    retry_at: float = 0.0  # monotonic
    timer: gevent.Greenlet | None = None
    runner: gevent.Greenlet | None = None  # the greenlet sending to it
    calling: bool = False  # its runner waits on the network for a transaction's answer
    call_started: float = 0.0  # monotonic, when that wait began
    answer_seconds: float | None = None  # how long its last successful transaction took
    preempted: bool = False  # told to give its slot up
    held_elsewhere: bool = False  # another instance held its lease at our last claim
    edus: deque = field(default_factory=lambda: deque(maxlen=MAX_QUEUED_EDUS))  # ephemeral


@dataclass
class SenderStats:
    outcomes: dict = field(default_factory=lambda: {"success": 0, "failure": 0, "refused": 0})
    dropped_for_catch_up: int = 0


class FederationSender:
    def __init__(
        self,
        server_name: str,
        store: OutboxStore,
        client: FederationClient,
        max_in_flight: int,
        *,
        leases: QueueLeases | None = None,
        backoff_start: float = BACKOFF_START,
        backoff_max: float = BACKOFF_MAX,
        live_window: float = LIVE_WINDOW_SECONDS,
        unproven_timeout: float = UNPROVEN_TIMEOUT_SECONDS,
        late_after: float = LATE_AFTER_SECONDS,
        max_queued_edus: int = MAX_QUEUED_DURABLE_EDUS,
        on_outcome: Callable[[str], None] | None = None,
        on_edu_dropped: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.server_name = server_name
        self.store = store
        self.client = client
        self.max_in_flight = max_in_flight
        # A quarter of the slots is for live destinations alone; unproven ones share the rest.
        self.live_reserved = max(1, max_in_flight // 4)
        self.unproven_limit = max(1, max_in_flight - self.live_reserved)
        self.live_window = live_window
        self.unproven_timeout = min(unproven_timeout, client.remote_timeout)
        self.late_after_floor = late_after
        # Whose destinations these are: the instance's leases (one instance by default).
        self.leases = leases or QueueLeases(
            store.db, DESTINATIONS, "main", lease_seconds(0, client.remote_timeout)
        )
        self.backoff_start = backoff_start
        self.backoff_max = backoff_max
        self.max_queued_edus = max_queued_edus
        self.stats = SenderStats()
        self.revivals = 0  # destinations backing off whose transaction to us ended it
        self.preempted = 0  # late transactions stopped to give their slot to a live one
        self._on_outcome = on_outcome
        self._on_edu_dropped = on_edu_dropped
        self._clock = clock
        self.pool = Pool(max_in_flight)
        self._destinations: dict[str, _Destination] = {}
        # Destinations waiting for a slot, per lane, first ready first served.
        self._ready: dict[str, deque[str]] = {lane: deque() for lane in LANES}
        self._in_flight: dict[str, _Destination] = {}
        self._running = False
        # Wakes _dispatch when the first transaction in flight becomes late, while a live
        # destination waits for a slot: one at a time, never past stop().
        self._late_watch: gevent.Greenlet | None = None

    # --- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Resumes every destination with PDUs owed, at once: a restart retries them."""
        self._running = True
        for row in self.store.destination_rows():
            dest = self._destination(row.destination)
            # Before the restart is no recent evidence: every destination starts unproven.
            dest.failing = row.retry_interval_ms > 0
            dest.interval = row.retry_interval_ms / 1000
        owed = self.store.destinations_with_pending()
        for name in owed:
            dest = self._destination(name)
            dest.catching_up = True
            dest.pending = True
            self._kick(dest)
        log.info("federation sender started: %d destinations to resume", len(owed))

    def stop(self) -> None:
        """Stops sending; what is in flight is abandoned (the outbox still holds it)."""
        self._running = False
        self._stop_late_watch()
        for dest in self._destinations.values():
            if dest.timer is not None:
                dest.timer.kill(block=False)
        self.pool.kill(block=True, timeout=5)
        self.leases.release_all()

    # --- what the rest of the server tells us -------------------------------------------

    def stored_elsewhere(self, after: int, upto: int) -> None:
        """Another instance stored events in (after, upto]: their destinations may be ours."""
        self.wake(self.store.destinations_between(after, upto))

    def wake(self, destinations: Iterable[str]) -> None:
        """PDUs were queued for `destinations` (after the commit). Never blocks."""
        self._owed(destinations, self._kick)

    def send_edu(self, destinations: Iterable[str], edu_type: str, content: dict) -> None:
        """Queues an ephemeral EDU (typing, a receipt) for each destination, in memory."""
        for name in destinations:
            if name == self.server_name:
                continue
            dest = self._destination(name)
            dest.edus.append({"edu_type": edu_type, "content": content})
            self._kick_or_hand_over(dest)

    def send_edu_where_held(
        self, destinations: Iterable[str], edu_type: str, content: dict, here: bool
    ) -> None:
        """An ephemeral EDU every instance hears of (typing: sync/typing.py), queued here for
        the destinations whose lease this instance holds, and for those nobody holds if it
        happened `here`: so one instance sends it to each, and none queues what it may not
        send (a lease held elsewhere is never freed while its holder keeps sending)."""
        names = [name for name in destinations if name != self.server_name]
        holders = self.leases.holders(names)
        unheld = self.leases.owner if here else None
        self.send_edu(
            [n for n in names if holders.get(n, unheld) == self.leases.owner], edu_type, content
        )

    def queue_durable_edus(self, edus: list[tuple[str, str, dict]]) -> None:
        """Durable (destination, edu_type, content) EDUs that no other write makes (a
        signing key update): queued in a write of their own."""
        edus = [edu for edu in edus if edu[0] != self.server_name]
        self.durable_edus_queued(edus, self.store.queue_edus(edus, self.max_queued_edus))

    def durable_edus_queued(
        self, edus: list[tuple[str, str, dict]], left_out: list[tuple[str, str]]
    ) -> None:
        """A write committed durable EDUs (storage/outbox.py, `queue_edus`) but `left_out`,
        whose destinations were owed `max_queued_edus` already: those are counted, and
        the destinations woken."""
        for _, edu_type in left_out:
            self._edus_dropped(edu_type, "backlog")
        if left_out:
            log.warning(
                "%d EDUs not queued: their destinations are owed %d already (%s)",
                len(left_out),
                self.max_queued_edus,
                sorted({d for d, _ in left_out})[:10],
            )
        self._owed(sorted({destination for destination, _, _ in edus}), self._kick_or_hand_over)

    def on_inbound_transaction(self, origin: str) -> None:
        """`origin` sent us a transaction: it is up. Its backoff ends, and what we owe it
        goes next, ahead of every destination waiting in its lane. It is live once it
        answers one of ours: a server that reaches us may still be one we cannot reach
        (docs/architecture.md, "The sender's lanes")."""
        dest = self._destinations.get(origin)
        if dest is None:
            return
        if dest.interval or dest.retry_at:
            self.revivals += 1
            dest.interval = 0.0
            self._end_wait(dest)
            self.store.set_retry(origin, 0, 0)
        if dest.busy and dest.name not in self._in_flight:
            self._move_to_front(dest)
        else:
            self._kick(dest, first=True)

    # --- figures ----------------------------------------------------------------------------

    def in_flight(self) -> int:
        return len(self._in_flight)

    def in_backoff(self) -> int:
        now = time.monotonic()
        return sum(1 for d in self._destinations.values() if d.retry_at > now)

    def failing_in_flight(self) -> int:
        return sum(1 for d in self._in_flight.values() if d.failing)

    def in_flight_of(self, lane: str) -> int:
        return sum(1 for d in self._in_flight.values() if d.lane == lane)

    def oldest_wait(self) -> float:
        """Seconds the longest-waiting destination has waited for a slot."""
        now = self._clock()
        waits = [now - self._destinations[q[0]].ready_at for q in self._ready.values() if q]
        return max(waits, default=0.0)

    def ephemeral_queued(self) -> int:
        """Typing, receipt and presence EDUs waiting in memory for their destinations."""
        return sum(len(dest.edus) for dest in self._destinations.values())

    # --- scheduling -----------------------------------------------------------------------

    def _destination(self, name: str) -> _Destination:
        dest = self._destinations.get(name)
        if dest is None:
            dest = self._destinations[name] = _Destination(name)
        return dest

    def lane_of(self, dest: _Destination) -> str:
        """Live: its last transaction succeeded, and it answered within the window."""
        if dest.failing or dest.answered_at is None:
            return UNPROVEN
        return LIVE if self._clock() - dest.answered_at <= self.live_window else UNPROVEN

    def _kick(self, dest: _Destination, first: bool = False) -> None:
        """Queues `dest` for a slot in its lane unless it is busy, backing off, or has
        nothing to send; `first`: ahead of the others waiting in its lane."""
        if not self._running or dest.busy or dest.retry_at > time.monotonic():
            return
        if not dest.pending and not dest.edus:
            return
        dest.busy = True
        dest.lane = self.lane_of(dest)
        dest.ready_at = self._clock()
        queue = self._ready[dest.lane]
        if first:
            queue.appendleft(dest.name)
        else:
            queue.append(dest.name)
        self._dispatch()

    def _kick_or_hand_over(self, dest: _Destination) -> None:
        """`_kick` for EDUs. Another instance's lease makes us wait for it to lapse, and
        nothing tells its holder of EDUs queued here (events wake it: runtime/queues.py):
        they are handed over at once (`_pass_to_holder`), not when the wait ends."""
        if dest.held_elsewhere:  # its timer waits for that lease (`_pass_to_holder`)
            self._end_wait(dest)
        self._kick(dest)

    def _owed(self, destinations: Iterable[str], kick: Callable[[_Destination], None]) -> None:
        for dest in map(self._destination, destinations):
            dest.pending = True
            kick(dest)

    @staticmethod
    def _end_wait(dest: _Destination) -> None:
        """Ends the wait of `_retry_in` now: a backoff, or a wait for another's lease."""
        dest.retry_at = 0.0
        if dest.timer is not None:
            dest.timer.kill(block=False)
            dest.timer = None

    def _move_to_front(self, dest: _Destination) -> None:
        """A waiting destination that just talked to us: to the front of its lane."""
        queue = self._ready[dest.lane]
        if dest.name in queue:
            queue.remove(dest.name)
            queue.appendleft(dest.name)
            self._dispatch()

    def _dispatch(self) -> None:
        """Starts waiting destinations while slots are free: the live lane first, then the
        unproven one within its share; each lane first ready first served. Runs when a
        destination is queued and when a slot frees."""
        if not self._running:
            return
        # A greenlet that is ending still holds its place in the pool until it has exited:
        # spawning then would block. Its exit runs this again (the link below).
        while self.pool.free_count() > 0 and len(self._in_flight) < self.max_in_flight:
            if self._ready[LIVE]:
                dest = self._destinations[self._ready[LIVE].popleft()]
            elif self._ready[UNPROVEN] and self.in_flight_of(UNPROVEN) < self.unproven_limit:
                dest = self._destinations[self._ready[UNPROVEN].popleft()]
            else:
                break
            self._in_flight[dest.name] = dest
            dest.runner = self.pool.spawn(self._run, dest)  # never blocks: a place is free
            # The pool's own link (which frees the place) was made first, so it runs first.
            dest.runner.link(lambda _: self._dispatch())
        self._make_room_for_live()

    def _run(self, dest: _Destination) -> None:
        try:
            while self._running and self._send_one(dest):
                pass
        except Preempted:
            # It landed after the call it was meant for had answered: nothing failed. The
            # slot still goes to the live one; this destination queues again.
            dest.pending = True
        except Exception:
            log.exception("federation sender: %s", dest.name)
            self._failed(dest)
        finally:
            self._in_flight.pop(dest.name, None)
            dest.busy, dest.runner, dest.preempted = False, None, False
            if self._running and dest.retry_at <= time.monotonic():
                self._kick(dest)  # something arrived while the last transaction ran

    # --- late transactions -----------------------------------------------------------------

    def late_after(self, dest: _Destination) -> float:
        """Seconds after which `dest`'s transaction is late. One that never answered has
        only its unproven deadline, which bounds it already."""
        if dest.answer_seconds is None:
            return self.unproven_timeout
        late = max(self.late_after_floor, LATE_AFTER_ANSWERS * dest.answer_seconds)
        return min(late, self.unproven_timeout)

    def _make_room_for_live(self) -> None:
        """Live destinations wait and every slot is taken: the most overdue late transaction
        gives up its slot, its exit link dispatching the next live one. If none is late yet,
        this runs again when the first becomes late."""
        waiting = len(self._ready[LIVE]) - sum(d.preempted for d in self._in_flight.values())
        # Fewer in flight than slots: one is ending, and its exit link dispatches.
        if not self._running or waiting <= 0 or len(self._in_flight) < self.max_in_flight:
            self._stop_late_watch()
            return
        now = time.monotonic()
        overdue: dict[str, float] = {}  # seconds past late; negative: not late yet
        for d in self._in_flight.values():
            if not d.preempted:
                # One in the database (not waiting on the network) is never stopped: it is
                # looked at again once its call could be late.
                since = d.call_started if d.calling else now
                overdue[d.name] = now - since - self.late_after(d)
        late = [n for n in overdue if overdue[n] >= 0 and self._in_flight[n].calling]
        for name in sorted(late, key=lambda n: overdue[n], reverse=True)[:waiting]:
            self._preempt(self._in_flight[name])
        waiting -= min(waiting, len(late))
        upcoming = [-o for n, o in overdue.items() if n not in late]
        if waiting > 0 and upcoming:
            self._watch_late(max(0.01, min(upcoming)))
        else:
            self._stop_late_watch()

    def _preempt(self, dest: _Destination) -> None:
        waited = time.monotonic() - dest.call_started
        log.info(
            "federation sender: %s late after %.1f s; its slot goes to a live destination",
            dest.name,
            waited,
        )
        dest.preempted = True
        self.preempted += 1
        if dest.runner is not None:
            dest.runner.kill(Preempted, block=False)  # its socket is closed on the way out

    def _watch_late(self, seconds: float) -> None:
        self._stop_late_watch()
        self._late_watch = gevent.spawn_later(seconds, self._late_watch_fired)

    def _late_watch_fired(self) -> None:
        self._late_watch = None
        self._make_room_for_live()

    def _stop_late_watch(self) -> None:
        watch, self._late_watch = self._late_watch, None
        if watch is not None and watch is not gevent.getcurrent():
            watch.kill(block=False)

    # --- one transaction ------------------------------------------------------------------

    def _send_one(self, dest: _Destination) -> bool:
        """Sends one transaction to `dest`; True if there may be more to send now."""
        if dest.catching_up:
            dropped = self.store.trim_rooms(dest.name, CATCH_UP_ROOM_LIMIT)
            self.stats.dropped_for_catch_up += dropped
            dest.catching_up = False
        dest.pending = False
        pdus = self.store.pending(dest.name, MAX_PDUS)
        durable = self.store.pending_edus(dest.name, MAX_EDUS)
        room = MAX_EDUS - len(durable)
        ephemeral = [dest.edus.popleft() for _ in range(min(room, len(dest.edus)))]
        if not pdus and not durable and not ephemeral:
            return False
        if len(pdus) == MAX_PDUS or len(durable) == MAX_EDUS:
            dest.pending = True  # never cleared here: a wake-up during the read stands
        ours = ([o for o, _ in pdus], [i for i, _ in durable])
        claim = self.store.begin_transaction(dest.name, self.leases, *ours)
        if not claim.claimed or claim.row is None:  # another instance holds it
            dest.held_elsewhere = True
            self._pass_to_holder(dest, claim, ephemeral, bool(durable))
            return False
        dest.held_elsewhere = False
        txn_id, _, orderings, durable_ids = claim.row
        if (orderings, durable_ids) != ours:
            # Left unanswered by a sender that died in the call (another instance, or this
            # one before a kill -9): the same PDUs and durable EDUs again under its ID, so
            # the receiver's deduplication holds; ours go next.
            dest.edus.extendleft(reversed(ephemeral))
            pdus, durable = self.store.carried(dest.name, orderings, durable_ids)
            ephemeral, durable_ids, dest.pending = [], [i for i, _ in durable], True
        # Until it answers, a destination has the unproven lane's time, not the whole deadline.
        seconds = None if self.lane_of(dest) == LIVE else self.unproven_timeout
        edus = [edu for _, edu in durable] + ephemeral
        outcome = self._put(dest, str(txn_id), [p for _, p in pdus], edus, seconds)
        if outcome == "failure":
            # A new transaction carries them: a retry's ID is never a used one. Typing is
            # stale by the time a dead server returns; receipts still matter. The durable
            # EDUs are still in the outbox.
            self.store.abandoned(dest.name, txn_id)
            dest.edus.extendleft(reversed([e for e in ephemeral if e["edu_type"] != "m.typing"]))
            self._failed(dest)
            self._count(outcome)
            return False
        dest.answer_seconds = time.monotonic() - dest.call_started
        if outcome == "refused":
            # Its PDUs go (below); its durable EDUs go again, alone if the PDUs were what
            # the peer refused, until they were refused MAX_EDU_REFUSALS times.
            for edu_type in self.store.edus_refused(dest.name, durable_ids, MAX_EDU_REFUSALS):
                self._edus_dropped(edu_type, "refused")
            dest.pending = dest.pending or bool(durable)
        self.store.delivered(
            dest.name, txn_id, orderings, durable_ids if outcome == "success" else []
        )
        self._succeeded(dest)
        self._count(outcome)  # after the outbox and the lanes know it
        return dest.pending or bool(dest.edus)

    def _pass_to_holder(
        self, dest: _Destination, claim: Claim, ephemeral: list, durable: bool
    ) -> None:
        """Another instance holds `dest`. Events wake their holder (runtime/queues.py), EDUs
        do not, and it cannot read our memory: our typing and receipts go to the durable
        outbox, and the holder is told to send now rather than at its next transaction."""
        ephemeral += [dest.edus.popleft() for _ in range(len(dest.edus))]
        if ephemeral or durable:
            holder = claim.row[1] if claim.row else None  # a row: its claim made it
            for _, edu_type in self.store.hand_over(
                dest.name, holder, ephemeral, self.max_queued_edus
            ):
                self._edus_dropped(edu_type, "backlog")
        dest.pending = True  # still owed: sent by its holder, or by us once it lapses
        self._retry_in(dest, max(0.05, claim.lapses_in))

    def _put(
        self, dest: _Destination, txn_id: str, pdus: list, edus: list, seconds: float | None
    ) -> str:
        """One transaction: "success", "refused" or "failure" (a preempted one too)."""
        destination = dest.name
        body = {"origin": self.server_name, "origin_server_ts": now_ms(), "pdus": pdus}
        if edus:
            body["edus"] = edus
        path = f"/_matrix/federation/v1/send/{quote(txn_id, safe='')}"
        deadline = self.client.deadline(seconds, what=f"transaction {txn_id} to {destination}")
        dest.calling, dest.call_started = True, time.monotonic()
        try:
            self.client.put_json(destination, path, body, deadline=deadline)
            return "success"
        except Preempted:  # _preempt logged it
            return "failure"
        except RemoteError as e:
            if e.status in _REFUSED:
                log.warning("transaction %s refused by %s: %s", txn_id, destination, e)
                return "refused"
            log.info("transaction %s to %s failed: %s", txn_id, destination, e)
            return "failure"
        except (FederationError, DeadlineExceeded) as e:  # unreachable, late, malformed
            log.info("transaction %s to %s failed: %s", txn_id, destination, e)
            return "failure"
        finally:
            dest.calling = False

    def _edus_dropped(self, edu_type: str, reason: str) -> None:
        if self._on_edu_dropped is not None:
            self._on_edu_dropped(edu_type, reason)

    def _count(self, outcome: str) -> None:
        self.stats.outcomes[outcome] += 1
        if self._on_outcome is not None:
            self._on_outcome(outcome)

    def _succeeded(self, dest: _Destination) -> None:
        was_backing_off = dest.interval > 0 or dest.failing
        dest.failing, dest.answered_at = False, self._clock()
        dest.interval, dest.retry_at = 0.0, 0.0
        if was_backing_off:
            self.store.set_retry(dest.name, 0, 0)

    def _failed(self, dest: _Destination) -> None:
        dest.failing = True
        dest.catching_up = True
        dest.pending = True
        self._back_off(dest, persist=True)

    def _back_off(self, dest: _Destination, persist: bool) -> None:
        interval = self.backoff_start if not dest.interval else dest.interval * 2
        dest.interval = min(interval, self.backoff_max)
        if persist:
            self.store.set_retry(
                dest.name, int(dest.interval * 1000), now_ms() + int(dest.interval * 1000)
            )
        self._retry_in(dest, dest.interval)

    def _retry_in(self, dest: _Destination, seconds: float) -> None:
        dest.retry_at = time.monotonic() + seconds
        if dest.timer is not None:
            dest.timer.kill(block=False)
        dest.timer = gevent.spawn_later(seconds, self._retry, dest)

    def _retry(self, dest: _Destination) -> None:
        dest.timer = None
        dest.retry_at = 0.0
        self._kick(dest)
