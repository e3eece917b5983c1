"""Another server's room directory and aliases, looked up for a client (ADR-0079).

The spec lets anyone, unauthenticated, make us call another server here, so every lookup
runs under `client_outbound_budget` and a 10 s total deadline (homeserver/outbound.py), and
beyond ADR-0079:
- identical public-room queries in flight share one outbound call (SingleFlight), and a
  success is cached for 30 s, keyed by everything that shapes the answer; only an answer
  served from that cache takes no slot, because a request waiting on a shared call still
  holds a main-pool greenlet;
- an address that just timed out or refused us cools down (federation/cooldown.py): when its
  addresses are known before discovery the request is refused before taking a slot,
  otherwise right after discovery, and the slot is freed at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from budget import DeadlineExceeded, InFlightBudget
from homeserver.core.caching import TtlCache
from homeserver.core.concurrency import SingleFlight
from homeserver.core.errors import Codes, MatrixError
from homeserver.federation.admission import (
    DIRECTORY_DEADLINE_SECONDS,
    Caller,
    admitted,
    count_failure,
)
from homeserver.federation.client import FederationClient
from homeserver.federation.cooldown import AddressCooldown
from homeserver.federation.errors import (
    FederationError,
    MalformedResponse,
    RemoteError,
    to_client_error,
)
from homeserver.metrics import Metrics

PUBLIC_ROOMS_CACHE_SECONDS = 30.0
PUBLIC_ROOMS_CACHE_ENTRIES = 1024
# A remote room list is a page of small objects; anything bigger is not an answer we want.
PUBLIC_ROOMS_MAX_BYTES = 4 * 1024 * 1024
ALIAS_MAX_BYTES = 64 * 1024

PUBLIC_ROOMS_PATH = "/_matrix/federation/v1/publicRooms"
QUERY_DIRECTORY_PATH = "/_matrix/federation/v1/query/directory"


@dataclass(frozen=True)
class PublicRoomsQuery:
    """Everything that shapes a public room list answer, and so its cache key."""

    limit: int | None = None
    since: str | None = None
    search_term: str | None = None
    room_types: tuple | None = None
    include_all_networks: bool = False
    third_party_instance_id: str | None = None

    @property
    def has_filter(self) -> bool:
        return self.search_term is not None or self.room_types is not None

    def federation_body(self) -> dict:
        body: dict[str, Any] = {"include_all_networks": self.include_all_networks}
        if self.limit is not None:
            body["limit"] = self.limit
        if self.since is not None:
            body["since"] = self.since
        if self.third_party_instance_id is not None:
            body["third_party_instance_id"] = self.third_party_instance_id
        room_filter: dict[str, Any] = {}
        if self.search_term is not None:
            room_filter["generic_search_term"] = self.search_term
        if self.room_types is not None:
            room_filter["room_types"] = list(self.room_types)
        if room_filter:
            body["filter"] = room_filter
        return body

    def federation_query(self) -> dict:
        query: dict[str, Any] = {}
        if self.limit is not None:
            query["limit"] = str(self.limit)
        if self.since is not None:
            query["since"] = self.since
        if self.include_all_networks:
            query["include_all_networks"] = "true"
        if self.third_party_instance_id is not None:
            query["third_party_instance_id"] = self.third_party_instance_id
        return query

    def matches(self, entry: dict) -> bool:
        """The filter, applied here when the remote could not apply it."""
        if self.search_term is not None:
            needle = self.search_term.casefold()
            fields = (entry.get("name"), entry.get("topic"), entry.get("canonical_alias"))
            if not any(isinstance(f, str) and needle in f.casefold() for f in fields):
                return False
        if self.room_types is not None and entry.get("room_type") not in self.room_types:
            return False
        return True


def _public_rooms_body(server: str, body: Any) -> dict:
    """The remote's answer, checked for the spec's shape and trimmed to it."""
    if not isinstance(body, dict) or not isinstance(body.get("chunk"), list):
        raise MalformedResponse(server, "publicRooms answer has no chunk list")
    chunk = []
    for entry in body["chunk"]:
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("room_id"), str)
            or not isinstance(entry.get("num_joined_members"), int)
        ):
            raise MalformedResponse(server, "publicRooms entry without room_id or member count")
        chunk.append(entry)
    result: dict[str, Any] = {"chunk": chunk}
    for key in ("next_batch", "prev_batch"):
        if isinstance(body.get(key), str):
            result[key] = body[key]
    if isinstance(body.get("total_room_count_estimate"), int):
        result["total_room_count_estimate"] = body["total_room_count_estimate"]
    return result


def _falls_back_to_get(exc: RemoteError) -> bool:
    # A server without POST /publicRooms filtering answers 404 or 405, or M_UNRECOGNIZED.
    return exc.status in (404, 405) or exc.errcode == Codes.UNRECOGNIZED


class RemoteDirectory:
    def __init__(
        self,
        client: FederationClient,
        budget: InFlightBudget,
        cooldown: AddressCooldown,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._client = client
        self._budget = budget
        self._cooldown = cooldown
        self._metrics = metrics
        self._flight = SingleFlight()
        self._cache = TtlCache(clock, PUBLIC_ROOMS_CACHE_ENTRIES)

    # --- public room lists ------------------------------------------------------------------

    def public_rooms(self, server: str, query: PublicRoomsQuery, caller: Caller) -> dict:
        key = (server, query)
        cached = self._cache.get(key)
        if cached is not None:
            self._metrics.cache_hits.labels("remote_public_rooms").inc()
            return cached
        self._metrics.cache_misses.labels("remote_public_rooms").inc()

        def fetch(deadline):
            # The deadline is entered here too, so that its expiry reaches the waiters as
            # a shared failure (DeadlineExceeded) rather than as a leader that vanished,
            # which would make each of them try the silent peer again.
            with deadline:
                result = self._fetch_public_rooms(server, query, deadline)
            self._cache.put(key, result, PUBLIC_ROOMS_CACHE_SECONDS)
            return result

        def shared_fetch(deadline):
            return self._flight.run(
                key,
                lambda: fetch(deadline),
                on_wait=self._metrics.coalesced.labels("public_rooms").inc,
            )

        return self._call("public_rooms", server, caller, shared_fetch)

    def _fetch_public_rooms(self, server: str, query: PublicRoomsQuery, deadline) -> dict:
        if not query.has_filter:
            body = self._client.get_json(
                server,
                PUBLIC_ROOMS_PATH,
                query.federation_query(),
                deadline=deadline,
                max_bytes=PUBLIC_ROOMS_MAX_BYTES,
                target_health=self._cooldown,
            )
            return _public_rooms_body(server, body)
        try:
            body = self._client.post_json(
                server,
                PUBLIC_ROOMS_PATH,
                query.federation_body(),
                deadline=deadline,
                max_bytes=PUBLIC_ROOMS_MAX_BYTES,
                target_health=self._cooldown,
            )
            return _public_rooms_body(server, body)
        except RemoteError as e:
            if not _falls_back_to_get(e):
                raise
        # The remote cannot filter: fetch the unfiltered page and filter it here.
        body = _public_rooms_body(
            server,
            self._client.get_json(
                server,
                PUBLIC_ROOMS_PATH,
                query.federation_query(),
                deadline=deadline,
                max_bytes=PUBLIC_ROOMS_MAX_BYTES,
                target_health=self._cooldown,
            ),
        )
        body["chunk"] = [entry for entry in body["chunk"] if query.matches(entry)]
        return body

    # --- aliases ----------------------------------------------------------------------------

    def resolve_alias(self, alias: str, server: str, caller: Caller) -> tuple[str, list[str]]:
        return self._call(
            "alias", server, caller, lambda deadline: self.alias_within(alias, server, deadline)
        )

    def alias_within(self, alias: str, server: str, deadline) -> tuple[str, list[str]]:
        """The lookup alone, for a call that already holds a slot and a deadline (a remote
        join by alias: rooms/remote_membership.py). Raises FederationError."""
        body = self._client.get_json(
            server,
            QUERY_DIRECTORY_PATH,
            {"room_alias": alias},
            deadline=deadline,
            max_bytes=ALIAS_MAX_BYTES,
            target_health=self._cooldown,
        )
        if not isinstance(body, dict) or not isinstance(body.get("room_id"), str):
            raise MalformedResponse(server, "query/directory answer has no room_id")
        servers = body.get("servers", [])
        if not isinstance(servers, list) or not all(isinstance(s, str) for s in servers):
            raise MalformedResponse(server, "query/directory servers is not a string list")
        return body["room_id"], servers

    # --- the admitted call -------------------------------------------------------------------

    def _call(self, call: str, server: str, caller: Caller, fn: Callable[[Any], Any]):
        """fn(deadline) under a client outbound slot and the directory deadline, its failures
        mapped for the client (docs/architecture.md, "Budgets")."""
        try:
            known = self._client.discovery.known_targets(server)
            if known:
                self._cooldown.refuse_if_all_cooling(server, known)  # before taking a slot
            with admitted(self._budget, caller):
                deadline = self._client.deadline(
                    DIRECTORY_DEADLINE_SECONDS, what=f"{call} on {server}"
                )
                with deadline:
                    result = fn(deadline)
        except (FederationError, DeadlineExceeded) as e:
            count_failure(self._metrics, call, e)
            raise to_client_error(e, server) from None
        except MatrixError:
            self._metrics.outbound_calls.labels(call, "refused").inc()
            raise
        self._metrics.outbound_calls.labels(call, "ok").inc()
        return result
