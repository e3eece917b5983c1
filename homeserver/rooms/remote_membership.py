"""Membership through other servers, for our users: joining a room this server is not in
(by ID or alias, over the `via` servers), knocking on one, inviting another server's user,
and rejecting an invite to, or rescinding a knock on, a room we are not in (server-server
spec: make_join/send_join v2, make_knock/send_knock v1, invite v2, make_leave/send_leave v2).

Each is a client-triggered outbound call (ADR-0079; docs/architecture.md, "Budgets"): one
`client_outbound_budget` slot, refused with 429 at once, and one total deadline for every
step of it, alias lookup and key fetches included, freed on every path. A join's answer is
checked whole (rooms/join_checks.py) before anything is stored, and stored whole.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator
from urllib.parse import quote

from budget import DeadlineExceeded, InFlightBudget, OutboundDeadline
from homeserver.config import JoinsConfig
from homeserver.core.clock import now_ms
from homeserver.core.collector import without_full_passes
from homeserver.core.errors import Codes, MatrixError, forbidden, not_found
from homeserver.core.events import Event
from homeserver.core.identifiers import (
    is_valid_room_id,
    is_valid_server_name,
    is_valid_user_id,
    room_id_server,
    server_of,
)
from homeserver.federation.admission import Caller, admitted, count_failure
from homeserver.federation.client import FederationClient
from homeserver.federation.cooldown import AddressCooldown
from homeserver.federation.errors import (
    FederationError,
    InvalidSignature,
    MalformedResponse,
    RemoteError,
    to_client_error,
)
from homeserver.federation.keyring import Keyring
from homeserver.metrics import Metrics
from homeserver.rooms.events import InvalidEvent, event_from_template, event_id_for, redact
from homeserver.rooms.federation_membership import MAX_INVITE_ROOM_STATE, stripped
from homeserver.rooms.join_checks import JoinResponseChecker
from homeserver.rooms.service import PlannedEvent, RoomService
from homeserver.rooms.versions import KNOWN_ROOM_VERSIONS, RoomVersion
from homeserver.storage.remote_invites import RemoteInvite, RemoteInviteStore

log = logging.getLogger(__name__)

# One deadline for a whole remote leave, invite or knock. A join's is federation.joins.deadline:
# alias lookup, make_join and send_join over every via server, and the key fetches that
# checking a room's state needs, for a big room minutes.
MEMBERSHIP_DEADLINE_SECONDS = 60.0

# Invites one user of another server: (sender, room_id, target, content) -> event ID.
Inviter = Callable[[str, str, str, dict], str]
TEMPLATE_MAX_BYTES = 256 * 1024

# The state an invitee's server shows its user before they join (spec: "stripped state").
INVITE_STATE_TYPES = (
    "m.room.create",
    "m.room.join_rules",
    "m.room.canonical_alias",
    "m.room.avatar",
    "m.room.name",
    "m.room.encryption",
    "m.room.topic",
)

# alias, deadline -> (room_id, servers): the directory's lookup, inside our slot and deadline.
AliasResolver = Callable[[str, "OutboundDeadline | None"], "tuple[str, list[str]]"]

FED_V1 = "/_matrix/federation/v1"
FED_V2 = "/_matrix/federation/v2"


def _q(value: str) -> str:
    return quote(value, safe="")


def _candidates(room_id: str, via: Iterable[str], ours: str) -> list[str]:
    """The servers to try, in order: `via`, then the room ID's own server (none in v12)."""
    servers = [*via, room_id_server(room_id) or ""]
    return [s for s in dict.fromkeys(servers) if s and s != ours and is_valid_server_name(s)]


class RemoteMembership:
    def __init__(
        self,
        rooms: RoomService,
        client: FederationClient,
        keyring: Keyring,
        checker: JoinResponseChecker,
        budget: InFlightBudget,
        cooldown: AddressCooldown,
        metrics: Metrics,
        resolve_alias: AliasResolver,
        remote_invites: RemoteInviteStore,
        wake_users: Callable[[Iterable[str]], None],
        joins: JoinsConfig,
    ):
        self.rooms = rooms
        self._client = client
        self._keyring = keyring
        self._checker = checker
        self._budget = budget
        self._cooldown = cooldown
        self._metrics = metrics
        self._resolve_alias = resolve_alias
        self._remote_invites = remote_invites
        self._wake_users = wake_users
        self._joins = joins
        self.server_name = rooms.server_name

    # --- joins ------------------------------------------------------------------------------

    def join(
        self,
        user_id: str,
        room_id: str | None,
        via: list[str],
        caller: Caller,
        content: dict,
        alias: str | None = None,
    ) -> str:
        """Joins `room_id` (or the room `alias` names, resolved here); returns the room ID.
        A room one of our users is in is joined locally; any other through another server."""
        if alias is not None and server_of(alias) == self.server_name:
            room_id, servers = self._resolve_alias(alias, None)  # our table: no call out
            via, alias = [*via, *servers], None
        if room_id is not None and self.rooms.store.is_blocked(room_id):
            raise forbidden("This room has been blocked on this server")
        if room_id is not None and self._local(room_id):
            return self._join_locally(user_id, room_id, content)
        if room_id is not None:
            # Clients join an invite without `via`: the inviting server is in the room.
            via = [*via, *self._inviting_server(room_id, user_id)]
        started = time.monotonic()
        outcome = "error"
        try:
            # A big room's answer is millions of live objects: no full collection walks them.
            with admitted(self._budget, caller), without_full_passes():
                room_id = self._admitted_join(user_id, room_id, via, content, alias)
            outcome = "ok"
            return room_id
        finally:
            self._metrics.send_join_duration.labels(outcome).observe(time.monotonic() - started)

    def _local(self, room_id: str) -> bool:
        if self.rooms.room_exists(room_id) and self.rooms.is_joined_here(room_id):
            return True
        if room_id_server(room_id) == self.server_name:
            raise not_found("Unknown room")  # ours, and no one is in it: nobody to ask
        return False

    def _inviting_server(self, room_id: str, user_id: str) -> list[str]:
        kept = self._remote_invites.get(room_id, user_id)
        return [server_of(kept.event.sender)] if kept and kept.membership == "invite" else []

    def _join_locally(self, user_id: str, room_id: str, content: dict) -> str:
        self.rooms.update_membership(user_id, room_id, user_id, "join", content)
        return room_id

    def _admitted_join(self, user_id, room_id, via, content, alias) -> str:
        deadline = OutboundDeadline(self._joins.deadline, what=f"join {alias or room_id}")
        target = alias or room_id or ""
        try:
            with deadline:
                if alias is not None:
                    room_id, servers = self._resolve_alias(alias, deadline)
                    via = [*via, server_of(alias), *servers]
                    if self._local(room_id):
                        return self._join_locally(user_id, room_id, content)
                assert room_id is not None
                joined = self._try_servers(
                    self._checker.junk.last(_candidates(room_id, via, self.server_name)),
                    lambda server: self._join_via(server, room_id, user_id, content, deadline),
                )
        except (FederationError, DeadlineExceeded) as e:
            count_failure(self._metrics, "join", e)
            raise to_client_error(e, target) from None
        # Stored after the deadline: a write it interrupted could still commit.
        self.rooms.store_remote_join(joined)
        self._metrics.outbound_calls.labels("join", "ok").inc()
        return room_id

    def _try_servers(self, servers: list[str], attempt: Callable):
        """`attempt(server)` for each server in turn until one succeeds; the deadline
        (DeadlineExceeded) ends the whole loop, other failures move on to the next."""
        if not servers:
            raise MatrixError(
                404, Codes.NOT_FOUND, "No server to ask for this room: give one with via"
            )
        failure: FederationError | None = None
        for server in servers:
            try:
                return attempt(server)
            except FederationError as e:
                log.info("membership through %s failed: %s", server, e)
                self._checker.junk.note_failure(server, e)
                failure = failure if _more_telling(failure, e) else e
        assert failure is not None
        raise failure

    def _make(self, kind: str, server: str, room_id: str, user_id: str, deadline) -> tuple:
        """make_join/make_leave/make_knock: (room version, template)."""
        query = {"ver": list(KNOWN_ROOM_VERSIONS)} if kind != "leave" else None
        try:
            body = self._client.get_json(
                server,
                f"{FED_V1}/make_{kind}/{_q(room_id)}/{_q(user_id)}",
                query,
                deadline=deadline,
                max_bytes=TEMPLATE_MAX_BYTES,
                target_health=self._cooldown,
            )
        except RemoteError as e:
            if e.errcode == Codes.INCOMPATIBLE_ROOM_VERSION:
                raise MatrixError(
                    400, e.errcode, f"{server}: the room's version is not one we support"
                ) from None
            raise
        version = KNOWN_ROOM_VERSIONS.get(
            body.get("room_version", "1") if isinstance(body, dict) else ""
        )
        template = body.get("event") if isinstance(body, dict) else None
        if version is None or not isinstance(template, dict):
            raise MalformedResponse(server, f"make_{kind} answer without a known version and event")
        if (
            template.get("room_id") != room_id
            or template.get("sender") != user_id
            or template.get("state_key") != user_id
            or template.get("type") != "m.room.member"
        ):
            raise MalformedResponse(server, f"make_{kind} template is not our member event")
        return version, template

    def _sign(self, server: str, version: RoomVersion, template: dict, content: dict) -> Event:
        try:
            return event_from_template(
                version,
                template,
                content=content,
                origin_server_ts=now_ms(),
                server_name=self.server_name,
                signing_key=self.rooms.signing_key,
            )
        except InvalidEvent as e:
            raise MalformedResponse(server, f"template makes no valid event: {e}") from None

    def _join_via(self, server, room_id, user_id, content, deadline):
        version, template = self._make("join", server, room_id, user_id, deadline)
        content = {**content, "membership": "join"}
        authoriser = template.get("content", {}).get("join_authorised_via_users_server")
        if isinstance(authoriser, str):
            content["join_authorised_via_users_server"] = authoriser  # a restricted room
        event = self._sign(server, version, template, content)
        # Decoded as it streams: the room's state and auth chain may be 100,000s of events.
        body = self._client.put_json_streamed(
            server,
            f"{FED_V2}/send_join/{_q(room_id)}/{_q(event.event_id)}",
            event.pdu,
            arrays=("state", "auth_chain"),
            max_items=self._checker.max_events,
            deadline=deadline,
            max_bytes=self._joins.max_bytes,
            target_health=self._cooldown,
        )
        return self._checker.check(server, version, event, body, deadline)

    # --- rejecting an invite, rescinding a knock -------------------------------------------

    def leave(self, user_id: str, room_id: str, caller: Caller, content: dict) -> None:
        """Leaves a room; an invite to, or a knock on, a room none of our users is in is
        rejected or rescinded through a server in the room (make_leave/send_leave), any
        other leave is a local event."""
        if not is_valid_room_id(room_id):
            raise not_found("Unknown room")
        pending = self._pending(room_id, user_id)
        if pending is None:
            self.rooms.update_membership(user_id, room_id, user_id, "leave", content)
            return
        servers = _candidates(room_id, pending.servers, self.server_name)
        with admitted(self._budget, caller):
            deadline = self._client.deadline(MEMBERSHIP_DEADLINE_SECONDS, what=f"leave {room_id}")
            try:
                with deadline:
                    event = self._try_servers(
                        servers,
                        lambda s: self._leave_via(s, room_id, user_id, content, deadline),
                    )
            except (FederationError, DeadlineExceeded) as e:
                count_failure(self._metrics, "leave", e)
                raise to_client_error(e, servers[0] if servers else room_id) from None
            self._record_leave(pending, event)
        self._metrics.outbound_calls.labels("leave", "ok").inc()

    def _pending(self, room_id: str, user_id: str) -> _Pending | None:
        """The invite or knock to end through another server: one in a room we hold but
        none of our users is in, or one kept beside the rooms (storage/remote_invites.py),
        whichever is newer."""
        member = None
        if self.rooms.room_exists(room_id):
            if self.rooms.is_joined_here(room_id):
                return None
            member = self.rooms.store.current_state(room_id, [("m.room.member", user_id)]).get(
                ("m.room.member", user_id)
            )
        kept = self._remote_invites.get(room_id, user_id)
        if kept is not None and (member is None or kept.stream_ordering > member.stream_ordering):
            if kept.membership not in ("invite", "knock"):
                return None
            return _Pending(kept.event, _servers_shown(kept), kept=True)
        if member is not None and member.event.membership == "invite":
            return _Pending(member.event, [server_of(member.event.sender)], kept=False)
        if member is None and kept is None and not self.rooms.room_exists(room_id):
            raise not_found("Unknown room")
        return None

    def _record_leave(self, pending: _Pending, event: Event) -> None:
        if not pending.kept:
            self.rooms.store_remote_leave(event)
            return
        kept = self._remote_invites.get(event.room_id, event.state_key or "")
        if kept is not None:
            self._remote_invites.put(kept.room_version, event, [], "leave")
            self._wake_users([event.state_key or ""])

    def _leave_via(self, server, room_id, user_id, content, deadline) -> Event:
        version, template = self._make("leave", server, room_id, user_id, deadline)
        event = self._sign(server, version, template, {**content, "membership": "leave"})
        self._client.put_json(
            server,
            f"{FED_V2}/send_leave/{_q(room_id)}/{_q(event.event_id)}",
            event.pdu,
            deadline=deadline,
            target_health=self._cooldown,
        )
        return event

    # --- inviting another server's user -----------------------------------------------------

    def invite(self, sender: str, room_id: str, target: str, caller: Caller, content: dict) -> str:
        """Invites `target` of another server: our invite event, countersigned by theirs
        (invite v2), stored and then sent to the room's other servers."""
        with self.inviting(caller, [target]) as invite:
            return invite(sender, room_id, target, content)

    @contextlib.contextmanager
    def inviting(self, caller: Caller, targets: list[str]) -> Iterator[Inviter]:
        """Holds one client-triggered slot and one total deadline for inviting `targets`,
        one after another (createRoom's `invite`, whose room is made inside, so that a
        refusal with 429 leaves no room behind); yields the function that invites one."""
        for target in targets:
            if not is_valid_server_name(server_of(target)):
                raise MatrixError(400, Codes.INVALID_PARAM, f"Not a valid user ID: {target}")
        with admitted(self._budget, caller):
            what = f"invite {', '.join(targets)}"
            deadline = self._client.deadline(MEMBERSHIP_DEADLINE_SECONDS, what=what)
            yield lambda sender, room_id, target, content: self._invite_one(
                sender, room_id, target, content, deadline
            )

    def _invite_one(
        self, sender: str, room_id: str, target: str, content: dict, deadline: OutboundDeadline
    ) -> str:
        server = server_of(target)
        planned = PlannedEvent(sender, "m.room.member", {**content, "membership": "invite"}, target)
        version, event = self.rooms.prepare_event(room_id, planned)
        try:
            with deadline:
                signed = self._countersigned(server, version, event, deadline)
        except (FederationError, DeadlineExceeded) as e:
            count_failure(self._metrics, "invite", e)
            raise to_client_error(e, server) from None
        self.rooms.store_prepared(signed, server)
        self._metrics.outbound_calls.labels("invite", "ok").inc()
        return signed.event_id

    def _countersigned(self, server: str, version: RoomVersion, event: Event, deadline) -> Event:
        body = self._client.put_json(
            server,
            f"{FED_V2}/invite/{_q(event.room_id)}/{_q(event.event_id)}",
            {
                "event": event.pdu,
                "room_version": version.identifier,
                "invite_room_state": self._invite_state(event),
            },
            deadline=deadline,
            target_health=self._cooldown,
        )
        pdu = body.get("event") if isinstance(body, dict) else None
        if not isinstance(pdu, dict) or event_id_for(version, pdu) != event.event_id:
            raise MalformedResponse(server, "invite answer is not our invite event")
        try:
            self._keyring.verify_json(
                redact(version, pdu), server, None, at_ts=event.origin_server_ts, deadline=deadline
            )
        except InvalidSignature as e:
            raise MalformedResponse(server, f"invite not countersigned: {e}") from None
        signatures = {**event.pdu["signatures"], server: pdu["signatures"][server]}
        return Event(event.event_id, {**event.pdu, "signatures": signatures})

    def _invite_state(self, invite: Event) -> list[dict]:
        """The room's stripped state for the invitee, with the inviter's membership; the
        create event whole, which newer servers check the room ID against."""
        keys = [(t, "") for t in INVITE_STATE_TYPES] + [("m.room.member", invite.sender)]
        state = self.rooms.store.current_state(invite.room_id, keys)
        stripped = []
        for (event_type, _), stored in state.items():
            pdu = stored.event.pdu
            if event_type == "m.room.create":
                stripped.append(dict(pdu))
                continue
            stripped.append({k: pdu[k] for k in ("type", "state_key", "content", "sender")})
        return stripped

    # --- knocking ------------------------------------------------------------------------

    def knock(
        self,
        user_id: str,
        room_id: str | None,
        via: list[str],
        caller: Caller,
        content: dict,
        alias: str | None = None,
    ) -> str:
        """Knocks on `room_id` (or the room `alias` names); returns the room ID. A room one
        of our users is in is knocked on locally; any other through another server
        (make_knock/send_knock v1), and the knock is kept beside the rooms with the state the
        room's server showed us, as a remote invite is."""
        if alias is not None and server_of(alias) == self.server_name:
            room_id, servers = self._resolve_alias(alias, None)  # our table: no call out
            via, alias = [*via, *servers], None
        if room_id is not None and self._local(room_id):
            return self._knock_locally(user_id, room_id, content)
        with admitted(self._budget, caller):
            return self._admitted_knock(user_id, room_id, via, content, alias)

    def _knock_locally(self, user_id: str, room_id: str, content: dict) -> str:
        self.rooms.update_membership(user_id, room_id, user_id, "knock", content)
        return room_id

    def _admitted_knock(self, user_id, room_id, via, content, alias) -> str:
        target = alias or room_id or ""
        deadline = self._client.deadline(MEMBERSHIP_DEADLINE_SECONDS, what=f"knock {target}")
        try:
            with deadline:
                if alias is not None:
                    room_id, servers = self._resolve_alias(alias, deadline)
                    via = [*via, server_of(alias), *servers]
                    if self._local(room_id):
                        return self._knock_locally(user_id, room_id, content)
                assert room_id is not None
                version, event, state = self._try_servers(
                    _candidates(room_id, via, self.server_name),
                    lambda server: self._knock_via(server, room_id, user_id, content, deadline),
                )
        except (FederationError, DeadlineExceeded) as e:
            count_failure(self._metrics, "knock", e)
            raise to_client_error(e, target) from None
        # Kept after the deadline, as a join is stored: a write it interrupted could commit.
        self._remote_invites.put(version.identifier, event, state, "knock")
        self._wake_users([user_id])
        self._metrics.outbound_calls.labels("knock", "ok").inc()
        return room_id

    def _knock_via(self, server, room_id, user_id, content, deadline):
        version, template = self._make("knock", server, room_id, user_id, deadline)
        event = self._sign(server, version, template, {**content, "membership": "knock"})
        body = self._client.put_json(
            server,
            f"{FED_V1}/send_knock/{_q(room_id)}/{_q(event.event_id)}",
            event.pdu,
            deadline=deadline,
            max_bytes=TEMPLATE_MAX_BYTES,
            target_health=self._cooldown,
        )
        return version, event, _knock_room_state(server, body)


def _knock_room_state(server: str, body) -> list[dict]:
    """send_knock's `knock_room_state`, in the stripped form a client is shown."""
    state = body.get("knock_room_state") if isinstance(body, dict) else None
    if not isinstance(state, list) or len(state) > MAX_INVITE_ROOM_STATE:
        raise MalformedResponse(server, "send_knock answer without a knock_room_state list")
    for item in state:
        if not (
            isinstance(item, dict)
            and isinstance(item.get("type"), str)
            and isinstance(item.get("state_key"), str)
            and isinstance(item.get("content"), dict)
        ):
            raise MalformedResponse(server, "knock_room_state holds a malformed event")
    return [stripped(item) for item in state]


@dataclass(frozen=True)
class _Pending:
    """An invite or a knock of our user that only another server can end."""

    event: Event
    servers: list[str]  # to ask for make_leave, best first
    kept: bool  # kept beside the rooms (storage/remote_invites.py), not in a room's state


def _servers_shown(kept: RemoteInvite) -> list[str]:
    """For a kept invite, the inviter's server; for a knock, the servers of the room's
    state the room showed us (its creator's, its admins'), which are in the room."""
    if kept.membership == "invite":
        return [server_of(kept.event.sender)]
    senders = [e.get("sender") for e in kept.invite_room_state]
    return [server_of(s) for s in senders if isinstance(s, str) and is_valid_user_id(s)]


def _more_telling(kept: FederationError | None, new: FederationError) -> bool:
    """Of two failures of a join over several servers, the one a client learns most from:
    a server's refusal or a bad answer over a server that could not be reached."""
    if kept is None:
        return False
    return isinstance(kept, (RemoteError, MalformedResponse))
