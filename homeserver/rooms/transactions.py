"""Inbound transactions (``PUT /_matrix/federation/v1/send/{txnId}``): who does what.

With ``federation.worker.shards = 0`` main receives a transaction itself with
:class:`TransactionProcessor`. With shards, a shard receives it with
:class:`ShardTransactionReceiver`: it checks every PDU under its share of the key budget,
then relays the PDUs that passed, with the source IP of the request, to main's
:class:`TransactionProcessor` (over IPC), which checks them again under its own budget,
authorises and stores them, and records the answer.

Idempotency: the answer to ``(origin, txn_id)`` is recorded once given, and a retry gets it
back without anything being applied again (and a PDU already stored is never stored twice,
even if the answer was lost). A refused key resolution anywhere refuses the whole
transaction with 429 before anything is applied or recorded, so the sender's retry loses
nothing.

EDUs (typing, receipts, presence, to-device) are accepted and not processed yet.
"""

from __future__ import annotations

import json
import logging
from typing import Callable

from homeserver.core.clock import now_ms
from homeserver.core.concurrency import KeyedLocks
from homeserver.rooms.pdu_checks import PduChecker
from homeserver.rooms.received import ReceivedEventRefused
from homeserver.rooms.service import RoomService
from homeserver.storage.transactions import ReceivedTransactionStore

log = logging.getLogger(__name__)

# Spec: "Transactions are limited in size; they can have at most 50 PDUs and 100 EDUs."
MAX_PDUS = 50
MAX_EDUS = 100

# relay(origin, txn_id, pdus, results, source_ip) -> answer: hands checked PDUs to main.
# `results` are the shard's answers for the PDUs it dropped. Raises KeyResolutionRefused.
Relay = Callable[[str, str, list, dict, "str | None"], dict]


class TransactionProcessor:
    """Main's side: check, authorise and store the PDUs, once per (origin, txn_id)."""

    def __init__(
        self,
        checker: PduChecker,
        rooms: RoomService,
        store: ReceivedTransactionStore,
        on_origin: Callable[[str], None] | None = None,
    ):
        self.checker = checker
        self.rooms = rooms
        self.store = store
        # Told of every transaction's origin: it is up, so the sender's backoff for it ends.
        self._on_origin = on_origin
        self._locks = KeyedLocks()

    def receive(
        self,
        origin: str,
        txn_id: str,
        pdus: list[dict],
        source_ip: str | None,
        results: dict | None = None,
    ) -> dict:
        """The answer, ``{"pdus": {event_id: {} | {"error": ...}}}``. ``results`` are answers
        already decided for PDUs not passed in (a shard's). Raises ``KeyResolutionRefused``
        with nothing applied."""
        if self._on_origin is not None:
            self._on_origin(origin)
        if not pdus and not results:
            return {"pdus": {}}  # EDUs only: nothing to apply, the same answer every time
        # One at a time per transaction: a retry arriving through another shard while the
        # first attempt runs waits for its answer.
        with self._locks.hold(json.dumps([origin, txn_id])):
            answer = self.store.answer(origin, txn_id)
            if answer is not None:
                return answer
            results = dict(results or {})
            checked = self.checker.check(pdus, source_ip)
            # Parents before children (a child is deeper), whatever order they were sent in.
            for item in sorted(checked, key=lambda c: c.pdu["depth"] if c.error is None else 0):
                if item.error is not None:
                    results[item.event_id] = {"error": item.error}
                    continue
                if item.event is None:  # the checker sets one or the other, never neither
                    raise ValueError(f"checked PDU {item.event_id} has no event and no error")
                try:
                    self.rooms.receive_event(item.version, item.event, item.signed_by)
                    results[item.event_id] = {}
                except ReceivedEventRefused as e:
                    log.info("event %s from %s refused: %s", item.event_id, origin, e)
                    results[item.event_id] = {"error": str(e)}
            answer = {"pdus": results}
            self.store.record(origin, txn_id, answer, now_ms())
            return answer


class ShardTransactionReceiver:
    """A worker shard's side: check the PDUs under the shard's budget, relay the ones that
    passed to main, and pass main's answer on."""

    def __init__(self, checker: PduChecker, store: ReceivedTransactionStore, relay: Relay):
        self.checker = checker
        self.store = store
        self.relay = relay

    def receive(self, origin: str, txn_id: str, pdus: list[dict], source_ip: str | None) -> dict:
        if not pdus:
            return {"pdus": {}}  # EDUs only: nothing for main to apply
        # A retry of an answered transaction costs no key resolution at all.
        answer = self.store.answer(origin, txn_id)
        if answer is not None:
            return answer
        checked = self.checker.check(pdus, source_ip)
        passed = [item.pdu for item in checked if item.error is None]
        dropped = {
            item.event_id: {"error": item.error} for item in checked if item.error is not None
        }
        return self.relay(origin, txn_id, passed, dropped, source_ip)
