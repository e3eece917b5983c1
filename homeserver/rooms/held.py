"""Received PDUs whose gap could not be filled yet: held and retried, never refused.

A PDU whose missing prev_events or auth_events its origin did not give (down, slow, an
answer that did not close the gap, the event-resolution deadline passed: rooms/gaps.py)
used to get a per-PDU error. Synapse never sends a PDU again once it got one, so after a
netsplit that event was lost to us for good. Now it is kept (storage/transactions.py,
`hold`), the sender is told it was accepted, and it is tried again in the background:
its missing events fetched from the origin again, then received like any PDU (current
state, extremities, /sync). A retry waits `first_retry` seconds, doubling to
`MAX_RETRY_SECONDS`; a PDU still held after `max_age` seconds is dropped and counted.

Bounds: held PDUs count against their origin's staging caps (`[security.federation]
staged_per_origin_max_pdus`, `_max_bytes`, with its staged transactions). Past them the
PDU is not held: `HoldRefused`, which the origin's worker waits out like a budget's
refusal, so its transaction is answered 429 if it was not answered yet (rooms/staging.py).
Retries run `RETRIES_AT_ONCE` origins at a time, one PDU of an origin at a time; an origin
whose PDU is still missing its events waits with all its held PDUs, so a dead server costs
one fetch per backoff, not one per PDU. Only the origin is asked: the room's other servers
are not tried (they would need a choice of whom to trust with what, not done yet).

A held PDU blocks nothing: its origin's later transactions go on, and a later event that
builds on it fetches it from the origin through the gap machinery, as it would any event.
"""

from __future__ import annotations

import logging
from typing import Callable

import gevent
from gevent.event import Event
from gevent.pool import Pool

from homeserver.core.clock import now_ms
from homeserver.storage.transactions import HeldPdu, ReceivedTransactionStore, StagingCaps

log = logging.getLogger(__name__)

# The first retry and the age limit are `[security.federation] held_pdu_first_retry` (30 s)
# and `held_pdu_max_age` (a day), why beside them in config.py. Retries double up to an
# hour, the sender's own backoff cap: a server down longer is asked once an hour.
MAX_RETRY_SECONDS = 3600.0
# Origins retried at once, and held PDUs read per look; the event-resolution budget bounds
# the fetches themselves.
RETRIES_AT_ONCE = 4
DUE_PER_LOOK = 100
# How long the retrier sleeps with nothing due, at most (it is woken when a PDU is held).
IDLE_LOOK_SECONDS = 60.0

# retry(origin, pdu, source_ip) -> True: stored (or stored before), False: its events are
# still missing, None: refused for good (rejected, not of a room we are in).
Retry = Callable[[str, dict, "str | None"], "bool | None"]


class HoldRefused(Exception):
    """The origin's staged and held work is at its caps: this PDU is not held."""

    def __init__(self, origin: str, retry_after_ms: int):
        super().__init__(f"{origin} has as much work held and staged as it may")
        self.retry_after_ms = retry_after_ms


class HeldPdus:
    def __init__(
        self,
        store: ReceivedTransactionStore,
        caps: StagingCaps,
        first_retry: float,
        max_age: float,
    ):
        self.store = store
        self.caps = caps
        self.first_retry_ms = int(first_retry * 1000)
        self.max_retry_ms = max(self.first_retry_ms, int(MAX_RETRY_SECONDS * 1000))
        self.max_age_ms = int(max_age * 1000)
        self.retries = 0  # tries made after the first
        self.given_up = 0  # dropped past max_age
        self._retry: Retry | None = None
        self._wake = Event()
        self._loop: gevent.Greenlet | None = None

    def hold(self, origin: str, txn_id: str, event_id: str, pdu: dict, source_ip) -> None:
        """Keeps the PDU to be tried again; raises `HoldRefused` past the origin's caps."""
        now = now_ms()
        held = HeldPdu(origin, event_id, pdu, source_ip, now, now + self.first_retry_ms)
        if not self.store.hold(held, txn_id, self.caps):
            raise HoldRefused(origin, self.first_retry_ms)
        log.info("holding %s from %s: its missing events could not be fetched", event_id, origin)
        self._wake.set()

    def start(self, retry: Retry) -> None:
        """Retries held PDUs (those of before a restart too) in the background."""
        self._retry = retry
        if self._loop is None:
            self._loop = gevent.spawn(self._run)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.kill(block=True, timeout=5)
            self._loop = None

    def _run(self) -> None:
        while True:
            try:
                due = self.store.held_due(now_ms(), DUE_PER_LOOK)
                if due:
                    self._retry_all(due)
                    continue
                self._sleep_until(self.store.held_next_try())
            except Exception:  # a fault of ours (the database): look again later
                log.exception("retrying held PDUs")
                gevent.sleep(IDLE_LOOK_SECONDS)

    def _sleep_until(self, next_try_ms: int | None) -> None:
        wait = IDLE_LOOK_SECONDS
        if next_try_ms is not None:
            wait = min(wait, max(0.0, (next_try_ms - now_ms()) / 1000))
        self._wake.clear()
        self._wake.wait(wait)

    def _retry_all(self, due: list[HeldPdu]) -> None:
        by_origin: dict[str, list[HeldPdu]] = {}
        for held in due:
            by_origin.setdefault(held.origin, []).append(held)
        pool = Pool(RETRIES_AT_ONCE)
        try:
            for origin_held in by_origin.values():
                pool.spawn(self._retry_origin, origin_held)
            pool.join()
        finally:
            pool.kill(block=True)

    def _retry_origin(self, due: list[HeldPdu]) -> None:
        """The origin's due PDUs, the last held first (filling its gap may fetch the
        others); the first still missing its events puts the rest off with it."""
        try:
            for held in sorted(due, key=lambda h: -h.row_id):
                if not self._retry_one(held):
                    return
        except Exception:  # a fault of ours (the database): the next look tries again
            log.exception("retrying held PDUs of %s", due[0].origin)
            gevent.sleep(IDLE_LOOK_SECONDS)

    def _retry_one(self, held: HeldPdu) -> bool:
        """Whether the origin's next held PDU is worth trying now."""
        now = now_ms()
        if now - held.held_ms >= self.max_age_ms:
            self.store.release_held(held.row_id)
            self.given_up += 1
            log.info("gave up %s from %s: its events never came", held.event_id, held.origin)
            return True
        self.retries += 1
        try:
            outcome = self._retry(held.origin, held.pdu, held.source_ip) if self._retry else False
        except Exception as e:  # a budget's refusal, or a fault: tried again later
            log.info("retrying %s from %s: %s", held.event_id, held.origin, e)
            outcome = False
        if outcome is not False:
            self.store.release_held(held.row_id)
            log.info(
                "held %s from %s %s", held.event_id, held.origin, "stored" if outcome else "refused"
            )
            return True
        tries = held.tries + 1
        delay = min(self.first_retry_ms << min(tries, 20), self.max_retry_ms)
        # Never later than its age limit, so it is given up on time.
        next_try = min(now_ms() + delay, held.held_ms + self.max_age_ms)
        self.store.retry_held_later(held.row_id, tries, next_try)
        self.store.postpone_held(held.origin, next_try)
        return False
