"""Simplified sliding sync (MSC4186): `POST /_matrix/client/unstable/
org.matrix.simplified_msc3575/sync`, the sync Element X and the SDKs' `SlidingSync` use.

A request names lists (the user's rooms, most recent first, filtered, and the ranges wanted
of them) and room subscriptions; the response carries, for each room those match, what
changed since the connection last sent it (sliding_rooms.py), each list's count, and the
extensions asked for (sliding_extensions.py). What each connection was sent lives in
sliding_connections.py; the lists in sliding_lists.py.

It shares /sync's machinery rather than copying it: the snapshot of the user's rooms and
streams (storage/sync.py), timelines and event formatting (room_entries.py), the side
streams and end-to-end encryption parts, and the long-poll: a request with a `pos` and a
`timeout` that finds nothing new parks on the notifier like a /sync (service.py `Parked`),
off the main pool, and computes again when something concerning the user is stored.

What it costs is what changed: a connection keeps its room list in memory and brings it up
to date from the events stored since (sliding_lists.py), a room already sent whose new
events are all in hand is answered from them (sliding_rooms.py `live_result`), and a
long-poll woken by room events alone reads no stream positions (as woken.py's /sync). Its
answer keeps the registration it was woken on for the connection's next request, which then
parks with no computation (held_registrations.py), and a room's live result is encoded once
for every connection its events wake (sliding_rooms.py `live_text`).
"""

from __future__ import annotations

import time
from json.encoder import encode_basestring
from typing import Callable

from homeserver.core.clock import now_ms
from homeserver.core.json_text import EncodedJson, encode
from homeserver.core.requester import Requester
from homeserver.storage.rooms import StoredEvent
from homeserver.storage.sync import StreamPositions, SyncSnapshot
from homeserver.sync.filters import NO_FILTER
from homeserver.sync.held_registrations import HeldRegistrations
from homeserver.sync.notifier import Waiter
from homeserver.sync.room_entries import SyncBatch, SyncRequest
from homeserver.sync.service import MAX_TIMEOUT_MS, Parked, SyncService
from homeserver.sync.sliding_connections import Connections, ConnectionState, Pos, resolved
from homeserver.sync.sliding_extensions import ExtensionsPart, SlidingExtensions
from homeserver.sync.sliding_lists import Listing, ListsResult, Matched, RoomLists
from homeserver.sync.sliding_request import Extensions, ParsedRequests, SlidingRequest
from homeserver.sync.sliding_rooms import SlidingRooms, is_live, live_text
from homeserver.sync.tokens import SyncToken


class _Call:
    """One request: its connection as the pos left it, and what it asks."""

    __slots__ = ("requester", "request", "pos", "before", "answered", "next_request")

    def __init__(
        self,
        requester: Requester,
        request: SlidingRequest,
        pos: Pos | None,
        before: ConnectionState,
    ):
        self.requester = requester
        self.request = request
        self.pos = pos
        self.before = before
        self.answered: str | None = None  # the pos of its answer, unless superseded
        # The request its client sends next once it has that answer, unless one may find
        # news at once: a to-device `since` that leaves messages still to send.
        self.next_request: SlidingRequest | None = None


class WaitingSlidingSync(Parked):
    """A sliding sync with nothing to send yet."""

    __slots__ = ("_service", "_call")

    def __init__(
        self, service: "SlidingSync", call: _Call, deadline: float, waiter: Waiter | None = None
    ):
        # It carries no presence: a change of it is no reason to compute again.
        notifier = service.sync.notifier
        super().__init__(notifier, call.requester.user_id, deadline, False, waiter)
        self._service = service
        self._call = call

    def step(self, woken: bool) -> dict | EncodedJson | None:
        waiter = self._waiter
        assert waiter is not None, "computed after close"
        events_only = woken and not waiter.recompute
        # A burst's hold on the collector (notifier.py) lasts until this computation is
        # done, not only begun: it waits on the database for its counts and its save.
        burst, waiter.burst = waiter.burst, None
        waiter.clear()
        try:
            notifier = self._service.sync.notifier
            body = self._service.compute(self._call, self.expired(notifier), events_only)
        finally:
            if burst is not None:
                burst.done()
        answered, next_request = self._call.answered, self._call.next_request
        if body is not None and answered is not None and next_request is not None:
            # Registered from before this computation: kept for the request with its pos.
            self._service.held.keep(answered, next_request, waiter, None)
            self._waiter = None
        return body


class SlidingSync:
    def __init__(
        self,
        sync: SyncService,
        connections: Connections,
        lists: RoomLists,
        on_list: Callable[[str], None] = lambda made_from: None,
    ):
        self.sync = sync
        self.on_list = on_list  # "kept" or "whole", for each room list made
        self.connections = connections
        self.lists = lists
        self.rooms = SlidingRooms(
            sync.rooms, sync.history, sync.entries, lists.store, sync.notifier.recent
        )
        self.extensions = SlidingExtensions(sync)
        self.requests = ParsedRequests()
        # A connection woken by a message pays for one computation, not a second one to
        # park again (held_registrations.py). With `to_device`, its next request is the one
        # whose `since` is the answer's `next_batch`: what that acknowledges is forgotten at
        # its next computation, and a message sent meanwhile wakes it; unless messages were
        # left past `next_batch`, which the next request answers at once (`_next_request`).
        # One-time key counts may change unannounced (a claim), but a parked connection
        # computing then would not answer for them either: they are no update
        # (sliding_extensions.py). A room forgotten meanwhile moves no stream and wakes no
        # one: the next computation sees it, as a parked connection's does.
        self.held: HeldRegistrations[SlidingRequest, None] = HeldRegistrations(sync.notifier)

    def begin(
        self, requester: Requester, request: SlidingRequest, pos: str | None, timeout_ms: int
    ) -> dict | EncodedJson | WaitingSlidingSync:
        """The response; or, when a request with a pos finds nothing new and may wait, a
        WaitingSlidingSync registered with the notifier, whose caller waits for it."""
        now = now_ms()
        if pos is None:
            before = self.connections.start(requester, request.conn_id, now)
            call = _Call(requester, request, None, before)
            body = self.compute(call, True)
            assert body is not None
            return body
        parsed = Pos.parse(pos)
        before = self.connections.resume(requester, request.conn_id, parsed, now)
        call = _Call(requester, request, parsed, before)
        timeout = min(timeout_ms, MAX_TIMEOUT_MS) / 1000
        if timeout <= 0:
            body = self.compute(call, True)
            assert body is not None
            return body
        # Held: this request is the one the answer that gave this pos was for.
        held = self.held.take(pos, request)
        waiting = WaitingSlidingSync(self, call, time.monotonic() + timeout, held and held[0])
        return waiting.start(held is not None)

    def compute(
        self, call: _Call, must_answer: bool, events_only: bool = False
    ) -> dict | EncodedJson | None:
        """The response, or None when it would carry nothing new and need not be sent.
        `events_only`: woken by room events alone (notifier.py), nothing else of the user's
        has changed since its last computation."""
        requester, request = call.requester, call.request
        user_id = requester.user_id
        since = call.pos.token if call.pos is not None else None
        state = call.before.copy()
        state.rooms = resolved(state.rooms, since.events if since else 0)
        for room_id in request.unsubscribe:
            state.subscriptions.pop(room_id, None)
        state.subscriptions.update(request.subscriptions)

        found = ListsResult({}, {}, {})
        kept, live = None, None
        if request.lists or state.subscriptions:  # not an extensions-only connection
            kept = state.listing
            snapshot, state.listing, live = self._listing(
                user_id, state, since, request.extensions, events_only
            )
            found = self.lists.match(user_id, state.listing, request.lists)
        else:
            snapshot = self.sync.store.snapshot(
                user_id, since.events if since else None, lambda room_id: True
            )
        _add_subscriptions(found, state)
        rooms = self._rooms(
            requester, snapshot, found, state, since, (kept, live) if kept and live else None
        )
        batch = SyncBatch(snapshot.positions, now_ms(), snapshot)
        window = [r for r in found.matched if found.rooms[r].membership == "join"]
        extensions = self.extensions.part(
            SyncRequest(requester, since, NO_FILTER), request.extensions, batch, window
        )
        if not (must_answer or call.pos is None or rooms or extensions.has_updates):
            call.before.listing = state.listing  # what the next computation goes on from
            return None
        token = self._token(batch, extensions.to_device_position)
        generation = self.connections.commit(call.before, state, token.events, now_ms())
        superseded = generation is None  # its client has moved on (sliding_connections.py)
        if generation is None:
            generation, token = call.before.generation, since or token
        pos = str(Pos(state.connection_id, generation, token))
        call.answered = None if superseded else pos
        call.next_request = _next_request(request, extensions)
        return _body(pos, found.counts, rooms, extensions.body)

    def _token(self, batch: SyncBatch, to_device_position: int) -> SyncToken:
        positions = batch.positions
        return SyncToken(
            positions.events,
            positions.account_data,
            positions.receipts,
            batch.typing_position,
            self.sync.typing.epoch,
            to_device_position,
            positions.device_lists,
        )

    def _listing(
        self,
        user_id: str,
        state: ConnectionState,
        since: SyncToken | None,
        asked: Extensions,
        events_only: bool,
    ) -> tuple[SyncSnapshot, Listing, dict[str, list[StoredEvent]] | None]:
        """The snapshot to read up to and the user's rooms there: the connection's kept list
        brought up to date when the events since allow (sliding_lists.py), else read whole;
        and, when brought up to date, each room's new events."""
        kept = state.listing
        recent = self.sync.notifier.recent
        if kept is not None and since is not None and recent.newest >= kept.position:
            e2ee = asked.e2ee or asked.to_device
            if events_only and not e2ee:
                # Only room events since the last computation: the other streams are where
                # the pos left them (as woken.py answers /sync), no room was forgotten.
                positions, forgets = _moved_on(since, recent.newest), kept.forgets
            else:
                positions, forgets = self.lists.store.positions_and_forgets(user_id)
            run = recent.after(kept.position) if recent.newest >= positions.events else None
            # Device lists follow member moves since the pos (snapshot.member_moves): none
            # only when the run has no member event and starts at the pos.
            if run is not None and e2ee:
                moves = any(s.event.type == "m.room.member" for s in run)
                run = None if moves or since.events != kept.position else run
            if run is not None:
                listing = self.lists.advance(
                    user_id, kept, run, positions.events, forgets, set(state.rooms)
                )
                if listing is not None:
                    self.on_list("kept")
                    snapshot = SyncSnapshot(positions, [], None, {}, [], {})
                    return snapshot, listing, _by_room(run, positions.events)
        self.on_list("whole")
        forgets = self.lists.store.forgets(user_id)
        snapshot = self.sync.store.snapshot(
            user_id, since.events if since else None, lambda room_id: True
        )
        return snapshot, self.lists.rooms(user_id, snapshot, set(state.rooms), forgets), None

    def _rooms(
        self,
        requester: Requester,
        snapshot: SyncSnapshot,
        found,
        state: ConnectionState,
        since: SyncToken | None,
        live: tuple[Listing, dict[str, list[StoredEvent]]] | None,
    ) -> dict:
        """Each matched room's result, most recent first; `state.rooms` follows what is
        sent. `live`: the kept list brought up to date, and each room's new events: a room
        whose result they make needs no reads (sliding_rooms.py `live_result`)."""
        now, up_to = now_ms(), snapshot.positions.events
        rooms = {}
        for room_id, matched in found.matched.items():
            room, sent = found.rooms[room_id], state.rooms.get(room_id)
            made = None
            if live is not None and sent is not None and room_id in live[1]:
                made = self.rooms.live_result(
                    requester.user_id,
                    room,
                    live[0].by_id[room_id].activity,
                    matched.config,
                    sent,
                    live[1][room_id],
                    since.events if since else 0,
                    up_to,
                    now,
                )
            result, sent = made or self.rooms.result(
                requester, room, matched.config, sent, since.events if since else None, up_to, now
            )
            state.rooms[room_id] = sent
            if result is not None:
                if matched.lists:
                    result["lists"] = matched.lists
                rooms[room_id] = result
        self._add_counts(requester.user_id, rooms, live is not None)
        return rooms

    def _add_counts(self, user_id: str, rooms: dict, woken_together: bool) -> None:
        """The unread counts of the joined rooms sent, one read for all (notifications.py);
        `woken_together`: a kept list brought up to date, as the connections one message
        wakes do, whose counts are read together (GatheredUnread)."""
        notifications = self.sync.notifications
        joined = [r for r, result in rooms.items() if result.get("membership") == "join"]
        if notifications is None or not joined:
            return
        gathered = self.sync.woken.unread  # GatheredUnread, shared with woken /syncs
        read = gathered if woken_together and gathered else notifications.unread_fields
        for room_id, fields in read(user_id, joined, False).items():
            rooms[room_id].update(fields["unread_notifications"])


def _next_request(request: SlidingRequest, extensions: ExtensionsPart) -> SlidingRequest | None:
    """The request a client sends after this answer (held_registrations.py): the same, its
    to-device `since` moved to the answer's `next_batch`; None while to-device messages wait past it
    (the next request has them at once)."""
    if not request.extensions.to_device:
        return request
    if not extensions.to_device_whole:
        return None
    return request.with_to_device_since(extensions.to_device_position)


def _body(pos: str, counts: dict, rooms: dict, extensions: dict) -> dict | EncodedJson:
    """The response; encoded here when its rooms are all live results (sliding_rooms.py
    `live_result`), whose starts are encoded once for every connection woken with them."""
    if rooms and all(is_live(result) for result in rooms.values()):
        now = now_ms()
        listed = ",".join(f'{encode_basestring(k)}:{{"count":{n}}}' for k, n in counts.items())
        texts = ",".join(f"{encode_basestring(r)}:{live_text(x, now)}" for r, x in rooms.items())
        text = f'{{"pos":{encode_basestring(pos)},"lists":{{{listed}}},"rooms":{{{texts}}}'
        return EncodedJson(f'{text},"extensions":{encode(extensions) if extensions else "{}"}}}')
    if any(is_live(result) for result in rooms.values()):
        now = now_ms()
        for result in rooms.values():
            if is_live(result):
                result["timeline"] = result["timeline"].decoded(now)
    lists = {name: {"count": count} for name, count in counts.items()}
    return {"pos": pos, "lists": lists, "rooms": rooms, "extensions": extensions}


def _add_subscriptions(found: ListsResult, state: ConnectionState) -> None:
    """The connection's room subscriptions among the rooms the response may carry."""
    for room_id, config in state.subscriptions.items():
        if room_id not in found.rooms:
            continue  # not the user's to see (the MSC: ignored)
        matched = found.matched.get(room_id)
        if matched is None:
            found.matched[room_id] = Matched(config)
        else:
            matched.config = matched.config.merged(config)


def _moved_on(since: SyncToken, events: int) -> StreamPositions:
    """The pos' positions, moved on in the events stream."""
    return StreamPositions(
        events,
        since.account_data,
        since.receipts,
        since.to_device,
        since.device_lists,
        since.presence,
    )


def _by_room(run: list[StoredEvent], up_to: int) -> dict[str, list[StoredEvent]]:
    """The run's events up to `up_to` shown to clients, by room."""
    found: dict[str, list[StoredEvent]] = {}
    for stored in run:
        if stored.stream_ordering > up_to:
            break
        if not stored.soft_failed:
            found.setdefault(stored.event.room_id, []).append(stored)
    return found
