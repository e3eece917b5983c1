"""Checking a `send_join` answer before anything of it is stored (server-server spec,
"Joining Rooms" and "Checks performed on receipt of a PDU").

Every event of the answer, the room's state, its auth chain and the join event itself, must
have its room version's format, carry valid signatures (keys from the keyring, under its
budget), and pass the auth rules against its own auth events; the join must also pass against
the state. A content hash that does not match keeps the event redacted, as the spec says. One
failure refuses the whole answer: a resident server that hands us a forged room is not
trusted for any of it, and the join tries the next server.
"""

from __future__ import annotations

from dataclasses import dataclass

import gevent

from budget import OutboundDeadline
from homeserver.core.concurrency import in_turns
from homeserver.core.events import Event
from homeserver.federation.errors import MalformedResponse
from homeserver.federation.junk import JunkAnswers
from homeserver.rooms.auth import (
    AUTH_EVENT_TYPES,
    AuthError,
    StateKey,
    auth_event_ids_to_check,
    check_against_state,
    check_auth_events,
)
from homeserver.rooms.events import InvalidEvent, check_pdu_format, event_id_for, room_id_of
from homeserver.rooms.pdu_checks import CheckedPdu, PduChecker, signers
from homeserver.rooms.versions import RoomVersion

# Events identified (hashed) per native-thread task, and authorised between two pauses.
IDENTIFY_BATCH = 256
AUTHORISED_PER_PAUSE = 200


class BadJoinResponse(MalformedResponse):
    """A send_join answer that does not check out; nothing of it is stored."""


@dataclass(frozen=True)
class JoinedRoom:
    """A checked send_join answer: the events to store, in an order where each event's
    auth events come before it and the room's state comes last, then our join; and the
    room's state before our join, as the answer gave it (our join's state group)."""

    version: RoomVersion
    creator: str
    events: list[Event]
    join: Event
    state_before: dict[StateKey, str]


def _pdus(server: str, body: object, key: str) -> list[dict]:
    items = body.get(key) if isinstance(body, dict) else None
    if not isinstance(items, list) or not all(isinstance(p, dict) for p in items):
        raise BadJoinResponse(server, f"send_join answer has no {key} list of events")
    return items


def _identified(server: str, version: RoomVersion, room_id: str, pdus: list[dict]) -> dict:
    """{event_id: pdu}, each of the room and of the version's format. An event ID is a hash
    of the redacted event: pure work, done on native threads in batches."""
    threads = gevent.get_hub().threadpool
    found: dict[str, dict] = {}
    for at in range(0, len(pdus), IDENTIFY_BATCH):
        batch = pdus[at : at + IDENTIFY_BATCH]
        for event_id, pdu, error in threads.apply(_identify_batch, (version, room_id, batch)):
            if error is not None:
                raise BadJoinResponse(server, f"event {event_id} {error}")
            found[event_id] = pdu
    return found


def _identify_batch(version: RoomVersion, room_id: str, pdus: list[dict]) -> list[tuple]:
    """(event_id, pdu, error or None) for each: safe on a native thread."""
    found: list[tuple[str, dict, str | None]] = []
    for pdu in pdus:
        event_id = event_id_for(version, pdu)
        try:
            check_pdu_format(version, Event(event_id, pdu))
        except (InvalidEvent, KeyError, TypeError) as e:
            found.append((event_id, pdu, f"is not valid: {e}"))
            continue
        error = None if room_id_of(version, pdu) == room_id else "is of another room"
        found.append((event_id, pdu, error))
    return found


def _auth_chain_of(version: RoomVersion, starts: list[Event], pdus: dict[str, dict]) -> set[str]:
    """The IDs of `pdus` reachable from `starts` through auth events: what an answer's
    state and our join need, and all of it that is checked."""
    seen: set[str] = set()
    frontier = [a for e in starts for a in auth_event_ids_to_check(version, e)]
    while frontier:
        event_id = frontier.pop()
        if event_id in seen or event_id not in pdus:
            continue
        seen.add(event_id)
        frontier += auth_event_ids_to_check(version, Event(event_id, pdus[event_id]))
    return seen


class JoinResponseChecker:
    def __init__(self, checker: PduChecker, junk: JunkAnswers, max_events: int):
        self._checker = checker
        self.max_events = max_events  # federation.joins.max_events
        self.junk = junk  # servers whose answers were mostly junk: asked last

    def check(
        self,
        server: str,
        version: RoomVersion,
        our_join: Event,
        body: object,
        deadline: OutboundDeadline | None = None,
    ) -> JoinedRoom:
        """The checked room, or `BadJoinResponse`. Run it under the join's deadline: a key
        fetch the keyring's budget refuses waits for a slot until then.

        The answer is cut to what a join needs before any signature is checked: the state,
        our join, and the auth chain events they reach; the rest is dropped, and a server
        whose answer was mostly that is remembered (federation/junk.py)."""
        room_id = our_join.room_id
        state_pdus, chain_pdus = _pdus(server, body, "state"), _pdus(server, body, "auth_chain")
        if len(state_pdus) + len(chain_pdus) > self.max_events:
            raise BadJoinResponse(server, "send_join answer has too many events")
        state_ids = _identified(server, version, room_id, state_pdus)
        # An auth chain holds state events of the auth types only: the rest is not even hashed.
        chain_pdus = [
            p for p in chain_pdus if p.get("type") in AUTH_EVENT_TYPES and "state_key" in p
        ]
        chain_by_id = _identified(server, version, room_id, chain_pdus)
        join_pdu = body.get("event") if isinstance(body, dict) else None
        if not isinstance(join_pdu, dict) or event_id_for(version, join_pdu) != our_join.event_id:
            join_pdu = our_join.pdu  # v1 answers, or a server that did not countersign
        # Passes over every event of the answer, pure work: on a native thread, so that the
        # hub runs between the interpreter's switches (100,000 events are seconds of work).
        threads = gevent.get_hub().threadpool
        everything = threads.apply(_needed, (version, state_ids, chain_by_id, our_join, join_pdu))
        held = len(state_pdus) + len(_pdus(server, body, "auth_chain"))
        self.junk.note(server, held, len(everything) - 1)
        checked = self._verified(server, version, everything, deadline)
        events, signed_by = threads.apply(_events_and_signers, (checked,))
        for event in in_turns(events.values(), AUTHORISED_PER_PAUSE):
            self._authorised(server, version, event, events, signed_by)
        state, ordered = threads.apply(_state_and_order, (server, events, state_ids, our_join))
        join = events[our_join.event_id]
        self._join_allowed(server, version, join, state, signed_by[join.event_id])
        return JoinedRoom(
            version,
            self._creator(server, state),
            ordered,
            join,
            {k: e.event_id for k, e in state.items()},
        )

    def _verified(
        self, server: str, version: RoomVersion, pdus: dict, deadline: OutboundDeadline | None
    ) -> dict[str, CheckedPdu]:
        """Signatures and content hashes of every event (on native threads, in batches:
        rooms/pdu_checks.py). The signers' keys come first through the notaries, a hundred
        servers a query; a key fetch the budget refuses waits for a slot, within the join's
        deadline: a big room names more servers than the budget has slots."""
        items = gevent.get_hub().threadpool.apply(_checked_items, (version, pdus))
        if deadline is not None:
            wanted, newest = signers(items)
            self._checker.keyring.prefetch(wanted, newest, deadline)
        checked: dict[str, CheckedPdu] = {}
        for result in self._checker.verify_all(items, None, wait_for_slots=True):
            if result.error is not None:
                raise BadJoinResponse(server, f"event {result.event_id}: {result.error}")
            checked[result.event_id] = result
        return checked

    @staticmethod
    def _authorised(server, version, event: Event, events: dict, signed_by: dict) -> None:
        needed = auth_event_ids_to_check(version, event)  # v12: the create event too
        if any(a not in events for a in needed):
            raise BadJoinResponse(server, f"{event.event_id} names unknown auth events")
        try:
            check_auth_events(
                version,
                event,
                [events[a] for a in needed],
                lambda ev, name: name in signed_by.get(ev.event_id, ()),
            )
        except AuthError as e:
            raise BadJoinResponse(server, f"{event.event_id} breaks the auth rules: {e}") from None

    @staticmethod
    def _join_allowed(server, version, join: Event, state: dict, signed: frozenset) -> None:
        if ("m.room.create", "") not in state:
            raise BadJoinResponse(server, "the room's state has no m.room.create")
        try:
            check_against_state(version, join, state, lambda ev, name: name in signed)
        except AuthError as e:
            raise BadJoinResponse(server, f"our join is not allowed by the state: {e}") from None

    @staticmethod
    def _creator(server: str, state: dict) -> str:
        create = state[("m.room.create", "")]
        creator = create.content.get("creator", create.sender)
        if not isinstance(creator, str):
            raise BadJoinResponse(server, "m.room.create has no creator")
        return creator


def _needed(
    version: RoomVersion, state_ids: dict, chain_by_id: dict, our_join: Event, join_pdu: dict
) -> dict[str, dict]:
    """{event_id: pdu} of the state, our join and the auth chain events they reach: all
    of the answer that is checked. Safe on a native thread."""
    starts = [Event(i, p) for i, p in state_ids.items()] + [our_join]
    needed = _auth_chain_of(version, starts, {**chain_by_id, **state_ids})
    everything = {i: chain_by_id[i] for i in needed if i in chain_by_id}
    everything.update(state_ids)
    everything[our_join.event_id] = join_pdu
    return everything


def _checked_items(version: RoomVersion, pdus: dict[str, dict]) -> list[CheckedPdu]:
    return [CheckedPdu(event_id, pdu, version) for event_id, pdu in pdus.items()]


def _events_and_signers(checked: dict[str, CheckedPdu]) -> tuple[dict, dict]:
    """({event_id: event}, {event_id: the servers whose signatures verified}). Safe on a
    native thread."""
    events = {i: c.event for i, c in checked.items() if c.event is not None}
    return events, {i: c.signed_by for i, c in checked.items()}


def _state_and_order(
    server: str, events: dict[str, Event], state_ids: dict, our_join: Event
) -> tuple[dict[StateKey, Event], list[Event]]:
    """The answer's state by key, and every event but our join in the order to store them
    (`_ordered`). Safe on a native thread."""
    if any(events[i].state_key is None for i in state_ids):
        raise BadJoinResponse(server, "send_join answer's state holds a non-state event")
    state = {(events[i].type, events[i].state_key or ""): events[i] for i in state_ids}
    others = {i: e for i, e in events.items() if i != our_join.event_id}
    return state, _ordered(others, state_ids)


def _ordered(events: dict[str, Event], state_ids: dict) -> list[Event]:
    """Auth chain events not in the state, then the state, each by depth: stored in this
    order, the room's current state ends as the answer's state."""
    chain = [e for i, e in events.items() if i not in state_ids]
    state = [events[i] for i in state_ids]
    by_depth = lambda e: (e.depth, e.origin_server_ts, e.event_id)  # noqa: E731
    return sorted(chain, key=by_depth) + sorted(state, key=by_depth)
