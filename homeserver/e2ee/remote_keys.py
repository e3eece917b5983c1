"""Other servers' users' keys, for a client's /keys/query and /keys/claim (server-server
spec, "End-to-End Encryption"), under ADR-0079 (homeserver/federation/admission.py).

A query answers a user from our cache of their device list when we hold one (we share a
room, and their server keeps it current with EDUs: e2ee/inbound_edus.py); the others are
asked of their servers, and a user we share a room with but hold nothing of is then
cached (`cache_user`: their whole list, with the stream ID its EDUs continue from), so the
next query is answered here, their server up or not. One request takes one
`client_outbound_budget` slot (429 at once when none is free) and one 10 s deadline for all
its servers, asked in parallel, at most `MAX_PARALLEL_SERVERS` at a time. A server that
fails, is cooling down or does not answer in time is in `failures` (the spec's "could not
be reached"), its users absent: the request still answers within its deadline, and the slot
and every greenlet are freed on every path.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from gevent.pool import Pool

from budget import DeadlineExceeded, InFlightBudget, OutboundDeadline
from homeserver.federation.admission import KEYS_DEADLINE_SECONDS, Caller, admitted, count_failure
from homeserver.federation.client import FederationClient
from homeserver.federation.cooldown import AddressCooldown
from homeserver.federation.errors import (
    DestinationUnreachable,
    FederationError,
    MalformedResponse,
    RemoteError,
    to_client_error,
)
from homeserver.metrics import Metrics
from homeserver.storage.e2ee_remote import RemoteDeviceStore

log = logging.getLogger(__name__)

QUERY_PATH = "/_matrix/federation/v1/user/keys/query"
CLAIM_PATH = "/_matrix/federation/v1/user/keys/claim"
# A user's keys are a few hundred bytes a device; this is thousands of devices.
KEYS_MAX_BYTES = 8 * 1024 * 1024
MAX_PARALLEL_SERVERS = 20

# fetch(server, {user: wanted}, deadline) -> the server's answer, already checked.
Fetch = Callable[[str, dict, OutboundDeadline], dict]


def failure(e: Exception, server: str) -> dict:
    """A `failures` entry, shaped as Synapse shapes it (the spec leaves it open). Its message
    is the one a client is told (`to_client_error`): never an address or why it failed."""
    status = e.status if isinstance(e, RemoteError) and e.status else 503
    return {"status": status, "message": to_client_error(e, server).error}


class RemoteKeys:
    def __init__(
        self,
        client: FederationClient,
        budget: InFlightBudget,
        cooldown: AddressCooldown,
        metrics: Metrics,
        cache: RemoteDeviceStore,
        cache_user: Callable[[str], None] = lambda user_id: None,
    ):
        self._client = client
        self._budget = budget
        self._cooldown = cooldown
        self._metrics = metrics
        self._cache = cache
        self._cache_user = cache_user

    # --- /keys/query ----------------------------------------------------------------------

    def query(self, caller: Caller, remote: dict[str, dict], out: dict) -> None:
        ask: dict[str, dict] = {}
        for server, users in remote.items():
            for user_id, wanted in users.items():
                if not self._from_cache(user_id, wanted, out):
                    ask.setdefault(server, {})[user_id] = wanted
        for server, body in self._each_server(
            caller, "keys_query", ask, self._ask(QUERY_PATH, "device_keys"), out
        ):
            _merge_query(body, ask[server], out)
            for user_id in ask[server]:
                if self._cache.is_joined_anywhere(user_id):
                    self._cache_user(user_id)

    def _from_cache(self, user_id: str, wanted: list, out: dict) -> bool:
        cached = self._cache.cached(user_id)
        if cached is None:
            return False
        if not self._cache.is_joined_anywhere(user_id):
            # No EDU reaches us for a user we share no room with: the copy may be stale.
            self._cache.forget(user_id, changed=False)
            return False
        devices = cached[1].get("devices", {})
        out["device_keys"][user_id] = {
            d: keys for d, keys in devices.items() if not wanted or d in wanted
        }
        for key_type in ("master", "self_signing"):
            key = cached[1].get(f"{key_type}_key")
            if isinstance(key, dict):
                out[f"{key_type}_keys"][user_id] = key
        return True

    # --- /keys/claim ----------------------------------------------------------------------

    def claim(self, caller: Caller, remote: dict[str, dict], out: dict) -> None:
        for server, body in self._each_server(
            caller, "keys_claim", remote, self._ask(CLAIM_PATH, "one_time_keys"), out
        ):
            for user_id, devices in remote[server].items():
                claimed = _user_part(body.get("one_time_keys"), user_id)
                keys = {
                    d: k
                    for d, k in claimed.items()
                    if d in devices and isinstance(k, dict) and len(k) == 1
                }
                if keys:
                    out["one_time_keys"][user_id] = keys

    def _ask(self, path: str, field: str) -> Fetch:
        """POSTs `{field: users}` to a server's `path`; its answer must carry `field`."""

        def fetch(server: str, users: dict, deadline: OutboundDeadline) -> dict:
            body = self._client.post_json(
                server,
                path,
                {field: users},
                deadline=deadline,
                max_bytes=KEYS_MAX_BYTES,
                target_health=self._cooldown,
            )
            if not isinstance(body, dict) or not isinstance(body.get(field), dict):
                raise MalformedResponse(server, f"{path} answer has no {field}")
            return body

        return fetch

    # --- the admitted call ------------------------------------------------------------------

    def _each_server(
        self, caller: Caller, call: str, remote: dict[str, dict], fetch: Fetch, out: dict
    ) -> list[tuple[str, dict]]:
        """[(server, answer)] of the servers that answered; the others go to failures."""
        if not remote:
            return []
        answers: dict[str, Any] = {}
        with admitted(self._budget, caller):
            deadline = self._client.deadline(KEYS_DEADLINE_SECONDS, what=f"{call}")
            pool = Pool(MAX_PARALLEL_SERVERS)
            try:
                for server in remote:
                    # Blocks while the pool is full: a place frees within the deadline.
                    pool.spawn(self._one, call, server, remote[server], fetch, deadline, answers)
                pool.join(timeout=deadline.remaining() + 1.0)
            finally:
                pool.kill(block=True, timeout=1.0)
        answered = []
        for server in remote:
            result = answers.get(server)
            if isinstance(result, dict) and "answer" in result:
                answered.append((server, result["answer"]))
            else:
                out["failures"][server] = result or failure(DeadlineExceeded(0, 0, server), server)
        return answered

    def _one(
        self,
        call: str,
        server: str,
        users: dict,
        fetch: Fetch,
        deadline: OutboundDeadline,
        answers: dict,
    ) -> None:
        try:
            known = self._client.discovery.known_targets(server)
            if known:
                self._cooldown.refuse_if_all_cooling(server, known)
            with deadline:
                answer = fetch(server, users, deadline)
        except (FederationError, DeadlineExceeded) as e:
            count_failure(self._metrics, call, e)
            if not isinstance(e, DestinationUnreachable):  # to_client_error logs those
                log.info("%s on %s failed: %s", call, server, e)
            answers[server] = failure(e, server)
            return
        self._metrics.outbound_calls.labels(call, "ok").inc()
        answers[server] = {"answer": answer}


def _user_part(section: object, user_id: str) -> dict:
    value = section.get(user_id) if isinstance(section, dict) else None
    return value if isinstance(value, dict) else {}


def _merge_query(body: dict, asked: dict, out: dict) -> None:
    """Takes from a server's answer only what was asked of it, about its own users, and
    only keys that say they are what they are filed under."""
    for user_id, wanted in asked.items():
        if user_id in body["device_keys"]:
            out["device_keys"][user_id] = {
                d: keys
                for d, keys in _user_part(body["device_keys"], user_id).items()
                if isinstance(keys, dict)
                and keys.get("user_id") == user_id
                and keys.get("device_id") == d
                and (not wanted or d in wanted)
            }
        for key_type in ("master", "self_signing"):
            key = _user_part(body.get(f"{key_type}_keys"), user_id)
            if key.get("user_id") == user_id:
                out[f"{key_type}_keys"][user_id] = key
