"""Inbound transactions applied in the background, one origin at a time, in the order they
came (homeserver/rooms/transactions.py hands them here).

Why: a transaction's PDUs may need keys or missing events from other servers, and a
budget that refuses those fetches, or a key server that never answers, used to end in a 429
or a long wait. Synapse takes a 429 from /send as a failed destination and stops sending to
us for ten minutes at first. So a transaction is answered within `ANSWER_WITHIN_SECONDS`:
applied by then, it gets its per-PDU results; if not, or if a budget refused what it needs,
it is staged (storage/transactions.py, `stage`) and answered 200 with no results
(`deferred()`: senders do not act on them), and its origin's worker goes on applying it.

A worker applies its origin's transactions one after another. A budget's refusal
(`KeyResolutionRefused`, `EventResolutionRefused`), or the origin's caps refusing to hold a
PDU whose gap is open (`HoldRefused`, rooms/held.py), is waited out, its retry_after at least,
doubling to `RETRY_MAX_SECONDS`, and the transaction tried again: its PDUs already stored
are found stored. The budgets still bound every fetch; they no longer refuse the sender.
Once applied, the answer is recorded and the staged row deleted in one write, so a retry
gets the answer and a restart resumes exactly what was not applied (`resume`).

Bounds: `MAX_ANSWERING_PER_ORIGIN` requests of one origin waiting for their answer at once
(the one applied, a retry, one more: a sender sends the next only once the last was
answered), and staged work per origin up to `[security.federation]
staged_per_origin_max_pdus` and `_max_bytes`, together with its held PDUs (rooms/held.py).
Past either the answer is 429, the second counted in `weir_inbound_staging_refused_total`.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import gevent
from gevent.event import AsyncResult, Event
from gevent.pool import Group

from homeserver.federation.errors import KeyResolutionRefused
from homeserver.rooms.held import HoldRefused

log = logging.getLogger(__name__)

ANSWER_WITHIN_SECONDS = 1.0
RETRY_MIN_SECONDS = 0.5
RETRY_MAX_SECONDS = 60.0
MAX_ANSWERING_PER_ORIGIN = 3


def deferred() -> dict:
    """The answer of a transaction staged before it was applied: 200, no per-PDU results."""
    return {"pdus": {}}


@dataclass(eq=False)
class Work:
    """One transaction to apply."""

    origin: str
    txn_id: str
    pdus: list
    results: dict  # answers decided already (a shard's), for PDUs not in `pdus`
    source_ip: str | None
    edus: list
    answer: AsyncResult = field(default_factory=AsyncResult)
    # Set when a budget refused what it needs: its request answers now, not at the second.
    refused: Event = field(default_factory=Event)
    answering: bool = False  # its request waits for its answer

    def body(self) -> dict:
        return {
            "pdus": self.pdus,
            "results": self.results,
            "source_ip": self.source_ip,
            "edus": self.edus,
        }

    @classmethod
    def from_body(cls, origin: str, txn_id: str, body: dict) -> Work:
        return cls(
            origin,
            txn_id,
            list(body.get("pdus") or []),
            dict(body.get("results") or {}),
            body.get("source_ip"),
            list(body.get("edus") or []),
        )


class OriginQueues:
    def __init__(self, apply: Callable[[Work], dict]):
        """`apply(work)`: applies a transaction and records its answer; raises
        `KeyResolutionRefused` (or `EventResolutionRefused`) with nothing recorded."""
        self._apply = apply
        self._queues: dict[str, deque[Work]] = {}
        self._group = Group()

    def holds(self, origin: str, txn_id: str) -> bool:
        return any(w.txn_id == txn_id for w in self._queues.get(origin, ()))

    def busy(self, origin: str) -> bool:
        """The origin has transactions in hand: later ones go behind them."""
        return bool(self._queues.get(origin))

    def full(self, origin: str) -> bool:
        """As many of the origin's requests wait for their answer as may."""
        waiting = sum(1 for w in self._queues.get(origin, ()) if w.answering)
        return waiting >= MAX_ANSWERING_PER_ORIGIN

    def submit(self, work: Work) -> None:
        queue = self._queues.get(work.origin)
        if queue is None:
            queue = self._queues[work.origin] = deque()
            self._group.spawn(self._run, work.origin, queue)
        queue.append(work)

    def withdraw(self, work: Work) -> bool:
        """Takes back a transaction its worker has not begun (the head of the queue is the
        one it applies); whether it did."""
        queue = self._queues.get(work.origin)
        if not queue or queue[0] is work or work not in queue:
            return False
        queue.remove(work)
        return True

    def waiting(self) -> int:
        """Transactions waiting behind their origin's one being applied."""
        return sum(max(0, len(q) - 1) for q in self._queues.values())

    def close(self) -> None:
        self._group.kill(block=True, timeout=5)

    def _run(self, origin: str, queue: deque[Work]) -> None:
        try:
            while queue:
                work = queue[0]
                try:
                    work.answer.set(self._until_applied(work))
                except Exception as e:  # a fault, not a refusal: its request gets a 500
                    log.exception("applying transaction %s from %s", work.txn_id, origin)
                    work.answer.set_exception(e)
                queue.popleft()
        finally:
            if self._queues.get(origin) is queue:
                del self._queues[origin]

    def _until_applied(self, work: Work) -> dict:
        delay = RETRY_MIN_SECONDS
        while True:
            try:
                return self._apply(work)
            except (KeyResolutionRefused, HoldRefused) as e:
                work.refused.set()
                wait = max(delay, e.retry_after_ms / 1000)
                log.info(
                    "transaction %s from %s waits %.1f s: %s", work.txn_id, work.origin, wait, e
                )
                gevent.sleep(wait)
                delay = min(delay * 2, RETRY_MAX_SECONDS)


def answered_or_deferred(work: Work) -> bool:
    """Waits until `work` is applied, a budget refused what it needs, or the second is up;
    whether it was applied."""
    work.answering = True
    try:
        gevent.wait([work.answer, work.refused], timeout=ANSWER_WITHIN_SECONDS, count=1)
    finally:
        work.answering = False
    return work.answer.ready()
