"""Inbound transactions (``PUT /_matrix/federation/v1/send/{txnId}``): who does what.

With ``federation.worker.shards = 0`` main receives a transaction itself with
:class:`TransactionProcessor`. With shards, a shard receives it with
:class:`ShardTransactionReceiver`: it checks every PDU under its share of the key budget,
then relays the PDUs that passed, with the source IP of the request, to main's
:class:`TransactionProcessor` (over IPC), which checks them again under its own budget,
authorises and stores them, and records the answer.

Order: one transaction at a time per origin, as the spec has a server send them (the next
only once the last was answered 200), applied by the origin's worker (rooms/staging.py). A
transaction not applied within a second, or whose fetches a budget refused, is staged and
answered 200, and applied after; a retry of one still in hand is answered so too. More than
``MAX_ANSWERING_PER_ORIGIN`` at once is not a retry but a misbehaving server: 429.

Idempotency: the answer to ``(origin, txn_id)`` is recorded once given, and a retry gets it
back without anything being applied again (and a PDU already stored is never stored twice,
even if the answer was lost). A budget's refusal of a PDU's keys or missing events never
refuses the transaction: main's worker waits it out (rooms/staging.py), and a shard whose
share refuses its check relays the PDUs unchecked, for main to check.

A PDU whose missing events its origin could not give is held and tried again later
(rooms/held.py): the sender is told it was accepted, since a per-PDU error would make it
drop the event for good. Past the origin's caps it is not held, and the transaction waits
(429 if not answered yet). Auth rejections and malformed PDUs keep their per-PDU errors.

EDUs: the ones we apply (``APPLIED_EDU_TYPES``: typing, read receipts, and end-to-end
encryption's device list, signing key and to-device EDUs) go to main with the
PDUs, since typing lives in main's memory and main wakes the syncs; main hands them to its
``on_edus`` (homeserver/sync/edus.py checks and applies them) after the PDUs, so a receipt
may point at an event of the same transaction. They are applied once per transaction: a
retry answered from the record applies nothing again. Every other EDU is accepted and
dropped (``applied_edus`` says why, type by type). The transaction's answer never depends on
its EDUs (spec: EDUs have no answer). A transaction of EDUs alone is applied at once, unless
its origin has transactions in hand: then it waits its turn behind them, staged like them.
"""

from __future__ import annotations

import logging
from typing import Callable

from homeserver.core.clock import now_ms
from homeserver.core.errors import limit_exceeded
from homeserver.core.events import Event
from homeserver.federation.errors import KeyResolutionRefused
from homeserver.rooms.gaps import GapFiller
from homeserver.rooms.held import HeldPdus
from homeserver.rooms.out_of_room import OutOfRoomEnds
from homeserver.rooms.pdu_checks import CheckedPdu, PduChecker
from homeserver.rooms.received import MissingEventsRefused, ReceivedEventRefused
from homeserver.rooms.service import RoomService
from homeserver.rooms.staging import OriginQueues, Work, answered_or_deferred, deferred
from homeserver.storage.transactions import ReceivedTransactionStore, StagingCaps

log = logging.getLogger(__name__)

# Spec: "Transactions are limited in size; they can have at most 50 PDUs and 100 EDUs."
MAX_PDUS = 50
MAX_EDUS = 100

# The EDU types main applies; any other is unknown to us, accepted and dropped (spec: a server
# ignores EDUs it does not understand). End-to-end encryption's go to
# homeserver/e2ee/inbound_edus.py, presence to sync/presence.py, the others to sync/edus.py.
E2EE_EDU_TYPES = frozenset({"m.device_list_update", "m.signing_key_update", "m.direct_to_device"})
APPLIED_EDU_TYPES = frozenset({"m.typing", "m.receipt", "m.presence"}) | E2EE_EDU_TYPES

# relay(origin, txn_id, pdus, results, source_ip, edus) -> answer: hands checked PDUs, and
# the EDUs main applies, to main. `results` are the shard's answers for the PDUs it dropped.
# Raises KeyResolutionRefused.
Relay = Callable[[str, str, list, dict, "str | None", list], dict]

# on_edus(origin, edus): checks and applies a transaction's EDUs of APPLIED_EDU_TYPES.
EduHandler = Callable[[str, list], None]


def applied_edus(edus: list) -> list[dict]:
    """The EDUs of a transaction that main applies; the rest are dropped (see above)."""
    return [e for e in edus if isinstance(e, dict) and e.get("edu_type") in APPLIED_EDU_TYPES]


class TransactionProcessor:
    """Main's side: check, authorise and store the PDUs, once per (origin, txn_id)."""

    def __init__(
        self,
        checker: PduChecker,
        rooms: RoomService,
        store: ReceivedTransactionStore,
        on_origin: Callable[[str], None] | None = None,
        on_edus: EduHandler | None = None,
        gaps: GapFiller | None = None,
        out_of_room: OutOfRoomEnds | None = None,
        staging_caps: StagingCaps | None = None,
        held: HeldPdus | None = None,
    ):
        self.checker = checker
        # Ends of our users' invites and knocks in rooms we are not in (out_of_room.py).
        self._out_of_room = out_of_room
        # Fetches what a PDU lacks (rooms/gaps.py) before it is authorised.
        self._gaps = gaps
        self.rooms = rooms
        self.store = store
        # Told of every transaction's origin: it is up, so the sender's backoff for it ends.
        self._on_origin = on_origin
        self._on_edus = on_edus
        self._queues = OriginQueues(self._apply)
        self.staging_caps = staging_caps or StagingCaps()
        self.staging_refused = 0  # transactions answered 429 past the staging caps
        # PDUs whose gap could not be filled, kept and retried (rooms/held.py).
        self.held = held

    def resume(self) -> int:
        """Applies, in the background, every transaction staged before a restart, and
        starts retrying the held PDUs."""
        if self.held is not None:
            self.held.start(self._retry_held)
        staged = self.store.staged()
        for origin, txn_id, body in staged:
            self._queues.submit(Work.from_body(origin, txn_id, body))
        if staged:
            log.info("resuming %d staged inbound transactions", len(staged))
        return len(staged)

    def close(self) -> None:
        if self.held is not None:
            self.held.close()
        self._queues.close()

    def receive(
        self,
        origin: str,
        txn_id: str,
        pdus: list[dict],
        source_ip: str | None,
        results: dict | None = None,
        edus: list | None = None,
    ) -> dict:
        """The answer, ``{"pdus": {event_id: {} | {"error": ...}}}``, or ``deferred()`` for
        a transaction staged to be applied after. ``results`` are answers already decided
        for PDUs not passed in (a shard's)."""
        if self._on_origin is not None:
            self._on_origin(origin)
        if not pdus and not results and not self._queues.busy(origin):
            # EDUs only, nothing of the origin's in hand: nothing recorded, the same answer
            # every time. Typing and receipts are idempotent, so a retry changes nothing.
            # Behind staged work they queue like any transaction, so a receipt or a
            # to-device message is applied after the events sent before it.
            self._apply_edus(origin, edus)
            return {"pdus": {}}
        answer = self.store.answer(origin, txn_id)
        if answer is not None:
            return answer
        if self._queues.holds(origin, txn_id):  # a retry of one in hand
            return deferred()
        if self._queues.full(origin):
            raise limit_exceeded(1000, "This server's earlier transactions are still being applied")
        work = Work(origin, txn_id, pdus, dict(results or {}), source_ip, list(edus or []))
        self._queues.submit(work)
        if answered_or_deferred(work):
            return work.answer.get()
        # Answered now, applied after: kept first, so a restart loses nothing.
        body = work.body()
        if not self.store.stage(origin, txn_id, body, self.staging_caps, now_ms()):
            self.staging_refused += 1
            self._queues.withdraw(work)
            raise limit_exceeded(10_000, "Too much of this server's work is waiting to be applied")
        if work.answer.ready():  # applied while it was being kept: not staged after all
            self.store.record(origin, txn_id, work.answer.get(), now_ms())
        return deferred()

    def waiting(self) -> int:
        """Transactions waiting behind their origin's one being applied."""
        return self._queues.waiting()

    def _apply(self, work: Work) -> dict:
        """Applies a transaction, and records its answer (which ends its staging)."""
        answer = self._apply_pdus(work, dict(work.results))
        self.store.record(work.origin, work.txn_id, answer, now_ms())
        self._apply_edus(work.origin, work.edus)
        return answer

    def _apply_edus(self, origin: str, edus: list | None) -> None:
        applied = applied_edus(edus or [])
        if applied and self._on_edus is not None:
            self._on_edus(origin, applied)

    def _apply_pdus(self, work: Work, results: dict) -> dict:
        """Checks, authorises and stores (or holds) the PDUs: the transaction's answer.
        Raises `HoldRefused` past the origin's caps, for its worker to wait out."""
        origin, source_ip = work.origin, work.source_ip
        checked = self.checker.check(work.pdus, source_ip, origin)
        # Parents before children (a child is deeper), whatever order they were sent in.
        for item in sorted(checked, key=lambda c: c.pdu["depth"] if c.error is None else 0):
            if item.error is not None:
                results[item.event_id] = {"error": item.error}
                continue
            if item.event is None:  # the checker sets one or the other, never neither
                raise ValueError(f"checked PDU {item.event_id} has no event and no error")
            try:
                self._take(origin, item, source_ip)
                results[item.event_id] = {}
            except MissingEventsRefused as e:
                results[item.event_id] = self._hold(work, item, e)
            except ReceivedEventRefused as e:
                log.info("event %s from %s refused: %s", item.event_id, origin, e)
                results[item.event_id] = {"error": str(e)}
        return {"pdus": results}

    def _hold(self, work: Work, item: CheckedPdu, refused: MissingEventsRefused) -> dict:
        """The answer for a PDU whose gap is still open: accepted and held, since a per-PDU
        error makes the sender drop it for good. Raises `HoldRefused` past the caps."""
        if self.held is None:
            return {"error": str(refused)}
        self.held.hold(work.origin, work.txn_id, item.event_id, item.pdu, work.source_ip)
        return {}

    def _take(self, origin: str, item: CheckedPdu, source_ip: str | None) -> None:
        """Fills the checked PDU's gap, then authorises and stores it. Raises
        `ReceivedEventRefused` (`MissingEventsRefused` when its gap is still open)."""
        event = item.event
        if event is None or self._out_of_room_end(event):
            return
        if self._gaps is not None:  # raises EventResolutionRefused: waited out, retried
            self._gaps.fill(origin, item.version, event, source_ip)
        self.rooms.receive_event(item.version, event, item.signed_by)

    def _retry_held(self, origin: str, pdu: dict, source_ip: str | None) -> bool | None:
        """A held PDU tried again (rooms/held.py): True stored, False its events still
        missing, None refused for good. Raises a budget's refusal."""
        checked = self.checker.check([pdu], source_ip, origin)
        item = checked[0] if checked else None
        if item is None or item.error is not None or item.event is None:
            log.info("held PDU from %s refused: %s", origin, item and item.error)
            return None
        try:
            self._take(origin, item, source_ip)
            return True
        except MissingEventsRefused:
            return False
        except ReceivedEventRefused as e:
            log.info("held event %s from %s refused: %s", item.event_id, origin, e)
            return None

    def _out_of_room_end(self, event: Event) -> bool:
        """A leave or ban in a room none of our users is in, which ends a kept invite or
        knock: recorded there, since the room's own events are not taken in."""
        if (
            self._out_of_room is None
            or event.type != "m.room.member"
            or event.membership not in ("leave", "ban")
            or self.rooms.is_joined_here(event.room_id)
        ):
            return False
        return self._out_of_room.receive(event)


class ShardTransactionReceiver:
    """A worker shard's side: check the PDUs under the shard's budget, relay the ones that
    passed to main, and pass main's answer on."""

    def __init__(self, checker: PduChecker, store: ReceivedTransactionStore, relay: Relay):
        self.checker = checker
        self.store = store
        self.relay = relay

    def close(self) -> None:
        """Nothing of its own to stop: main applies what it relays."""

    def receive(
        self,
        origin: str,
        txn_id: str,
        pdus: list[dict],
        source_ip: str | None,
        edus: list | None = None,
    ) -> dict:
        # Only the EDUs main applies cross the IPC; the others end here.
        applied = applied_edus(edus or [])
        if not pdus:
            # EDUs only: main applies them; no PDU for it to check again.
            return (
                self.relay(origin, txn_id, [], {}, source_ip, applied) if applied else {"pdus": {}}
            )
        # A retry of an answered transaction costs no key resolution at all.
        answer = self.store.answer(origin, txn_id)
        if answer is not None:
            return answer
        try:
            checked = self.checker.check(pdus, source_ip, origin)
        except KeyResolutionRefused:
            # Main checks every relayed PDU again under its own budget, and stages what must
            # wait for it: the sender is answered 200, never 429 for our budget's sake.
            return self.relay(origin, txn_id, pdus, {}, source_ip, applied)
        passed = [item.pdu for item in checked if item.error is None]
        dropped = {
            item.event_id: {"error": item.error} for item in checked if item.error is not None
        }
        return self.relay(origin, txn_id, passed, dropped, source_ip, applied)
