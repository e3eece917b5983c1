"""Rooms: sending events, state, membership, history and what a user may read.

Every event of ours goes the same way: under the room's lock, read the room's extremities and
the state the auth rules need, build and sign the event, check it with the auth rules, then
persist it in one transaction (`_persist`, with the write hooks' writes: push actions), then
tell the listeners (the notifier /sync uses). The lock keeps two sends to one room from taking
the same prev_events and depth; the transaction re-checks the extremities (other processes).

Events received over federation are authorised by `received.py` and stored through the same
persist point; the filters, tokens and pages that reads use are `pagination.py`'s.
"""

from __future__ import annotations

import logging
import random
from typing import Callable, Iterable

import gevent
from signedjson.key import get_verify_key
from signedjson.sign import SignatureVerifyException, verify_signed_json

from homeserver.core.clock import now_ms
from homeserver.core.concurrency import KeyedLocks
from homeserver.core.errors import Codes, MatrixError, bad_json, forbidden, invalid_param, not_found
from homeserver.core.events import Event
from homeserver.core.identifiers import (
    is_valid_room_id,
    is_valid_user_id,
    new_room_id,
    server_of,
)
from homeserver.core.requester import Requester
from homeserver.rooms.auth import (
    CREATE,
    AuthError,
    auth_event_ids_to_check,
    auth_types_for_event,
    check_auth_events,
    select_auth_events,
)
from homeserver.rooms.events import MAX_PREV_EVENTS, InvalidEvent, build_event, redact
from homeserver.rooms.planned import PlannedEvent
from homeserver.rooms.received import ReceivedEventRefused, authorise_received_event
from homeserver.rooms.redactions import REDACTION, RedactionWrites, as_redacted, local_redaction
from homeserver.rooms.resolution import RoomResolver
from homeserver.rooms.restricted_joins import authorise_restricted_join
from homeserver.rooms.versions import KNOWN_ROOM_VERSIONS, RoomVersion
from homeserver.storage.profiles import ProfileStore
from homeserver.storage.rooms import (
    NewRoom,
    ResolvedPersist,
    RoomStore,
    StaleExtremities,
    StoredEvent,
    TxnKey,
)

log = logging.getLogger(__name__)

# A room whose extremities keep moving under us (another process writing) is retried this
# many times before the request gives up; with other instances writing to it, more times,
# after a random pause of up to 5 ms per attempt so that no writer keeps losing the race.
_PERSIST_ATTEMPTS = 3
_SHARED_PERSIST_ATTEMPTS = 20
_SHARED_PAUSE_SECONDS = 0.005

MEMBERSHIPS = ("join", "invite", "knock", "leave", "ban")

PersistListener = Callable[[list[StoredEvent]], None]
# outbox_listener(destinations): events were queued for these servers (the sender's wake-up).
OutboxListener = Callable[[set[str]], None]
WriteHook = Callable[[list[Event]], "tuple[Callable, PersistListener] | None"]
# validate(room_id, new_content, old_content or None), raising a MatrixError.
StateValidator = Callable[[str, dict, "dict | None"], None]


class RoomService:
    def __init__(
        self,
        store: RoomStore,
        accounts,
        server_name: str,
        signing_key,
        profiles: ProfileStore | None = None,
    ):
        self.store = store
        self.accounts = accounts
        # Local users' displayname and avatar_url, copied into their member events.
        self.profiles = profiles
        self.server_name = server_name
        self.signing_key = signing_key
        self._verify_key = get_verify_key(signing_key)
        self._locks = KeyedLocks()
        self._listeners: list[PersistListener] = []
        self._outbox_listeners: list[OutboxListener] = []
        self._write_hooks: list[WriteHook] = []
        self._state_validators: dict[str, StateValidator] = {}

    # --- hooks --------------------------------------------------------------------------

    def add_persist_listener(self, listener: PersistListener) -> None:
        """`listener(events)` runs after every successful persist, in stream order. It is a
        wake-up, not the record: a request killed while its write commits skips it, so
        readers catch up from stream positions, never from what listeners were told."""
        self._listeners.append(listener)

    def add_outbox_listener(self, listener: OutboxListener) -> None:
        """`listener(destinations)` runs after a persist that queued events for other servers
        (the federation sender's wake-up). Like persist listeners it is not the record: the
        queue is in the database, and the sender reads it on start."""
        self._outbox_listeners.append(listener)

    def add_write_hook(self, hook: WriteHook) -> None:
        """Before each persist, `hook(events)`: None, or (a write for the events' transaction,
        a persist listener)."""
        self._write_hooks.append(hook)

    def add_state_validator(self, event_type: str, validator: StateValidator) -> None:
        """Checks the content of client-sent state events of one type before they are built."""
        self._state_validators[event_type] = validator

    # --- rooms --------------------------------------------------------------------------

    def room_version(self, room_id: str) -> RoomVersion:
        room = self.store.get_room(room_id) if is_valid_room_id(room_id) else None
        if room is None:
            raise not_found("Unknown room")
        return KNOWN_ROOM_VERSIONS[room.room_version]

    def room_exists(self, room_id: str) -> bool:
        return is_valid_room_id(room_id) and self.store.get_room(room_id) is not None

    def membership(self, room_id: str, user_id: str) -> str | None:
        state = self.store.current_state(room_id, [("m.room.member", user_id)])
        event = state.get(("m.room.member", user_id))
        return event.event.membership if event else None

    def can_peek(self, user_id: str, room_id: str) -> bool:
        """Joined now, or the room's history is world_readable now."""
        keys = [("m.room.member", user_id), ("m.room.history_visibility", "")]
        state = self.store.current_state(room_id, keys)
        member = state.get(("m.room.member", user_id))
        if member is not None and member.event.membership == "join":
            return True
        visibility = state.get(("m.room.history_visibility", ""))
        return (
            visibility is not None
            and visibility.event.content.get("history_visibility") == "world_readable"
        )

    def joined_rooms(self, user_id: str) -> list[str]:
        return self.store.rooms_for_user(user_id, "join")

    def joined_servers(self, room_id: str) -> list[str]:
        """The servers with joined members, ours first: where an alias's room can be joined."""
        servers = {server_of(u) for u in self.store.joined_users(room_id)}
        servers.discard(self.server_name)
        return [self.server_name, *sorted(servers)]

    # --- building, authorising and persisting -------------------------------------------

    def _build(
        self,
        version: RoomVersion,
        planned: PlannedEvent,
        room_id: str | None,
        prev_events: list[Event],
        state: dict,
        ts: int,
    ) -> Event:
        """Builds, signs and auth-checks one event. Raises AuthError for the caller to map.
        `room_id` is None for the create event of a room it names (v12)."""
        auth_events = select_auth_events(
            version, planned.event_type, planned.sender, planned.state_key, planned.content, state
        )
        try:
            event = build_event(
                version,
                room_id=room_id,
                sender=planned.sender,
                event_type=planned.event_type,
                content=planned.content,
                state_key=planned.state_key,
                prev_events=prev_events,
                auth_events=auth_events,
                origin_server_ts=ts,
                server_name=self.server_name,
                signing_key=self.signing_key,
                redacts=planned.redacts,
            )
        except InvalidEvent as e:
            if e.too_large:
                raise MatrixError(413, Codes.TOO_LARGE, str(e)) from None
            raise bad_json(str(e)) from None
        # v12 lists no create event, but the rules still check against it.
        checked = {e.event_id: e for e in [*auth_events, *state.values()]}
        check_auth_events(
            version,
            event,
            [checked[i] for i in auth_event_ids_to_check(version, event) if i in checked],
            lambda ev, server: self._signed_by_us(version, ev, server),
        )
        return event

    def _signed_by_us(self, version: RoomVersion, event: Event, server: str) -> bool:
        """Signature check for restricted joins; other servers' keys come with the keyring."""
        if server != self.server_name:
            return False
        try:
            verify_signed_json(redact(version, event.pdu), server, self._verify_key)
            return True
        except SignatureVerifyException:
            return False

    def _persist(
        self, events: list[Event], send_to: Iterable[str] = (), **kwargs
    ) -> list[StoredEvent]:
        """The single point where events are stored; listeners hear of them after. They are
        queued for every server in `send_to` (not us) in the same transaction."""
        destinations = set(send_to) - {self.server_name}
        ts = now_ms()
        redacted: dict = {}
        hooked = [h for h in (hook(events) for hook in self._write_hooks) if h is not None]
        redactions = RedactionWrites(events, ts, redacted)
        writes = [*kwargs.pop("extra_writes", ()), redactions.apply]
        writes += [write for write, _ in hooked]
        kwargs.update(extra_writes=writes, first_writes=[redactions.record])
        stored = self.store.persist_events(events, now_ms=ts, send_to=destinations, **kwargs)
        stored = as_redacted(stored, redacted)  # listeners hear them as stored
        for listener in [*self._listeners, *(after for _, after in hooked)]:
            try:
                listener(stored)
            except Exception:
                log.exception("persist listener failed")
        if destinations:
            for wake in self._outbox_listeners:
                try:
                    wake(destinations)
                except Exception:
                    log.exception("outbox listener failed")
        return stored

    def destinations_for(self, event: Event) -> set[str]:
        """The servers an event of ours goes to: those with joined members before it, and the
        target's server when it joins; a leave or kick reaches the server it removes."""
        servers = {server_of(u) for u in self.store.joined_users(event.room_id)}
        if event.type == "m.room.member" and event.membership == "join" and event.state_key:
            servers.add(server_of(event.state_key))
        servers.discard(self.server_name)
        return servers

    def _append(
        self,
        room_id: str,
        planned: PlannedEvent,
        txn: TxnKey | None = None,
        skip_if_unchanged: bool = False,
    ) -> str:
        """Adds one event to an existing room; returns its event ID."""
        version = self.room_version(room_id)
        with self._locks.hold(room_id):
            if txn is not None:
                existing = self.store.event_for_txn(txn)
                if existing is not None:
                    return existing
            shared = self.store.db.shared
            for attempt in range(_SHARED_PERSIST_ATTEMPTS if shared else _PERSIST_ATTEMPTS):
                try:
                    return self._append_once(version, room_id, planned, txn, skip_if_unchanged)
                except StaleExtremities:
                    if shared:
                        gevent.sleep(random.uniform(0, _SHARED_PAUSE_SECONDS * (attempt + 1)))
        raise MatrixError(503, Codes.UNKNOWN, "The room is busy; try again")

    def _append_once(
        self,
        version: RoomVersion,
        room_id: str,
        planned: PlannedEvent,
        txn: TxnKey | None,
        skip_if_unchanged: bool,
    ) -> str:
        """One attempt of `_append`, under the room's lock. Raises StaleExtremities if another
        process wrote to the room since its state was read."""
        keys = auth_types_for_event(
            version, planned.event_type, planned.sender, planned.state_key, planned.content
        )
        if planned.state_key is not None:
            keys.append((planned.event_type, planned.state_key))
        state = {k: s.event for k, s in self.store.current_state(room_id, keys).items()}
        if skip_if_unchanged and planned.state_key is not None:
            current = state.get((planned.event_type, planned.state_key))
            if (
                current is not None
                and current.sender == planned.sender
                and current.content == planned.content
            ):
                return current.event_id  # nothing would change: no new event
        # Events received over federation may fork the room: the newest
        # extremities, as many as an event may name.
        prev_events = self.store.forward_extremities(room_id)[-MAX_PREV_EVENTS:]
        try:
            event = self._build(version, planned, room_id, prev_events, state, now_ms())
        except AuthError as e:
            raise forbidden(str(e)) from None
        try:
            send_to = self.destinations_for(event)
            return self._persist([event], txn=txn, send_to=send_to)[0].event.event_id
        except StaleExtremities:
            raise  # `_append` reads the room again
        except Exception as e:
            if txn is not None and self.store.db.is_unique_violation(e):
                # The same transaction, sent at once through another process.
                existing = self.store.event_for_txn(txn)
                if existing is not None:
                    return existing
            raise

    def create_room(
        self,
        version: RoomVersion,
        creator: str,
        planned: list[PlannedEvent],
        extra_writes: Callable[[str], Iterable[Callable]] = lambda room_id: (),
        chosen_id: str | None = None,
    ) -> str:
        """Builds every initial event of a new room and stores them all, with the writes
        `extra_writes(room_id)` gives, in one transaction: a room is created whole or not at
        all. Returns the room ID: in v12 the create event's, before it `chosen_id` if given."""
        ts = now_ms()
        for attempt in range(_PERSIST_ATTEMPTS):
            # Two v12 rooms with the same creator, content and timestamp hash to one room ID;
            # an earlier timestamp makes another (as Synapse does).
            room_id, events = self._initial_events(version, planned, ts - attempt, chosen_id)
            try:
                self._persist(
                    events,
                    new_room=NewRoom(room_id, version.identifier, creator, ts - attempt),
                    extra_writes=extra_writes(room_id),
                )
                return room_id
            except Exception as e:
                if not self.store.db.is_unique_violation(e) or self.store.get_room(room_id) is None:
                    raise
        raise MatrixError(503, Codes.UNKNOWN, "Could not pick a new room ID; try again")

    def _initial_events(
        self, version: RoomVersion, planned: list[PlannedEvent], ts: int, chosen_id: str | None
    ) -> tuple[str, list[Event]]:
        fresh = chosen_id or new_room_id(self.server_name)
        room_id = None if version.room_id_is_create_event_id else fresh
        state: dict = {}
        events: list[Event] = []
        for item in planned:
            try:
                event = self._build(version, item, room_id, events[-1:], state, ts)
            except AuthError as e:
                raise MatrixError(
                    400, Codes.INVALID_ROOM_STATE, f"{item.event_type} would not be allowed: {e}"
                ) from None
            room_id = event.room_id
            events.append(event)
            if event.is_state:
                state[(event.type, event.state_key)] = event
        assert room_id is not None
        return room_id, events

    # --- membership through other servers (rooms/remote_membership.py) ---------------------

    def store_remote_join(self, joined) -> None:  # a rooms.join_checks.JoinedRoom
        """Stores a room joined through another server: the checked state and auth chain
        (those not stored already) as outliers, valid state but no part of the timeline, and
        our join, all in one transaction, creating the room if it is new here. Our join gets
        the answer's state as the state before it, and the room's current state becomes that
        plus our join, so later resolutions start from it; history before it is backfilled
        from its prev_events. Our join, which send_join delivered, is not queued for sending."""
        join = joined.join
        room_id = join.room_id
        with self._locks.hold(room_id):
            known = self.store.events_in_room(room_id, [e.event_id for e in [*joined.events, join]])
            if join.event_id in known:
                return
            new = [e for e in joined.events if e.event_id not in known]
            room = self.store.get_room(room_id)
            version = joined.version.identifier
            current = {**joined.state_before, (join.type, join.state_key or ""): join.event_id}
            resolved = ResolvedPersist(
                {join.event_id: joined.state_before}, current=current, outliers=new[::-1]
            )
            self._persist(
                [join],
                new_room=None if room else NewRoom(room_id, version, joined.creator, now_ms()),
                received=True,
                extra_writes=[self.store.only_extremity(room_id, join.event_id)],
                resolved=resolved,
            )

    def prepare_event(self, room_id: str, planned: PlannedEvent) -> tuple[RoomVersion, Event]:
        """Builds, signs and authorises an event as `_append` would, without storing it: for
        one another server must countersign first (an invite of its user)."""
        version = self.room_version(room_id)
        keys = auth_types_for_event(
            version, planned.event_type, planned.sender, planned.state_key, planned.content
        )
        state = {k: s.event for k, s in self.store.current_state(room_id, keys).items()}
        prev_events = self.store.forward_extremities(room_id)[-MAX_PREV_EVENTS:]
        try:
            return version, self._build(version, planned, room_id, prev_events, state, now_ms())
        except AuthError as e:
            raise forbidden(str(e)) from None

    def append_built_first(self, room_id: str, planned: PlannedEvent, first: Callable) -> str:
        """`_append` with `first(event)` run between the build and the store, under the room's
        lock, so nothing of ours comes between (an upgrade's new room names its tombstone)."""
        with self._locks.hold(room_id):
            event = self.prepare_event(room_id, planned)[1]
            first(event)
            return self._persist([event], send_to=self.destinations_for(event))[0].event.event_id

    def store_prepared(self, event: Event, delivered_to: str) -> None:
        """Stores an event from `prepare_event` once countersigned, queued for the room's
        servers but `delivered_to`, which has it. The room may have moved on meanwhile (the
        other server took its time), so it joins the graph as a received event does, beside
        the newer extremities."""
        with self._locks.hold(event.room_id):
            if self.store.events_in_room(event.room_id, [event.event_id]):
                return
            send_to = self.destinations_for(event) - {delivered_to}
            self._persist([event], received=True, send_to=send_to)

    def store_remote_leave(self, event: Event) -> None:
        """Our leave of a room we were only invited to, already given to the room through
        send_leave: stored (the invite ends here too), not queued."""
        with self._locks.hold(event.room_id):
            if not self.store.events_in_room(event.room_id, [event.event_id]):
                self._persist([event], received=True)

    # --- events received over federation -------------------------------------------------

    def is_joined_here(self, room_id: str) -> bool:
        """Is one of our users joined to the room? Only then are its events taken in."""
        return any(server_of(u) == self.server_name for u in self.store.joined_users(room_id))

    def receive_event(
        self,
        version: RoomVersion,
        event: Event,
        signed_by: frozenset[str],
        send_to: Iterable[str] = (),
    ) -> bool:
        """Authorises a PDU received over federation and stores it, through the same persist
        point as our own events (so listeners, and /sync, see it). The caller has checked
        its format, signatures and hashes (spec "Checks performed on receipt of a PDU",
        steps 1 to 3); `signed_by` are the servers whose signatures it verified.

        Steps 4 to 6 are `authorise_received_event`'s: a rejected event raises
        `ReceivedEventRefused` and is remembered, a soft-failed one is stored hidden.
        Returns False if it was already stored, True if stored now. `send_to`: the servers
        it is queued for, in the same transaction (a send_* join or leave goes on)."""
        if event.type == CREATE:
            raise ReceivedEventRefused("m.room.create of a room that already exists")
        room_id = event.room_id
        with self._locks.hold(room_id):
            known = self.store.events_in_room(
                room_id,
                [event.event_id, *event.prev_event_ids, *auth_event_ids_to_check(version, event)],
            )
            if event.event_id in known:
                return False
            resolver = RoomResolver(self.store, version, room_id)
            resolved = authorise_received_event(resolver, version, event, known, signed_by)
            try:
                self._persist([event], received=True, send_to=send_to, resolved=resolved)
            except Exception as e:
                if self.store.db.is_unique_violation(e):
                    return False  # stored meanwhile by another process
                raise
            return True

    # --- sending ------------------------------------------------------------------------

    def send_message(
        self, requester: Requester, room_id: str, event_type: str, content: dict, txn_id: str
    ) -> str:
        txn = TxnKey(requester.user_id, requester.device_id, room_id, event_type, txn_id)
        if event_type == REDACTION:
            return self.redact(requester, room_id, None, content, txn)
        return self._append(room_id, PlannedEvent(requester.user_id, event_type, content), txn=txn)

    def redact(
        self, requester: Requester, room_id: str, event_id: str | None, content: dict, txn: TxnKey
    ) -> str:
        """A local user's redaction of `event_id` (from /send: of `content.redacts`); a retry
        of `txn` gets its event again, whatever the rules say now."""
        version = self.room_version(room_id)
        if (existing := self.store.event_for_txn(txn)) is not None:
            return existing
        planned = local_redaction(self.store, version, requester, room_id, event_id, content)
        return self._append(room_id, planned, txn=txn)

    def set_state(
        self, requester: Requester, room_id: str, event_type: str, state_key: str, content: dict
    ) -> str:
        if event_type == "m.room.member":
            membership = content.get("membership")
            if membership not in MEMBERSHIPS:
                raise bad_json("content.membership must be one of " + ", ".join(MEMBERSHIPS))
            return self.update_membership(
                requester.user_id, room_id, state_key, membership, content
            )
        validator = self._state_validators.get(event_type)
        if validator is not None:
            self.room_version(room_id)
            old = self.store.current_state(room_id, [(event_type, state_key)])
            old_event = old.get((event_type, state_key))
            validator(room_id, content, old_event.event.content if old_event else None)
        return self._append(
            room_id,
            PlannedEvent(requester.user_id, event_type, content, state_key),
            skip_if_unchanged=True,
        )

    # --- membership ---------------------------------------------------------------------

    def update_membership(
        self, sender: str, room_id: str, target: str, membership: str, content: dict | None = None
    ) -> str:
        """join, invite, leave, ban or knock, by `sender` for `target`. `content` may carry
        reason, is_direct and profile fields; membership is set from the argument."""
        if not is_valid_user_id(target):
            raise invalid_param(f"Not a valid user ID: {target}")
        content = dict(content or {})
        content["membership"] = membership
        if (
            membership in ("join", "invite", "knock")
            and self.profiles is not None
            and server_of(target) == self.server_name
        ):
            # The spec asks servers to put their users' profile in these member events.
            for key, value in self.profiles.member_fields(target).items():
                content.setdefault(key, value)
        if membership == "join" and not self.room_exists(room_id):
            raise not_found("Unknown room")
        if membership in ("join", "invite", "knock") and self.store.is_blocked(room_id):
            raise forbidden("This room has been blocked on this server")
        version = self.room_version(room_id)
        if membership in ("invite", "join", "knock") and server_of(target) != self.server_name:
            # Through their server (rooms/remote_membership.py), never as plain state.
            raise MatrixError(
                400, Codes.FORBIDDEN, "Another server's user is invited with /invite only"
            )
        if membership == "invite" and not self.accounts.user_exists(target):
            raise not_found(f"Unknown user {target}")
        if membership == "join" and sender == target:
            authorise_restricted_join(
                self.store, version, self.server_name, room_id, target, content
            )
        if (
            membership == "leave"
            and sender == target
            and self.membership(room_id, target) == "leave"
        ):
            return self.store.current_state(room_id, [("m.room.member", target)])[
                ("m.room.member", target)
            ].event.event_id
        return self._append(
            room_id, PlannedEvent(sender, "m.room.member", content, target), skip_if_unchanged=True
        )

    def update_member_profile(self, user_id: str) -> None:
        """After a profile change: a new join event with the user's current displayname and
        avatar_url in every room they are joined to (a room that refuses it is logged and
        skipped, so one room cannot stop the others from being updated)."""
        profile = self.profiles.member_fields(user_id) if self.profiles is not None else {}
        for room_id in self.joined_rooms(user_id):
            member = self.store.current_state(room_id, [("m.room.member", user_id)]).get(
                ("m.room.member", user_id)
            )
            if member is None or member.event.membership != "join":
                continue
            content = {
                k: v
                for k, v in member.event.content.items()
                if k not in ("displayname", "avatar_url", "join_authorised_via_users_server")
            }
            content.update(profile)
            try:
                self._append(
                    room_id,
                    PlannedEvent(user_id, "m.room.member", content, user_id),
                    skip_if_unchanged=True,
                )
            except MatrixError as e:
                log.warning("profile update not sent to %s: %s", room_id, e)
