"""Transactions to application services (Application Service API, "Pushing events").

The shape is the federation sender's (homeserver/federation/sender.py), for a handful of
trusted receivers instead of thousands of servers:
- the queue is the events stream itself, with each appservice's position beside it
  (storage/appservice.py): an event is in it from the write that stored it, so nothing is
  lost to a restart; a transaction is kept whole before it is sent and sent again, same
  txnId and same events, until the appservice answers 200; only then does it move on;
- one transaction in flight per appservice, at most `MAX_EVENTS` events, oldest first;
- a pool of its own (`appservice.max_in_flight`), never the main pool, and one total
  deadline per call (appservice/client.py): a hung appservice holds one slot and one
  connection, and delays no other appservice, no client and no federation;
- a failure backs off (`BACKOFF_START`, doubling to `BACKOFF_MAX`), and the appservice then
  catches up from where it was; a request from it (its as_token) ends the backoff at once,
  as a bridge that restarted calls us first;
- typing and receipts (MSC2409) and to-device messages (MSC3202) wait in memory, per
  appservice, and go with the next transaction; a restart forgets those not yet in one;
- with several instances, one sends to an appservice at a time: the holder of its lease
  (storage/leases.py), claimed before a call its lease would not cover, which also reads
  its row again (another instance may have moved it on). Another instance looks again when
  the lease lapses, and resends the transaction the holder left unanswered, same txnId.

Runs in main only (homeserver/processes/main.py starts and stops it).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import gevent
from gevent.lock import BoundedSemaphore

from homeserver.appservice.client import AppserviceClient, AppserviceUnreachable
from homeserver.appservice.registration import Registration
from homeserver.core.clock import now_ms
from homeserver.rooms.format import client_event
from homeserver.storage.appservice import APPSERVICES, AppserviceStore, Handover, PendingTxn
from homeserver.storage.leases import QueueLeases, lease_seconds
from homeserver.storage.rooms import StoredEvent

log = logging.getLogger(__name__)

MAX_EVENTS = 100  # events read from the stream for one transaction
MAX_EPHEMERAL = 100
MAX_QUEUED_EPHEMERAL = 1000  # per appservice; past this the oldest go
BACKOFF_START = 1.0
BACKOFF_MAX = 60.0  # a bridge is ours: it should hear from us soon after it is back
MSC2409_EPHEMERAL = "de.sorunome.msc2409.ephemeral"
MSC2409_TO_DEVICE = "de.sorunome.msc2409.to_device"

Interest = Callable[[Registration, list[StoredEvent]], list[StoredEvent]]


@dataclass
class _Service:
    registration: Registration
    busy: bool = False  # its runner is alive (waiting for a slot, sending, or backing off)
    pending: bool = True  # the stream may hold events for it
    interval: float = 0.0  # the current backoff, 0 when none
    timer: gevent.Greenlet | None = None  # the end of a backoff, or of another's lease
    held_elsewhere: float | None = None  # seconds until another instance's lease lapses
    ephemeral: deque = field(default_factory=lambda: deque(maxlen=MAX_QUEUED_EPHEMERAL))
    to_device: deque = field(default_factory=lambda: deque(maxlen=MAX_QUEUED_EPHEMERAL))
    # Its row, as last claimed or written (storage/appservice.py).
    position: int = 0  # the stream position it has been served up to
    saved: int = 0  # the position its row holds
    txn: PendingTxn | None = None  # the transaction it is owed, kept in its row


class AppserviceSender:
    def __init__(
        self,
        registrations: tuple[Registration, ...],
        store: AppserviceStore,
        client: AppserviceClient,
        interest: Interest,
        max_in_flight: int,
        *,
        backoff_start: float = BACKOFF_START,
        backoff_max: float = BACKOFF_MAX,
        leases: QueueLeases | None = None,
    ):
        self.store = store
        # Whose appservices these are: the instance's leases (one instance by default).
        self.leases = leases or QueueLeases(
            store.db, APPSERVICES, "main", lease_seconds(0, client.deadline)
        )
        self.client = client
        self.interest = interest
        self.max_in_flight = max_in_flight
        self.backoff_start = backoff_start
        self.backoff_max = backoff_max
        self.slots = BoundedSemaphore(max_in_flight)
        self.in_flight = 0
        self.delivered = 0
        self.failures = 0
        # Only appservices with a URL are pushed to; the others only register users.
        self._services = {r.id: _Service(r) for r in registrations if r.url}
        self._runners: set[gevent.Greenlet] = set()
        self._running = False

    # --- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Resumes every appservice: what it was owed before a restart goes first."""
        self._running = True
        for service in self._services.values():
            self._kick(service)

    def stop(self) -> None:
        """Stops sending; a transaction in flight is abandoned (its row keeps it)."""
        self._running = False
        for service in self._services.values():
            if service.timer is not None:
                service.timer.kill(block=False)
        gevent.killall(list(self._runners), block=True, timeout=5)
        self.leases.release_all()

    # --- what the rest of the server tells us -------------------------------------------

    def wake(self, _stored=None) -> None:
        """Events were stored (the rooms persist listener). Never blocks."""
        for service in self._services.values():
            service.pending = True
            self._kick(service)

    def stored_elsewhere(self, _after: int, _upto: int) -> None:
        """Another instance stored events, or handed typing, receipts or to-device messages
        over: the appservices this one holds may be owed them."""
        self.wake()

    def send_ephemeral(self, edu: dict, wants: Callable[[Registration], bool]) -> None:
        """Queues a typing or receipt EDU for every appservice asking for them
        (`receive_ephemeral`) that `wants` it."""
        for service in self._services.values():
            if service.registration.ephemeral and wants(service.registration):
                service.ephemeral.append(edu)
                self._kick(service)

    def send_to_device(
        self, sender: str, event_type: str, local: list[tuple[str, str, dict]]
    ) -> None:
        """To-device messages stored for (user, device, content) recipients of ours: those
        of an appservice's users go to it too, when it asked for them (MSC3202)."""
        for service in self._services.values():
            registration = service.registration
            if not registration.msc3202:
                continue
            for user_id, device_id, content in local:
                if registration.owns_user(user_id):
                    service.to_device.append(
                        {
                            "type": event_type,
                            "sender": sender,
                            "to_user_id": user_id,
                            "to_device_id": device_id,
                            "content": content,
                        }
                    )
            if service.to_device:
                self._kick(service)

    def on_request_from(self, appservice_id: str) -> None:
        """The appservice called us: it is up. Its backoff ends and it catches up now."""
        service = self._services.get(appservice_id)
        if service is None or service.timer is None or service.held_elsewhere is not None:
            return
        service.timer.kill(block=False)
        service.timer = None
        service.interval = 0.0
        self.store.set_retry(appservice_id, 0)
        self._kick(service)

    def backing_off(self) -> int:
        return sum(1 for s in self._services.values() if s.timer and s.held_elsewhere is None)

    # --- sending --------------------------------------------------------------------------

    def _kick(self, service: _Service) -> None:
        if not self._running or service.busy:
            return
        work = self._run
        if service.timer is not None:  # backing off, or another instance holds it
            if service.held_elsewhere is None or not (service.ephemeral or service.to_device):
                return
            work = self._pass_on  # what arrived meanwhile goes to the holder now
        service.busy = True
        runner = gevent.spawn(work, service)
        self._runners.add(runner)
        runner.link(self._runners.discard)

    def _pass_on(self, service: _Service) -> None:
        try:
            self._hand_over(service)
        except Exception:  # still in memory: handed over or sent at the next look
            log.exception("appservice %s: handing over failed", service.registration.id)
        finally:
            service.busy = False

    def _run(self, service: _Service) -> None:
        failed = False
        try:
            with self.slots:
                self.in_flight += 1
                try:
                    failed = not self._drain(service)
                finally:
                    self.in_flight -= 1
        except Exception:
            log.exception("appservice %s: sending failed", service.registration.id)
            self.leases.forget((service.registration.id,))  # its row is claimed afresh
            failed = True
        finally:
            service.busy = False
        if failed:
            self._back_off(service)
        elif service.held_elsewhere is not None:
            self._look_again(service, service.held_elsewhere)
        elif service.pending or service.ephemeral or service.to_device:
            self._kick(service)

    def _drain(self, service: _Service) -> bool:
        """Sends until nothing is owed, or another instance holds the appservice; False
        when a transaction failed."""
        while self._running:
            service.pending = False
            if not self._hold(service):
                self._hand_over(service)
                return True
            if service.txn is None:
                more = self._next_transaction(service)
                if service.txn is None:
                    if not more:
                        return True
                    continue
                if not self._hold(service):  # the call must end within the lease
                    return True
            txn = service.txn
            if not self._deliver(service, txn):
                return False
            self.store.delivered(service.registration.id, txn)
            service.position = service.saved = txn.up_to
            service.txn = None
            service.interval = 0.0
        return True

    def _hold(self, service: _Service) -> bool:
        """Whether this instance holds the appservice's lease through one more call; when
        not sure, claims it and reads its row afresh. False while another holds it."""
        key = (service.registration.id,)
        service.held_elsewhere = None
        if self.leases.covers(key, self.client.deadline):
            return True
        row, lapses_in = self.store.claim(self.leases, key[0])
        if row is None:
            service.held_elsewhere = lapses_in
            return False
        service.position = service.saved = row.stream_position
        service.txn = row.pending
        service.interval = row.retry_interval_ms / 1000
        return True

    def _next_transaction(self, service: _Service) -> bool:
        """Keeps the next transaction in `service.txn` (and its row) unless the stream up to
        where it was read holds nothing for the appservice; True if there is more to read."""
        registration = service.registration
        stored, reached, more = self.store.events_after(service.position, MAX_EVENTS)
        events = self.interest(registration, stored)
        handed = self._handed_over(registration.id)
        more = more or len(handed.ids) == MAX_EPHEMERAL
        own = _take(service.ephemeral, MAX_EPHEMERAL - len(handed.ephemeral))
        own_to_device = _take(service.to_device, MAX_EPHEMERAL - len(handed.to_device))
        ephemeral, to_device = handed.ephemeral + own, handed.to_device + own_to_device
        if not events and not ephemeral and not to_device:
            service.position = reached
            # Written now and then, not per event: after a restart the few events read
            # again are judged again, and only those it is sent move the row each time.
            if reached - service.saved >= MAX_EVENTS:
                self.store.advance(registration.id, reached, self.leases.owner)
                service.saved = reached
            return more
        now = now_ms()
        body: dict = {"events": [client_event(s, now) for s in events]}
        if registration.ephemeral:
            body["ephemeral"] = ephemeral
            body[MSC2409_EPHEMERAL] = ephemeral  # what mautrix and other bridges read
        if registration.msc3202:
            body[MSC2409_TO_DEVICE] = to_device
        service.txn = self.store.begin(registration.id, reached, body, self.leases.owner, handed)
        if service.txn is None:  # the lease was lost meanwhile: claimed afresh, or not
            self.leases.forget((registration.id,))
            _put_back(service.ephemeral, own)
            _put_back(service.to_device, own_to_device)
        return more

    def _handed_over(self, appservice_id: str) -> Handover:
        """What other instances received for the appservice while this one held it."""
        if not self.store.db.shared:
            return Handover()
        return self.store.handed_over(appservice_id, MAX_EPHEMERAL)

    def _hand_over(self, service: _Service) -> None:
        """Another instance holds the appservice: the typing, receipts and to-device
        messages this one received for it go to the holder through the database."""
        if not self.store.db.shared or not (service.ephemeral or service.to_device):
            return
        ephemeral = _take(service.ephemeral, len(service.ephemeral))
        to_device = _take(service.to_device, len(service.to_device))
        try:
            self.store.hand_over(service.registration.id, ephemeral, to_device)
        except BaseException:
            _put_back(service.ephemeral, ephemeral)
            _put_back(service.to_device, to_device)
            raise

    def _deliver(self, service: _Service, txn: PendingTxn) -> bool:
        registration = service.registration
        assert registration.url is not None
        try:
            answer = self.client.transaction(
                registration.url, registration.hs_token, txn.txn_id, txn.body
            )
        except AppserviceUnreachable as e:
            log.info("appservice %s: transaction %d: %s", registration.id, txn.txn_id, e)
            self.failures += 1
            return False
        if answer.status != 200:
            log.info(
                "appservice %s: transaction %d answered %d",
                registration.id,
                txn.txn_id,
                answer.status,
            )
            self.failures += 1
            return False
        self.delivered += 1
        return True

    def _back_off(self, service: _Service) -> None:
        if not self._running:
            return
        service.interval = min(self.backoff_max, max(self.backoff_start, service.interval * 2))
        self.store.set_retry(service.registration.id, int(service.interval * 1000))
        service.timer = gevent.spawn_later(service.interval, self._retry, service)

    def _look_again(self, service: _Service, seconds: float) -> None:
        """Another instance holds the appservice: it sends what the stream holds; this one
        claims it once the lease lapses, should the holder have stopped."""
        if self._running:
            service.timer = gevent.spawn_later(max(0.05, seconds), self._retry, service)

    def _retry(self, service: _Service) -> None:
        service.timer = None
        service.held_elsewhere = None
        self._kick(service)


def _take(queue: deque, limit: int) -> list:
    return [queue.popleft() for _ in range(min(limit, len(queue)))]


def _put_back(queue: deque, items: list) -> None:
    queue.extendleft(reversed(items))
