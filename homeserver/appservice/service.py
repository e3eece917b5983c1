"""Application services as the client API sees them: who an as_token is, whom it may act
as, the namespaces other users may not take, and the questions we ask an appservice (a
user or alias it may make, a ping).

Spec: Application Service API, "Registration", "Identity assertion", "Querying"; the
client-server API's `m.login.application_service` and `/appservice/{appserviceId}/ping`.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, TypeVar
from urllib.parse import quote, urlencode

from gevent.lock import BoundedSemaphore

from homeserver.accounts.service import AccountService, hash_token
from homeserver.appservice.client import AppserviceClient, AppserviceUnreachable, BadStatus
from homeserver.appservice.registration import Registration
from homeserver.core.errors import Codes, MatrixError, forbidden, limit_exceeded
from homeserver.core.identifiers import server_of
from homeserver.core.requester import Requester
from homeserver.rooms.service import RoomService
from homeserver.storage.directory import DirectoryStore
from homeserver.storage.rooms import StoredEvent

log = logging.getLogger(__name__)
T = TypeVar("T")

EXCLUSIVE = "M_EXCLUSIVE"
# A query is client-triggered: at most this many wait on one appservice at once (past it,
# 429 at once), each within QUERY_DEADLINE, so a hung bridge holds few of the main pool's
# places and each for a bounded time (docs/architecture.md, "Budgets").
QUERIES_AT_ONCE = 4
QUERY_DEADLINE = 10.0


class AppserviceService:
    def __init__(
        self,
        registrations: tuple[Registration, ...],
        accounts: AccountService,
        rooms: RoomService,
        directory: DirectoryStore,
        client: AppserviceClient,
        server_name: str,
        on_request: Callable[[str], None] = lambda appservice_id: None,
    ):
        self.registrations = registrations
        self.accounts = accounts
        self.rooms = rooms
        self.directory = directory
        self.client = client
        self.server_name = server_name
        self._on_request = on_request
        self._by_token = {r.as_token: r for r in registrations}
        self._by_id = {r.id: r for r in registrations}
        self._queries = {r.id: BoundedSemaphore(QUERIES_AT_ONCE) for r in registrations}

    # --- identity ---------------------------------------------------------------------------

    def for_token(self, token: str) -> Registration | None:
        registration = self._by_token.get(token)
        if registration is not None:
            self._on_request(registration.id)
        return registration

    def get(self, appservice_id: str) -> Registration | None:
        return self._by_id.get(appservice_id)

    def requester(
        self, registration: Registration, user_id: str | None, device_id: str | None
    ) -> Requester:
        """Who a request with the as_token acts as: its sender, or `user_id`, one of its
        namespace's registered users; `device_id` (MSC3202) one of that user's devices."""
        user_id = user_id or registration.sender
        if not registration.owns_user(user_id) or server_of(user_id) != self.server_name:
            raise forbidden("Application service cannot masquerade as this user")
        if user_id != registration.sender and not self.accounts.user_exists(user_id):
            raise forbidden("Application service has not registered this user")
        if device_id is not None and device_id not in self.accounts.store.device_ids(user_id):
            raise forbidden("Application service has not registered this device")
        token_hash = hash_token(registration.as_token)
        return Requester(user_id, device_id or "", False, token_hash, registration.id)

    def ensure_sender(self, registration: Registration) -> None:
        """The appservice's own user exists from the start, as the spec has it."""
        localpart = registration.sender[1:].partition(":")[0]
        if not self.accounts.user_exists(registration.sender):
            try:
                self.accounts.register(localpart, None, inhibit_login=True)
            except MatrixError as e:
                if e.errcode != Codes.USER_IN_USE:
                    raise

    def rate_limited(self, requester: Requester | None) -> bool:
        if requester is None or requester.appservice_id is None:
            return True
        return self._by_id[requester.appservice_id].rate_limited

    # --- namespaces -----------------------------------------------------------------------

    def check_user_id(self, registration: Registration | None, user_id: str) -> None:
        """400 M_EXCLUSIVE unless `registration` (None: a user, not an appservice) may
        take `user_id`."""
        if registration is not None and not registration.owns_user(user_id):
            raise MatrixError(400, EXCLUSIVE, "User ID is not in the appservice's namespace")
        # Another appservice's exclusive namespace is closed to an appservice too.
        if any(r is not registration and r.exclusive_user(user_id) for r in self.registrations):
            raise MatrixError(400, EXCLUSIVE, "This user ID is reserved by an application service")

    def check_alias(self, requester: Requester, alias: str) -> None:
        """400 M_EXCLUSIVE for an alias in an exclusive namespace of an appservice other
        than the requester's."""
        for registration in self.registrations:
            if registration.id != requester.appservice_id and registration.exclusive_alias(alias):
                raise MatrixError(
                    400, EXCLUSIVE, "This alias is reserved by an application service"
                )

    # --- interest ---------------------------------------------------------------------------

    def interest(self, registration: Registration, stored: list[StoredEvent]) -> list[StoredEvent]:
        """The events `registration` is sent: those of rooms it is interested in (a member
        in its user namespace, an alias in its alias namespace, a room ID in its room
        namespace), and those naming one of its users (a sender, a member event's subject)."""
        rooms: dict[str, bool] = {}
        out = []
        for s in stored:
            event = s.event
            concerns = registration.is_interested_in_user(event.sender) or (
                event.type == "m.room.member"
                and event.state_key is not None
                and registration.is_interested_in_user(event.state_key)
            )
            if not concerns:
                if event.room_id not in rooms:
                    rooms[event.room_id] = self.interested_in_room(registration, event.room_id)
                concerns = rooms[event.room_id]
            if concerns:
                out.append(s)
        return out

    def interested_in_room(self, registration: Registration, room_id: str) -> bool:
        if registration.is_interested_in_room_id(room_id):
            return True
        if registration.aliases and any(
            registration.is_interested_in_alias(a) for a in self.directory.aliases_for_room(room_id)
        ):
            return True
        return any(
            registration.is_interested_in_user(u) for u in self.rooms.store.joined_users(room_id)
        )

    # --- questions to an appservice -------------------------------------------------------

    def or_asked(self, kind: str, name: str, read: Callable[[], T]) -> T:
        """`read()`, and if it finds nothing (404) for a user or alias of ours in an
        appservice's namespace, the appservice asked to make it, then `read()` again:
        a bridge makes its puppets and portal rooms when someone looks for them."""
        try:
            return read()
        except MatrixError as e:
            if e.status != 404 or not self.registrations:
                raise
            if kind == "users" and server_of(name) == self.server_name:
                asked = self.query_user(name)
            elif kind == "rooms" and server_of(name) == self.server_name:
                asked = self.query_alias(name)
            else:
                raise
            if not asked:
                raise
        return read()

    def query_user(self, user_id: str) -> bool:
        """Asks the appservice whose namespace holds `user_id` (exclusive ones first) to
        make it: True if one answered that it exists now."""
        return self._query("users", user_id, lambda r: r.is_interested_in_user(user_id))

    def query_alias(self, alias: str) -> bool:
        return self._query("rooms", alias, lambda r: r.is_interested_in_alias(alias))

    def _query(self, kind: str, name: str, interested: Callable[[Registration], bool]) -> bool:
        path = f"/_matrix/app/v1/{kind}/{quote(name, safe='')}"
        for registration in self.registrations:
            if registration.url and interested(registration):
                if self._ask(registration, path) is not None:
                    return True
        return False

    def _ask(self, registration: Registration, path: str) -> object:
        """GET `path` of the appservice: its JSON answer if 200, else None. A few at once
        per appservice (429 past them), each within QUERY_DEADLINE."""
        slots = self._queries[registration.id]
        if not slots.acquire(blocking=False):
            raise limit_exceeded(1000, "Too many questions waiting on the appservice")
        try:
            assert registration.url is not None
            deadline = min(QUERY_DEADLINE, self.client.deadline)
            return self.client.get_json(registration.url + path, registration.hs_token, deadline)
        except AppserviceUnreachable as e:
            log.info("appservice %s: %s: %s", registration.id, path.partition("?")[0], e)
            return None
        finally:
            slots.release()

    # --- third-party networks (Application Service API, "Third-party networks") -----------

    def protocols(self, only: str | None = None) -> dict[str, dict]:
        """Each protocol the appservices offer, as they describe it; two offering one
        protocol have their instances listed together."""
        found: dict[str, dict] = {}
        for registration in self.registrations:
            for protocol in registration.protocols:
                if registration.url is None or only not in (None, protocol):
                    continue
                path = f"/_matrix/app/v1/thirdparty/protocol/{quote(protocol, safe='')}"
                answer = self._ask(registration, path)
                if not isinstance(answer, dict):
                    continue
                if protocol in found:
                    instances = answer.get("instances")
                    if isinstance(instances, list):
                        found[protocol].setdefault("instances", []).extend(instances)
                else:
                    found[protocol] = answer
        return found

    def lookup(self, kind: str, protocol: str | None, args: dict[str, str]) -> list:
        """The `location`s or `user`s the appservices offering `protocol` (any protocol,
        for a reverse lookup) find for `args`, together."""
        suffix = "" if protocol is None else f"/{quote(protocol, safe='')}"
        path = f"/_matrix/app/v1/thirdparty/{kind}{suffix}?{urlencode(args)}"
        found: list = []
        for registration in self.registrations:
            offers = (
                protocol in registration.protocols if protocol else bool(registration.protocols)
            )
            if registration.url and offers:
                answer = self._ask(registration, path)
                if isinstance(answer, list):
                    found += [item for item in answer if isinstance(item, dict)]
        return found

    def offers(self, protocol: str) -> bool:
        return any(protocol in r.protocols for r in self.registrations if r.url)

    def ping(self, requester: Requester, appservice_id: str, transaction_id: str | None) -> int:
        """The ping's duration in ms (client-server API, `/appservice/{id}/ping`)."""
        registration = self._by_id.get(appservice_id)
        if registration is None or requester.appservice_id != appservice_id:
            raise forbidden("Provided access token is not the appservice's as_token")
        if registration.url is None:
            raise MatrixError(400, "M_URL_NOT_SET", "Application service doesn't have a URL")
        try:
            took = self.client.ping(registration.url, registration.hs_token, transaction_id)
            # Whole milliseconds, rounded up: mautrix reads a 0 as no answer (its `or -1`).
            return math.ceil(took)
        except AppserviceUnreachable as e:
            if e.timed_out:
                raise MatrixError(
                    504, "M_CONNECTION_TIMEOUT", "Timed out pinging the appservice"
                ) from None
            raise MatrixError(502, "M_CONNECTION_FAILED", "Cannot reach the appservice") from None
        except BadStatus as e:
            body = e.answer.body.decode("utf-8", "replace")[:1000]
            error = MatrixError(502, "M_BAD_STATUS", "The appservice answered with an error")
            error.extra.update(status=e.answer.status, body=body)  # the spec's fields
            raise error from None
