"""Long-poll /sync (client-server spec, "Syncing").

A sync reads the streams' positions first and computes everything up to them, so the
next_batch it returns covers exactly what it sent. An initial sync (no `since`) gives each
room's state and its latest timeline events; an incremental one what changed after the
token. When nothing did, the sync waits on the notifier (see notifier.py) until something
concerning the user happens or `timeout` passes (a `WaitingSync`, which the HTTP layer waits
for once Flask is done with the request); a sync that times out returns an empty response
whose next_batch is the `since` it was given.

Rooms are read at the position the sync reads up to: the user's membership there decides
the section (join, invite, knock, leave). A room the user joined since the token is sent
whole (full state, latest events); one they left gets its events up to the leave.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import Callable, Self

from homeserver.core.clock import now_ms
from homeserver.core.collector import without_full_passes
from homeserver.core.concurrency import let_io_run
from homeserver.core.json_text import EncodedJson, encode_in_pieces
from homeserver.core.requester import Requester
from homeserver.e2ee.sync_part import E2eeSync, E2eeSyncPart, Range
from homeserver.rooms.history import RoomHistory
from homeserver.rooms.service import RoomService
from homeserver.storage.sync import SyncSnapshot, SyncStore
from homeserver.sync.filters import Filters
from homeserver.sync.held_registrations import HeldRegistrations
from homeserver.sync.notifications import GatheredUnread, Notifications
from homeserver.sync.notifier import Notifier, Waiter
from homeserver.sync.out_of_room import out_of_room
from homeserver.sync.presence import PresenceService
from homeserver.sync.push_rules import default_ruleset
from homeserver.sync.room_entries import RoomEntries, SyncBatch, SyncRequest
from homeserver.sync.side_streams import global_account_data
from homeserver.sync.tokens import SyncToken
from homeserver.sync.typing import TypingNotifications
from homeserver.sync.woken import Seen, WokenAnswers, answers_from_events

# The longest a sync may wait. Each waiting sync holds a greenlet and a connection (no
# main-pool place: the HTTP layer gives it back while it waits); clients ask for 30 s and
# reconnect at once, so a longer wait saves nothing worth the risk of connections held past
# what proxies in between allow.
MAX_TIMEOUT_MS = 5 * 60 * 1000


class Parked:
    """A long-poll with nothing to send yet: /sync's and sliding sync's (sliding.py). It is
    registered with the notifier from before its first computation, so whatever is stored
    meanwhile wakes it, until `close`, on every way out. `answer` waits until something
    concerning its user happens or its timeout passes, computing again at each wake-up
    (`step`). The HTTP layer waits for it once the application has returned
    (api/client/sync.py), so a parked sync holds its registration, what it last saw and its
    socket, and nothing of the web framework's."""

    __slots__ = ("_deadline", "_waiter")

    def __init__(
        self,
        notifier: Notifier,
        user_id: str,
        deadline: float,
        presence: bool = True,
        waiter: Waiter | None = None,
    ):
        """`waiter`: a registration of the user's to go on with, rather than a new one."""
        self._deadline = deadline
        if waiter is None:
            waiter = notifier.registered(user_id, presence).__enter__()
        self._waiter: Waiter | None = waiter

    def answer(self, while_waiting=contextlib.nullcontext) -> dict | EncodedJson:
        """Waits, then the answer. `while_waiting()` is entered around each wait: the HTTP
        layer gives its work place back there, and watches for the client hanging up."""
        try:
            while True:
                waiter = self._waiter
                assert waiter is not None, "answered after close"
                with while_waiting():
                    woken = waiter.woken.wait(max(0.0, self._deadline - time.monotonic()))
                body = self.step(woken)
                if body is not None:
                    return body
        finally:
            self.close()

    def start(self, held: bool) -> dict | EncodedJson | Self:
        """The first step: itself, to be waited for, while there is nothing to send; else
        the answer, and it is closed. `held`: its registration was kept from the answer
        before (held_registrations.py): unwoken since, that answer's computation again
        would find nothing, so it waits with none; woken, it goes on from that wake."""
        if held and self._waiter is not None and not self._waiter.woken.is_set():
            return self
        try:
            body = self.step(woken=held)
        except BaseException:
            self.close()
            raise
        if body is None:
            return self
        self.close()
        return body

    def step(self, woken: bool) -> dict | EncodedJson | None:
        """One computation: the answer to send now, or None to wait again."""
        raise NotImplementedError

    def expired(self, notifier: Notifier) -> bool:
        """Whether it must answer now, with news or without."""
        return self._deadline <= time.monotonic() or notifier.closed

    def close(self) -> None:
        """Ends the registration; once is enough, and more are harmless."""
        if self._waiter is not None:
            self._waiter.__exit__(None, None, None)
            self._waiter = None


class WaitingSync(Parked):
    """A /sync with nothing to send yet."""

    __slots__ = ("_service", "_request", "_seen", "_held_as")

    def __init__(
        self,
        service: "SyncService",
        request: SyncRequest,
        deadline: float,
        held_as: "HeldSync | None" = None,
        held: tuple[Waiter, Seen] | None = None,
    ):
        """`held_as`: how its answer's registration is kept for the next request, if it
        may be (held_registrations.py); `held`: the registration and what was seen, kept
        for it."""
        super().__init__(service.notifier, request.user_id, deadline, waiter=held and held[0])
        self._service = service
        self._request = request
        # What a computation found nothing new in, if usable.
        self._seen: Seen | None = held and held[1]
        self._held_as = held_as

    def step(self, woken: bool) -> dict | EncodedJson | None:
        service, request, waiter, seen = self._service, self._request, self._waiter, self._seen
        assert waiter is not None, "computed after close"
        quick = woken and seen is not None and not waiter.recompute
        waiter.clear()
        found = None
        if quick and seen is not None:
            found = service.woken.answer(request.requester, request.filter, seen, now_ms())
        if woken:
            service.on_wake("database" if found is None else "recent_events")
        body: dict | EncodedJson | None
        if found is None:
            body, has_updates, self._seen = service._respond(request)
        else:
            body, self._seen = found
            has_updates = body is not None
            if has_updates and self._held_as is not None:
                # Answered from the events alone: what it saw holds for the next request.
                seen = self._seen
                next_batch = str(seen.token.with_events(seen.events))
                service.held.keep(self._held_as.key(next_batch), self._held_as, waiter, seen)
                self._waiter = None
        if has_updates or self.expired(service.notifier):
            return body if body is not None else service._respond(request)[0]
        return None


@dataclass(frozen=True, slots=True)
class HeldSync:
    """The /sync request a held registration waits for, beside its `since`
    (held_registrations.py)."""

    user_id: str
    device_id: str
    filter_param: str | None

    def key(self, since: str) -> tuple[str, str, str]:
        """Whose registration: a token is every member's whom one message woke."""
        return since, self.user_id, self.device_id


class SyncService:
    def __init__(
        self,
        rooms: RoomService,
        history: RoomHistory,
        store: SyncStore,
        notifier: Notifier,
        typing: TypingNotifications,
        filters: Filters,
        e2ee: E2eeSync | None = None,
        on_wake: Callable[[str], None] = lambda answered_from: None,
        presence: PresenceService | None = None,
        ruleset: Callable[[str], dict] = default_ruleset,
        notifications: Notifications | None = None,
    ):
        self.rooms = rooms
        self.history = history
        self.store = store
        self.notifier = notifier
        self.typing = typing
        self.filters = filters
        self.e2ee = e2ee
        self.presence = presence
        self.ruleset = ruleset  # the user's push rules (push_ruleset.py)
        self.notifications = notifications  # unread counts, when push actions are kept
        self.entries = RoomEntries(rooms, history)
        unread = GatheredUnread(notifications.store) if notifications else None
        self.woken = WokenAnswers(
            notifier.recent, e2ee, self.entries.lazy_members, unread, rooms.store.txn_ids_for
        )
        self.on_wake = on_wake  # "recent_events" or "database", for each woken sync
        self.held: HeldRegistrations[HeldSync, Seen] = HeldRegistrations(notifier)

    def sync(self, *args, **kwargs) -> dict:
        """`begin`'s /sync response, waited for here when there is nothing to send yet, as
        in-process callers want it, decoded (the HTTP layer waits outside Flask:
        api/client/sync.py)."""
        found = self.begin(*args, **kwargs)
        found = found.answer() if isinstance(found, WaitingSync) else found
        return json.loads(found.text) if isinstance(found, EncodedJson) else found

    def begin(
        self,
        requester: Requester,
        since: str | None,
        timeout_ms: int,
        full_state: bool,
        filter_param: str | None,
        use_state_after: bool = False,
    ) -> dict | EncodedJson | WaitingSync:
        """The /sync response, encoded already when a woken sync answers from the events
        that woke it (woken.py); or, when there is nothing to send yet and the client asked
        to wait, a WaitingSync, registered with the notifier, whose caller waits for it."""
        request = SyncRequest(
            requester,
            SyncToken.parse(since) if since else None,
            self.filters.resolve(requester.user_id, filter_param),
            full_state,
            use_state_after,
        )
        timeout = min(timeout_ms, MAX_TIMEOUT_MS) / 1000
        if request.since is None or full_state:
            # A first sync of a big room is hundreds of thousands of objects, garbage once
            # encoded: encoded here, with no full collection walking them meanwhile.
            with without_full_passes():
                return EncodedJson(encode_in_pieces(self._respond(request)[0], let_io_run))
        if timeout <= 0:
            return self._respond(request)[0]
        deadline = time.monotonic() + timeout
        held_as, held = None, None
        if answers_from_events(request.filter, full_state, use_state_after):
            held_as = HeldSync(requester.user_id, requester.device_id, filter_param)
            held = self.held.take(held_as.key(since or ""), held_as)
        # Held: the answer that gave `since` saw nothing but room events.
        return WaitingSync(self, request, deadline, held_as, held).start(held is not None)

    # --- one computation ----------------------------------------------------------------

    def _respond(self, request: SyncRequest) -> tuple[dict, bool, Seen | None]:
        """(the answer, whether it has anything new, what a woken sync may answer on from
        recent events when it has not: see woken.py)."""
        since = request.since
        incremental_from = since.events if since is not None and not request.full_state else None
        snapshot = self.store.snapshot(
            request.user_id, incremental_from, request.filter.room.keeps_room
        )
        batch = SyncBatch(snapshot.positions, now_ms(), snapshot)
        memberships, raced = self._memberships_at(request, snapshot)
        joined = [
            room_id for room_id, (membership, _) in memberships.items() if membership == "join"
        ]
        self.read_side_streams(request, batch, joined)

        rooms = self._rooms(request, batch, memberships, raced)
        account_data = global_account_data(
            request.filter.account_data,
            batch.account_data,
            lambda: self.ruleset(request.user_id),
            since is None,
        )
        e2ee = self._e2ee_part(request, batch)
        presence, presence_position = self._presence_part(request, batch)
        has_updates = bool(account_data or any(rooms.values()) or e2ee.has_updates or presence)
        next_batch = since
        if since is None or has_updates:
            positions = batch.positions
            next_batch = SyncToken(
                positions.events,
                positions.account_data,
                positions.receipts,
                batch.typing_position,
                self.typing.epoch,
                e2ee.to_device_position,
                positions.device_lists,
                presence_position,
            )
        body = {
            "next_batch": str(next_batch),
            "account_data": {"events": account_data},
            "rooms": rooms,
            **e2ee.fields(),
        }
        if presence:  # optional in the spec; left out when empty, as woken answers do
            body["presence"] = {"events": presence}
        seen = None
        if (
            not has_updates
            and since is not None
            and answers_from_events(request.filter, request.full_state, request.use_state_after)
        ):
            seen = Seen(
                since,
                batch.positions.events,
                *_joined_and_all(joined, snapshot.memberships),
                e2ee.key_counts,
            )
        return body, has_updates, seen

    def _rooms(
        self, request: SyncRequest, batch: SyncBatch, memberships: dict, raced: set[str]
    ) -> dict:
        """The response's `rooms`: each room the filter keeps, in the section of the user's
        membership at the position read (room_entries.py makes the entries)."""
        since, snapshot = request.since, batch.read_ahead
        rooms: dict = {"join": {}, "invite": {}, "knock": {}, "leave": {}}
        for room_id, (membership, changed_at) in memberships.items():
            changed = since is None or changed_at > since.events
            if membership == "join":
                has_events = (
                    snapshot.rooms_with_events is None
                    or room_id in raced
                    or room_id in snapshot.rooms_with_events
                )
                entry = self.entries.joined(request, batch, room_id, changed, has_events)
                section = "join"
            elif room_id in snapshot.out_of_room:
                shown = snapshot.out_of_room[room_id]
                section, entry = out_of_room(request.filter, since, membership, shown, changed_at)
            elif membership in ("invite", "knock"):
                entry = self.entries.stripped(request, room_id, membership) if changed else None
                section = membership
            else:  # leave or ban
                entry = self.entries.left(request, batch, room_id, changed_at) if changed else None
                section = "leave"
            if entry is not None:
                rooms[section][room_id] = entry
        if self.notifications is not None:
            by_thread = request.filter.room.timeline.unread_thread_notifications
            self.notifications.add_unread_counts(request.user_id, rooms["join"], by_thread)
        return rooms

    def _e2ee_part(self, request: SyncRequest, batch: SyncBatch) -> E2eeSyncPart:
        """To-device messages and device lists (e2ee/sync_part.py)."""
        if self.e2ee is None:
            return E2eeSyncPart()
        since, positions = request.since, batch.positions
        span = Range(
            since.events if since else None,
            positions.events,
            since.device_lists if since else 0,
            positions.device_lists,
            since.to_device if since else 0,
            positions.to_device,
        )
        return self.e2ee.part(request.requester, span, batch.read_ahead.member_moves)

    def _presence_part(self, request: SyncRequest, batch: SyncBatch) -> tuple[list, int]:
        """The m.presence events the filter keeps, and the presence position they reach."""
        after = request.since.presence if request.since and not request.full_state else 0
        if self.presence is None:
            return [], after
        events, reached = self.presence.sync_events(
            request.user_id, after, batch.positions.presence
        )
        kept = request.filter.presence
        events = [
            e for e in events if kept.keeps_type(e["type"]) and kept.keeps_sender(e["sender"])
        ]
        return (events[: kept.limit] if kept.limit else events), reached

    def _memberships_at(
        self, request: SyncRequest, snapshot: SyncSnapshot
    ) -> tuple[dict, set[str]]:
        """{room_id: (membership, where it was set)} as of the snapshot's event position,
        for the rooms the filter keeps; and the rooms whose membership changed after that
        position was read (their other reads are not in the snapshot)."""
        out, raced = {}, set()
        position = snapshot.positions.events
        for room_id, membership, changed_at in snapshot.memberships:
            if not request.filter.room.keeps_room(room_id):
                continue
            if changed_at > position:
                view = self.history.history_view(room_id, request.user_id)
                membership_then = view.membership_after(position)
                changed_then = view.last_membership_change(position)
                if membership_then is None or changed_then is None:
                    continue
                membership, changed_at = membership_then, changed_then
                raced.add(room_id)
            out[room_id] = (membership, changed_at)
        return out, raced

    def read_side_streams(
        self, request: SyncRequest, batch: SyncBatch, joined: list[str], account_data=True
    ) -> None:
        """Account data (unless not `account_data`), receipts and typing changed since the
        token, by room."""
        since = request.since
        positions = batch.positions
        after = since.account_data if since else 0
        if account_data and positions.account_data > after:
            for item in self.store.account_data_changes(
                request.user_id, after, positions.account_data
            ):
                batch.account_data[item.room_id].append(item)
        after = since.receipts if since else 0
        if positions.receipts > after and joined:
            for receipt in self.store.receipt_changes(joined, after, positions.receipts):
                if receipt.receipt_type == "m.read.private" and receipt.user_id != request.user_id:
                    continue
                batch.receipts[receipt.room_id].append(receipt)
        # No yield between these lines: the position covers exactly these changes. A token
        # from another instance may be further on than this one has applied yet.
        typing_since = since.typing_since(self.typing.epoch) if since else 0
        batch.typing = self.typing.changes(joined, typing_since)
        batch.typing_position = max(self.typing.position, typing_since)


def _joined_and_all(joined: list[str], memberships: list) -> tuple[frozenset, frozenset]:
    """The joined rooms, and every room with a membership: one set when they are the same,
    as they are for most users (a parked sync keeps them)."""
    kept, every = frozenset(joined), frozenset(room_id for room_id, _, _ in memberships)
    return kept, (kept if kept == every else every)
