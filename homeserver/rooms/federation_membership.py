"""Membership asked for by other servers: the server side of make_join/send_join,
make_leave/send_leave, make_knock/send_knock (server-server spec, "Joining Rooms",
"Leaving Rooms", "Knocking upon a room") and of invites to our users (`PUT /v2/invite`).

A `make_*` answers with an unsigned event template built on the room's current state and
extremities, checked against the auth rules so that a refusal comes before the remote server
signs anything. A `send_*` checks the signed event the way every received PDU is checked
(format, the signatures of the servers that must sign it through the keyring, content hash:
`pdu_checks.py`), then stores it through `RoomService.receive_event`, which applies the auth
rules and persists it at the one persist point.

An invite to a room this server is not in cannot be auth-checked (we hold none of the room's
state): its format and the inviting server's signature are checked, we sign it, and it is
kept beside the rooms (storage/remote_invites.py) with the stripped state the inviting server
sent, for /sync.
"""

from __future__ import annotations

import copy
from typing import Callable, Iterable

from signedjson.sign import sign_json

from homeserver.core.clock import now_ms
from homeserver.core.errors import Codes, MatrixError, bad_json, forbidden, not_found
from homeserver.core.events import Event
from homeserver.core.identifiers import is_valid_user_id, server_of
from homeserver.federation.errors import KeyResolutionRefused
from homeserver.rooms.auth import AuthError, check_auth_events, select_auth_events
from homeserver.rooms.events import (
    MAX_PREV_EVENTS,
    InvalidEvent,
    check_pdu_format,
    event_id_for,
    event_references,
    redact,
)
from homeserver.rooms.pdu_checks import CheckedPdu, PduChecker
from homeserver.rooms.received import ReceivedEventRefused
from homeserver.rooms.resolution import RoomResolver
from homeserver.rooms.restricted_joins import (
    AUTHORISER,
    authorise_restricted_join,
    check_countersignable,
)
from homeserver.rooms.server_acl import ServerAcls
from homeserver.rooms.service import RoomService
from homeserver.rooms.versions import KNOWN_ROOM_VERSIONS, RoomVersion
from homeserver.storage.remote_invites import RemoteInviteStore
from homeserver.storage.room_graph import RoomGraphStore

# Stripped state events kept from an invite request: a room's name, avatar, topic, join
# rules and the like are a handful; more is a peer padding our database.
MAX_INVITE_ROOM_STATE = 50
# The stripped form a client sees (client-server spec, "Stripped state").
_STRIPPED_KEYS = ("type", "state_key", "sender", "content")
# A send_join answer carries the room's whole state and auth chain: bounded by the room,
# and by this, which no real room's auth chain reaches.
MAX_AUTH_CHAIN = 100_000


def stripped(event: dict) -> dict:
    return {k: event[k] for k in _STRIPPED_KEYS if k in event}


def incompatible_version(version: str) -> MatrixError:
    return MatrixError(
        400,
        Codes.INCOMPATIBLE_ROOM_VERSION,
        f"Your server does not support the room's version {version}",
        room_version=version,
    )


# (call, arguments, source IP) -> main's answer: how a worker shard hands main the writes.
MembershipRelay = Callable[[str, dict, "str | None"], dict]


CREATE_KEY = ("m.room.create", "")


class FederationMembership:
    def __init__(
        self,
        rooms: RoomService,
        checker: PduChecker,
        graph: RoomGraphStore,
        invites: RemoteInviteStore,
        wake_users: Callable[[Iterable[str]], None],
        acls: ServerAcls,
        relay: MembershipRelay | None = None,
    ):
        self.rooms = rooms
        self.acls = acls
        # In a worker shard: main stores, so the writes below are main's to do.
        self.relay = relay
        self.checker = checker
        self.graph = graph
        self.invites = invites
        # Wakes the /sync requests of these users (an invite is stored outside any room).
        self.wake_users = wake_users

    # --- make_* --------------------------------------------------------------------------

    def make_membership(
        self,
        origin: str,
        room_id: str,
        user_id: str,
        membership: str,
        supported_versions: list[str] | None = None,
    ) -> dict:
        """The event template for `user_id` (of `origin`) to join, leave or knock."""
        version = self._resident_room(room_id)
        self.acls.check(room_id, origin)
        if supported_versions is not None and version.identifier not in supported_versions:
            raise incompatible_version(version.identifier)
        if not is_valid_user_id(user_id) or server_of(user_id) != origin:
            raise forbidden(f"{origin} may not ask for a membership event of {user_id}")
        if membership == "knock" and not version.knock_join_rule:
            raise incompatible_version(version.identifier)
        content: dict = {"membership": membership}
        if membership == "join":
            rooms = self.rooms  # names the local authoriser of a join to a restricted room
            authorise_restricted_join(
                rooms.store, version, rooms.server_name, room_id, user_id, content
            )
        template = self._template(version, room_id, user_id, content)
        return {"event": template, "room_version": version.identifier}

    def _resident_room(self, room_id: str) -> RoomVersion:
        version = self.rooms.room_version(room_id)
        if not self.rooms.is_joined_here(room_id):
            raise not_found("This server is not in the room")
        return version

    def _template(self, version: RoomVersion, room_id: str, user_id: str, content: dict) -> dict:
        """An unsigned member event on the room's current state, or 403 if the auth rules
        would refuse it there."""
        store = self.rooms.store
        keys = [
            ("m.room.create", ""),
            ("m.room.power_levels", ""),
            ("m.room.join_rules", ""),
            ("m.room.member", user_id),
        ]
        authoriser = content.get("join_authorised_via_users_server")
        if authoriser:
            keys.append(("m.room.member", authoriser))
        state = {k: s.event for k, s in store.current_state(room_id, keys).items()}
        auth_events = select_auth_events(version, "m.room.member", user_id, user_id, content, state)
        prev = store.forward_extremities(room_id)[-MAX_PREV_EVENTS:]
        template = {
            "room_id": room_id,
            "sender": user_id,
            "state_key": user_id,
            "type": "m.room.member",
            "content": content,
            "prev_events": event_references(version, prev),
            "auth_events": event_references(version, auth_events),
            "depth": max((e.depth for e in prev), default=0) + 1,
            "origin_server_ts": now_ms(),
            "origin": self.rooms.server_name,
        }
        try:
            # The authorising server's signature is ours, added at send_join.
            # In v12 the create event is implied by the room ID, not listed: checked all the same.
            implied = [state[CREATE_KEY]] if version.room_id_is_create_event_id else []
            check_auth_events(
                version, Event("$template", template), auth_events + implied, lambda e, s: True
            )
        except AuthError as e:
            raise forbidden(f"You may not {content['membership']} this room: {e}") from None
        return template

    # --- send_* --------------------------------------------------------------------------

    def send_membership(
        self,
        origin: str,
        room_id: str,
        event_id: str,
        pdu: dict,
        membership: str,
        source_ip: str | None,
    ) -> dict:
        """Checks, stores and answers a signed join, leave or knock of `origin`'s user."""
        if self.relay is not None:
            args = {"origin": origin, "room_id": room_id, "event_id": event_id, "pdu": pdu}
            return self.relay("send_membership", {**args, "membership": membership}, source_ip)
        version = self._resident_room(room_id)
        self.acls.check(room_id, origin)
        pdu = self._check_member_event(version, origin, room_id, event_id, pdu, membership)
        if membership == "join":
            self._countersign_authorised_join(version, pdu)
        event, signed_by = self._verified(version, event_id, pdu, source_ip)
        # On to the room's other servers (joined before it, or after: a leave still reaches
        # the server it leaves behind); the origin has it, and we are not sent to.
        send_to = set(self.rooms.joined_servers(room_id)) - {origin}
        try:
            self.rooms.receive_event(version, event, signed_by, send_to=send_to)
        except ReceivedEventRefused as e:
            raise forbidden(f"The {membership} event was refused: {e}") from None
        if membership == "join":
            return self._join_answer(event)
        if membership == "knock":
            return {"knock_room_state": self.stripped_state(room_id)}
        return {}

    def _check_member_event(
        self,
        version: RoomVersion,
        origin: str,
        room_id: str,
        event_id: str,
        pdu,
        membership: str,
    ) -> dict:
        """The PDU is a `membership` event of one of `origin`'s users about themselves,
        in this room, named `event_id`, in its room version's format; a copy without
        `unsigned` is returned."""
        if not isinstance(pdu, dict):
            raise bad_json("The body must be the signed event")
        pdu = {k: copy.deepcopy(v) for k, v in pdu.items() if k != "unsigned"}
        try:
            check_pdu_format(version, Event(event_id, pdu))
        except InvalidEvent as e:
            raise bad_json(f"Invalid event: {e}") from None
        content = pdu["content"]
        if (
            pdu["room_id"] != room_id
            or pdu["type"] != "m.room.member"
            or pdu.get("state_key") != pdu["sender"]
            or content.get("membership") != membership
        ):
            raise bad_json(f"Not a {membership} event of its sender in {room_id}")
        if server_of(pdu["sender"]) != origin:
            raise forbidden(f"{origin} may not send a membership event of {pdu['sender']}")
        if event_id_for(version, pdu) != event_id:
            raise bad_json("The event ID in the path is not the event's")
        return pdu

    def _countersign_authorised_join(self, version: RoomVersion, pdu: dict) -> None:
        """A restricted join names one of our users as authorising it: we sign it (spec,
        "Restricted rooms") only after every check `make_join` makes holds now
        (restricted_joins.py); a server may skip make_join and come straight here."""
        authoriser = pdu["content"].get(AUTHORISER)
        if not isinstance(authoriser, str) or server_of(authoriser) != self.rooms.server_name:
            return
        check_countersignable(
            self.rooms.store,
            version,
            self.rooms.server_name,
            pdu["room_id"],
            pdu["state_key"],
            authoriser,
        )
        signed = sign_json(redact(version, pdu), self.rooms.server_name, self.rooms.signing_key)
        pdu.setdefault("signatures", {}).update(signed["signatures"])

    def _verified(
        self, version: RoomVersion, event_id: str, pdu: dict, source_ip: str | None
    ) -> tuple[Event, frozenset[str]]:
        """The event once the servers that must sign it have, with keys from the keyring;
        raises `KeyResolutionRefused` for the caller to answer 429."""
        result = self.checker.verify(CheckedPdu(event_id, pdu, version), source_ip)
        if isinstance(result, KeyResolutionRefused):
            raise result
        if result.error is not None or result.event is None:
            raise forbidden(result.error or "The event could not be checked")
        if result.event.pdu != pdu:
            # The checker keeps a redacted copy of an event whose hash does not match; a
            # membership event asked for by its own server has no reason to be so.
            raise bad_json("The event does not match its content hash")
        return result.event, result.signed_by

    def _join_answer(self, event: Event) -> dict:
        """The v2 send_join answer: the state before the join, its auth chain, and the
        event as stored (with our signature if we authorised it)."""
        room_id = event.room_id
        stored = self.graph.event_in_room(room_id, event.event_id)
        if stored is None:  # stored a moment ago; only a purge could take it away
            raise not_found("The join event is no longer stored")
        version = self.rooms.room_version(room_id)
        state = RoomResolver(self.rooms.store, version, room_id).stored_state_before(stored.event)
        state_ids = [s.event.event_id for s in state.values()]
        chain = self.graph.auth_chain(room_id, [*state_ids, event.event_id], MAX_AUTH_CHAIN)
        return {
            "origin": self.rooms.server_name,
            "event": stored.event.pdu,
            "state": [s.event.pdu for s in sorted(state.values(), key=lambda s: s.stream_ordering)],
            "auth_chain": [s.event.pdu for s in chain],
            "servers_in_room": self.rooms.joined_servers(room_id),
            "members_omitted": False,
        }

    def stripped_state(self, room_id: str) -> list[dict]:
        """What a knocker or an invitee is shown of a room."""
        keys = [
            (t, "")
            for t in (
                "m.room.create",
                "m.room.join_rules",
                "m.room.name",
                "m.room.avatar",
                "m.room.canonical_alias",
                "m.room.encryption",
                "m.room.topic",
            )
        ]
        state = self.rooms.store.current_state(room_id, keys)
        ordered = sorted(state.values(), key=lambda s: s.stream_ordering)
        return [stripped(s.event.pdu) for s in ordered]

    # --- invites ---------------------------------------------------------------------------

    def receive_invite(
        self, origin: str, room_id: str, event_id: str, body: dict, source_ip: str | None
    ) -> dict:
        """`PUT /v2/invite`: checks the invite of one of our users, signs it, keeps it, and
        answers with the event as signed."""
        if self.relay is not None:
            args = {"origin": origin, "room_id": room_id, "event_id": event_id, "body": body}
            return self.relay("receive_invite", args, source_ip)
        version_id = body.get("room_version")
        if not isinstance(version_id, str):
            raise bad_json("room_version is required")
        version = KNOWN_ROOM_VERSIONS.get(version_id)
        if version is None:
            raise incompatible_version(version_id)
        pdu = body.get("event")
        if not isinstance(pdu, dict):
            raise bad_json("event is required")
        sender = pdu.get("sender")
        if not isinstance(sender, str) or server_of(sender) != origin:
            raise forbidden(f"{origin} may not send an invite from {sender}")
        resident = self.rooms.room_exists(room_id) and self.rooms.is_joined_here(room_id)
        if resident:
            self.acls.check(room_id, origin)
        pdu = self._check_invite_event(version, room_id, event_id, pdu)
        event, signed_by = self._verified(version, event_id, pdu, source_ip)
        signed = sign_json(redact(version, pdu), self.rooms.server_name, self.rooms.signing_key)
        pdu.setdefault("signatures", {}).update(signed["signatures"])
        event = Event(event_id, pdu)
        if resident:
            try:
                self.rooms.receive_event(version, event, signed_by | {self.rooms.server_name})
            except ReceivedEventRefused as e:
                raise forbidden(f"The invite was refused: {e}") from None
        else:
            state = _invite_room_state(body.get("invite_room_state"))
            self.invites.put(version.identifier, event, state, "invite")
            self.wake_users([event.state_key or ""])
        return {"event": pdu}

    def _check_invite_event(
        self, version: RoomVersion, room_id: str, event_id: str, pdu: dict
    ) -> dict:
        pdu = {k: copy.deepcopy(v) for k, v in pdu.items() if k != "unsigned"}
        try:
            check_pdu_format(version, Event(event_id, pdu))
        except InvalidEvent as e:
            raise bad_json(f"Invalid event: {e}") from None
        invitee = pdu.get("state_key")
        if (
            pdu["room_id"] != room_id
            or pdu["type"] != "m.room.member"
            or pdu["content"].get("membership") != "invite"
            or not isinstance(invitee, str)
        ):
            raise bad_json(f"Not an invite to {room_id}")
        if event_id_for(version, pdu) != event_id:
            raise bad_json("The event ID in the path is not the event's")
        if server_of(invitee) != self.rooms.server_name:
            raise forbidden(f"{invitee} is not a user of this server")
        if not self.rooms.accounts.user_exists(invitee):
            raise not_found(f"Unknown user {invitee}")
        return pdu


def _invite_room_state(value) -> list[dict]:
    """The stripped state an invite request carries, as a client is shown it."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_INVITE_ROOM_STATE:
        raise bad_json(f"invite_room_state must be a list of at most {MAX_INVITE_ROOM_STATE}")
    events = []
    for item in value:
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("type"), str)
            or not isinstance(item.get("state_key"), str)
            or not isinstance(item.get("content"), dict)
        ):
            raise bad_json("invite_room_state holds events with type, state_key and content")
        events.append(stripped(item))
    return events
