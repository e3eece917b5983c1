"""The keyring: other servers' signing keys, fetched, verified, cached and budgeted.

Lookup order (docs/architecture.md, "Budgets"): the database cache, then the origin's own
``/_matrix/key/v2/server``, then the configured ``trusted_key_servers`` (notaries, via
``POST /_matrix/key/v2/query``). Every key document must carry a valid self-signature, and a
notary's answer also the notary's signature.

Every network fetch is admitted first by ``key_resolution_budget`` (in flight, whole process)
and by ``key_resolution_rate`` (per source IP: the address of the inbound request that needs
the key). A refusal is ``KeyResolutionRefused``, which the inbound request turns into 429 so
the sender retries. Concurrent resolutions of one server share one fetch: only the request
that starts it takes a slot; the others wait for it within their own deadline.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Iterable

import gevent
from canonicaljson import encode_canonical_json
from gevent.event import AsyncResult
from signedjson.key import get_verify_key
from signedjson.sign import sign_json

from budget import (
    DeadlineExceeded,
    InFlightBudget,
    OutboundDeadline,
    RateLimiter,
    split_budget,
)
from homeserver.config import Config, FederationSecurityConfig, TrustedKeyServer
from homeserver.core.errors import invalid_param
from homeserver.core.identifiers import is_valid_server_name
from homeserver.federation.errors import (
    FederationError,
    InvalidSignature,
    KeyResolutionRefused,
    MalformedResponse,
)
from homeserver.federation.key_documents import (
    check_self_signed,
    current_verify_keys,
    expired_keys,
    verify_with_keys,
)
from homeserver.federation.signing import decode_verify_key, verify_signature
from homeserver.federation.signing_key import key_id as own_key_id
from homeserver.federation.signing_key import own_key_document
from homeserver.logs import with_request_context
from homeserver.metrics import Metrics
from homeserver.storage.keys import ServerKeyStore, StoredKey

log = logging.getLogger(__name__)

# One network resolution (direct, then notaries) takes at most this, and never more than
# federation.remote_timeout.
KEY_FETCH_SECONDS = 10.0
# A key document is a few hundred bytes; a notary's answer for one server a few KiB.
KEY_RESPONSE_MAX_BYTES = 1024 * 1024
# Spec (room versions 5+): a key is never trusted for more than 7 days past its fetch.
MAX_KEY_VALIDITY_MS = 7 * 24 * 3600 * 1000
# Retry-After for a fetch refused because the budget is full: fetches end within seconds.
BUDGET_REFUSAL_RETRY_MS = 1000
# Servers one notary query may ask about: each may cost a network fetch. A join asks
# another notary for as many at once (`prefetch`), each allowed this much of its answer.
MAX_NOTARY_QUERY_SERVERS = 100
NOTARY_BYTES_PER_SERVER = 64 * 1024
# A server none of whose key documents could be fetched is not asked again for this long.
# Without it, a transaction naming more unreachable servers than a shard's share of the
# budget would be refused on every retry (each fetch holds a slot until it times out, and
# finds nothing to cache); with it, the retry completes and drops their PDUs.
UNREACHABLE_RETRY_SECONDS = 30.0
_UNREACHABLE_MAX_ENTRIES = 10_000
# A server's stored keys are read once for this long: a big room's state is thousands of
# events signed with one key, and a database read for each was a quarter of a join. A key
# the memo lacks is looked for in the database again before any fetch.
STORED_KEYS_MEMO_SECONDS = 2.0


def shard_key_resolution_budget(config: Config, shards: int) -> FederationSecurityConfig:
    """``security.federation`` for one of ``shards`` processes sharing the budget (worker
    shards times ``cluster.instances``: homeserver/runtime/infrastructure.py): the in-flight
    limit and the per-IP rate's ``max_requests`` divided (rounded down, at least 1), the
    rest as is (adr/key-resolution-shards.md)."""
    sec = config.security.federation
    in_flight, max_requests = split_budget(
        sec.key_resolution_max_in_flight, sec.key_resolution_per_ip_rate.max_requests, shards
    )
    rate = dataclasses.replace(sec.key_resolution_per_ip_rate, max_requests=max_requests)
    return dataclasses.replace(
        sec, key_resolution_max_in_flight=in_flight, key_resolution_per_ip_rate=rate
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


class Keyring:
    def __init__(
        self,
        server_name: str,
        signing_key,
        store: ServerKeyStore,
        client,
        budget: InFlightBudget,
        rate: RateLimiter,
        trusted_key_servers: Iterable[TrustedKeyServer] = (),
        remote_timeout: float = KEY_FETCH_SECONDS,
        metrics: Metrics | None = None,
    ):
        self.server_name = server_name
        self.signing_key = signing_key
        self.store = store
        self.client = client
        self.budget = budget
        self.rate = rate
        self.trusted_key_servers = tuple(trusted_key_servers)
        self.fetch_seconds = min(KEY_FETCH_SECONDS, remote_timeout)
        self._own_key_id = own_key_id(signing_key)
        self._own_verify_key = get_verify_key(signing_key)
        self._fetches: dict[str, AsyncResult] = {}
        self._budgeted_fetchers: set = set()  # greenlets fetching under a budget slot
        self._unreachable: dict[str, float] = {}  # server -> monotonic time to ask again
        self._stored: dict[str, tuple[float, dict]] = {}  # server -> (until, stored keys)
        self.network_fetches = 0  # fetches started (a counter for tests and metrics)
        self._metrics = metrics or Metrics()

    # -- looking keys up -------------------------------------------------------------------

    def resolve(
        self,
        server_name: str,
        key_ids: Iterable[str],
        minimum_valid_until_ts: int,
        source_ip: str | None,
        *,
        deadline: OutboundDeadline | None = None,
    ) -> dict:
        """``{key_id: VerifyKey}`` for those of ``key_ids`` that ``server_name`` says are
        valid at ``minimum_valid_until_ts``; the others are absent.

        Goes to the network only for a key the cache does not know or knows only with an
        older validity (a key the server itself listed as expired is not fetched again).
        ``source_ip`` is the inbound request's client key, for the per-IP rate (None for
        our own work: the in-flight budget still applies). Raises ``KeyResolutionRefused``,
        or ``DeadlineExceeded`` if ``deadline`` ran out while waiting.
        """
        key_ids = list(dict.fromkeys(key_ids))
        if server_name == self.server_name:
            return {k: self._own_verify_key for k in key_ids if k == self._own_key_id}
        found, missing = self._usable(
            self._stored_keys(server_name), key_ids, minimum_valid_until_ts
        )
        if missing:
            found, missing = self._usable(
                self._stored_keys(server_name, fresh=True), key_ids, minimum_valid_until_ts
            )
        (self._metrics.cache_misses if missing else self._metrics.cache_hits).labels(
            "server_keys"
        ).inc()
        if missing:
            self._fetch_once(server_name, missing, minimum_valid_until_ts, source_ip, deadline)
            found, _ = self._usable(
                self._stored_keys(server_name, fresh=True), key_ids, minimum_valid_until_ts
            )
        return found

    def _stored_keys(self, server_name: str, fresh: bool = False) -> dict:
        now = time.monotonic()
        memo = self._stored.get(server_name)
        if memo is not None and not fresh and now < memo[0]:
            return memo[1]
        keys = self.store.get_keys(server_name)
        if len(self._stored) >= _UNREACHABLE_MAX_ENTRIES:
            self._stored.clear()
        self._stored[server_name] = (now + STORED_KEYS_MEMO_SECONDS, keys)
        return keys

    def verify_json(
        self,
        obj: dict,
        server_name: str,
        source_ip: str | None,
        *,
        at_ts: int | None = None,
        deadline: OutboundDeadline | None = None,
    ) -> str:
        """Checks that ``obj`` is signed by ``server_name`` with a key valid at ``at_ts``
        (default: now). Returns the key id that verified. Raises ``InvalidSignature`` or
        ``KeyResolutionRefused``."""
        keys = self.signing_keys(obj, server_name, source_ip, at_ts=at_ts, deadline=deadline)
        verify_with_keys(obj, server_name, keys)
        return next(iter(keys))

    def signing_keys(
        self,
        obj: dict,
        server_name: str,
        source_ip: str | None,
        *,
        at_ts: int | None = None,
        deadline: OutboundDeadline | None = None,
    ) -> dict:
        """``verify_json``'s first half: the keys of ``server_name``'s signatures on ``obj``
        valid at ``at_ts``, each of which must verify (``verify_with_keys``, which needs no
        hub and may run on a native thread). Raises ``InvalidSignature`` when there are
        none, or ``KeyResolutionRefused``."""
        signatures = obj.get("signatures") if isinstance(obj, dict) else None
        ours = signatures.get(server_name) if isinstance(signatures, dict) else None
        if not isinstance(ours, dict) or not ours:
            raise InvalidSignature(f"not signed by {server_name}")
        key_ids = [k for k in ours if isinstance(k, str) and k.startswith("ed25519:")]
        if not key_ids:
            raise InvalidSignature(f"no ed25519 signature by {server_name}")
        keys = self.resolve(
            server_name,
            key_ids,
            _now_ms() if at_ts is None else at_ts,
            source_ip,
            deadline=deadline,
        )
        if not keys:
            raise InvalidSignature(f"no valid key of {server_name} among {sorted(key_ids)}")
        return keys

    @staticmethod
    def _usable(stored: dict[str, StoredKey], key_ids: list[str], min_ts: int):
        found, missing = {}, []
        for kid in key_ids:
            key = stored.get(kid)
            if key is not None and key.valid_until_ts >= min_ts:
                try:
                    found[kid] = decode_verify_key(kid, key.verify_key)
                except Exception:  # a key we cannot use is as good as none
                    log.warning("unusable stored key %s", kid)
            elif key is None or key.expired_ts is None:
                missing.append(kid)
        return found, missing

    # -- notary ----------------------------------------------------------------------------

    def key_documents(
        self, queries: dict[str, tuple[list[str], int]], source_ip: str | None
    ) -> list[dict]:
        """The notary's answer: for each server, its latest key document as its origin
        signed it, with our signature added. ``queries`` maps a server name to
        ``(key_ids, minimum_valid_until_ts)`` (no key ids: any); a document not valid until
        then, or lacking a wanted key, is fetched first. Servers that cannot be reached are
        left out; a fetch refused by the budget refuses the whole query."""
        if len(queries) > MAX_NOTARY_QUERY_SERVERS:
            raise invalid_param(f"at most {MAX_NOTARY_QUERY_SERVERS} servers per query")
        jobs = [
            gevent.spawn(
                with_request_context(self._notarised_or_refused),
                server,
                key_ids,
                min_ts,
                source_ip,
            )
            for server, (key_ids, min_ts) in queries.items()
        ]
        try:
            gevent.joinall(jobs)
        finally:
            gevent.killall([j for j in jobs if not j.ready()])
        for job in jobs:
            if isinstance(job.value, KeyResolutionRefused):
                raise job.value
        return [job.value for job in jobs if job.successful() and isinstance(job.value, dict)]

    def _notarised_or_refused(
        self, server_name: str, key_ids: list[str], min_ts: int, source_ip: str | None
    ) -> dict | KeyResolutionRefused | None:
        # A refusal is returned, not raised: gevent prints a traceback for every greenlet
        # that dies of an exception, and a notary over its rate is no bug.
        try:
            return self._notarised_document(server_name, key_ids, min_ts, source_ip)
        except KeyResolutionRefused as e:
            return e

    def _notarised_document(
        self, server_name: str, key_ids: list[str], min_ts: int, source_ip: str | None
    ) -> dict | None:
        if server_name == self.server_name:
            return own_key_document(self.server_name, self.signing_key)
        if not is_valid_server_name(server_name):
            return None  # left out like an unreachable server, before a slot is spent on it
        document = self.store.get_document(server_name)
        if document is None or not self._covers(document, key_ids, min_ts):
            self._fetch_once(server_name, list(key_ids) or ["*"], min_ts, source_ip, None)
            document = self.store.get_document(server_name)
        if document is None:
            return None
        return sign_json(json.loads(document.key_json), self.server_name, self.signing_key)

    @staticmethod
    def _covers(document, key_ids, min_ts: int) -> bool:
        if document.valid_until_ts < min_ts:
            return False
        doc = json.loads(document.key_json)
        known = set(doc.get("verify_keys", {})) | set(doc.get("old_verify_keys", {}))
        return all(k in known for k in key_ids)

    # -- many servers at once -------------------------------------------------------------

    def prefetch(
        self, wanted: dict[str, set[str]], min_ts: int, deadline: OutboundDeadline
    ) -> set[str]:
        """Fetches through the notaries, `MAX_NOTARY_QUERY_SERVERS` servers a query, the
        keys of those in `wanted` ({server: key_ids}) not stored valid at `min_ts`: a big
        room's state names hundreds of servers, and one query for a hundred beats a hundred
        fetches. Each query holds a key-budget slot, waiting for one within `deadline`.
        What the notaries lack is left to each lookup's own fetch. Returns the servers whose
        keys came."""
        notaries = [n for n in self.trusted_key_servers if n.server_name != self.server_name]
        missing: dict[str, list[str]] = {}
        for server, key_ids in wanted.items():
            if notaries and server != self.server_name:
                stored = self._stored_keys(server, fresh=True)
                lacking = self._usable(stored, sorted(key_ids), min_ts)[1]
                if lacking:
                    missing[server] = lacking
        came: set[str] = set()
        for notary in notaries:
            servers = sorted(missing.keys() - came)
            if not servers or deadline.expired:
                break
            jobs = [
                gevent.spawn(
                    with_request_context(self._notary_batch),
                    notary,
                    {s: missing[s] for s in servers[at : at + MAX_NOTARY_QUERY_SERVERS]},
                    min_ts,
                    deadline,
                )
                for at in range(0, len(servers), MAX_NOTARY_QUERY_SERVERS)
            ]
            try:
                gevent.joinall(jobs)
            finally:
                gevent.killall([j for j in jobs if not j.ready()])
            came.update(*(j.value for j in jobs if j.successful() and j.value))
        return came

    def _notary_batch(
        self,
        notary: TrustedKeyServer,
        wanted: dict[str, list[str]],
        min_ts: int,
        deadline: OutboundDeadline,
    ) -> set[str]:
        slot = self.budget.try_acquire(notary.server_name)
        while slot is None:
            if deadline.remaining() <= BUDGET_REFUSAL_RETRY_MS / 1000:
                return set()
            gevent.sleep(BUDGET_REFUSAL_RETRY_MS / 1000)
            slot = self.budget.try_acquire(notary.server_name)
        current = gevent.getcurrent()
        with slot:
            self._budgeted_fetchers.add(current)
            try:
                seconds = min(self.fetch_seconds, deadline.remaining())
                what = f"keys of {len(wanted)} servers from {notary.server_name}"
                return self._query_notary(notary, wanted, min_ts, OutboundDeadline(seconds, what))
            finally:
                self._budgeted_fetchers.discard(current)

    # -- fetching --------------------------------------------------------------------------

    def _fetch_once(
        self,
        server_name: str,
        key_ids: list[str],
        min_ts: int,
        source_ip: str | None,
        deadline: OutboundDeadline | None,
    ) -> None:
        """Starts a fetch of ``server_name``'s keys unless one is running, then waits for it
        (within ``deadline``, or the fetch's own time)."""
        pending = self._fetches.get(server_name)
        if pending is None:
            if self._unreachable.get(server_name, 0.0) > time.monotonic():
                return  # failed a moment ago: the caller finds no key, at no cost
            slot = self.budget.try_acquire(server_name)
            if slot is None:
                raise KeyResolutionRefused(
                    server_name, BUDGET_REFUSAL_RETRY_MS, "too many key fetches in flight"
                )
            if source_ip is not None:
                decision = self.rate.check(source_ip)
                if not decision.allowed:
                    slot.release()
                    raise KeyResolutionRefused(
                        server_name,
                        decision.retry_after_ms,
                        f"key fetch rate exceeded for {source_ip}",
                    )
            pending = self._fetches[server_name] = AsyncResult()
            self.network_fetches += 1
            # Its own greenlet: the fetch (and its slot) outlives a requester that hangs up,
            # and everyone waiting gets its result. It logs under the id of the request that
            # started it.
            gevent.spawn(
                with_request_context(self._run_fetch), server_name, key_ids, min_ts, slot, pending
            )
        else:
            self._metrics.coalesced.labels("key_fetch").inc()
        wait = deadline.remaining() if deadline is not None else self.fetch_seconds + 1
        pending.wait(wait)
        if deadline is not None:
            deadline.check()

    def in_budgeted_fetch(self) -> bool:
        """Is the calling greenlet a network fetch holding a key-resolution slot?
        (tests/federation/test_key_resolution_budget.py checks every key request is.)"""
        return gevent.getcurrent() in self._budgeted_fetchers

    def _run_fetch(self, server_name, key_ids, min_ts, slot, pending: AsyncResult) -> None:
        current = gevent.getcurrent()
        try:
            with slot:
                self._budgeted_fetchers.add(current)
                try:
                    self._fetch(server_name, key_ids, min_ts)
                finally:
                    self._budgeted_fetchers.discard(current)
        except Exception:
            log.exception("fetching the keys of %s failed", server_name)
        finally:
            if self._fetches.get(server_name) is pending:
                del self._fetches[server_name]
            pending.set(None)

    def _fetch(self, server_name: str, key_ids: list[str], min_ts: int) -> None:
        deadline = OutboundDeadline(self.fetch_seconds, what=f"keys of {server_name}")
        notaries = [n for n in self.trusted_key_servers if n.server_name != self.server_name]
        # With notaries to fall back on, the origin gets half the time: a silent origin must
        # not leave the notaries none.
        direct = OutboundDeadline(
            deadline.remaining() / 2 if notaries else deadline.remaining(),
            what=f"keys of {server_name} from itself",
        )
        fetched = self._fetch_direct(server_name, direct)
        if fetched and self._satisfied(server_name, key_ids, min_ts):
            return
        for notary in notaries:
            if deadline.expired:
                break
            if self._query_notary(notary, {server_name: key_ids}, min_ts, deadline):
                fetched = True
                if self._satisfied(server_name, key_ids, min_ts):
                    return
        if not fetched:
            self._remember_unreachable(server_name)

    def _remember_unreachable(self, server_name: str) -> None:
        now = time.monotonic()
        if len(self._unreachable) >= _UNREACHABLE_MAX_ENTRIES:
            self._unreachable = {s: t for s, t in self._unreachable.items() if t > now}
            if len(self._unreachable) >= _UNREACHABLE_MAX_ENTRIES:
                return  # all recent: forgetting none errs toward asking again
        self._unreachable[server_name] = now + UNREACHABLE_RETRY_SECONDS

    def _satisfied(self, server_name: str, key_ids: list[str], min_ts: int) -> bool:
        _, missing = self._usable(
            self.store.get_keys(server_name), [k for k in key_ids if k != "*"], min_ts
        )
        return not missing

    def _fetch_direct(self, server_name: str, deadline: OutboundDeadline) -> bool:
        try:
            document = self.client.get_json(
                server_name,
                "/_matrix/key/v2/server",
                deadline=deadline,
                max_bytes=KEY_RESPONSE_MAX_BYTES,
            )
            self._accept_document(server_name, document)
            return True
        except (FederationError, DeadlineExceeded, InvalidSignature) as e:
            self._count_expiry(e)
            log.info("keys of %s from itself: %s", server_name, e)
            return False

    def _query_notary(
        self,
        notary: TrustedKeyServer,
        wanted: dict[str, list[str]],
        min_ts: int,
        deadline: OutboundDeadline,
    ) -> set[str]:
        """Asks `notary` for the keys of every server in `wanted` ({server: key_ids}, "*"
        for any) in one query; stores each document it vouches for. Returns the servers
        whose document was accepted."""
        accepted: set[str] = set()
        try:
            notary_keys = self._notary_keys(notary, deadline)
            if not notary_keys:
                raise InvalidSignature(f"no verify key for notary {notary.server_name}")
            query = {
                server: {k: {"minimum_valid_until_ts": min_ts} for k in key_ids if k != "*"}
                for server, key_ids in wanted.items()
            }
            answer = self.client.post_json(
                notary.server_name,
                "/_matrix/key/v2/query",
                {"server_keys": query},
                deadline=deadline,
                max_bytes=KEY_RESPONSE_MAX_BYTES + NOTARY_BYTES_PER_SERVER * len(wanted),
            )
            documents = answer.get("server_keys") if isinstance(answer, dict) else None
            if not isinstance(documents, list):
                raise MalformedResponse(notary.server_name, "no server_keys list")
            for document in documents:
                server = document.get("server_name") if isinstance(document, dict) else None
                if server not in wanted:
                    continue
                try:
                    self._accept_document(server, document, notary.server_name, notary_keys)
                    accepted.add(server)
                except (InvalidSignature, MalformedResponse) as e:
                    log.warning("keys of %s from notary %s: %s", server, notary.server_name, e)
        except (FederationError, DeadlineExceeded, InvalidSignature) as e:
            self._count_expiry(e)
            log.info("keys of %s from notary %s: %s", sorted(wanted), notary.server_name, e)
        return accepted

    def _count_expiry(self, e: Exception) -> None:
        if isinstance(e, DeadlineExceeded):
            self._metrics.deadline_expiries.labels("key_fetch").inc()

    def _notary_keys(self, notary: TrustedKeyServer, deadline: OutboundDeadline) -> list:
        """The notary's verify keys: configured ones, else its own (cached or fetched)."""
        if notary.verify_keys:
            return [decode_verify_key(k, v) for k, v in notary.verify_keys.items()]
        now = _now_ms()
        stored = self.store.get_keys(notary.server_name)
        usable = [k for k in stored.values() if k.valid_until_ts >= now]
        if not usable:
            self._fetch_direct(notary.server_name, deadline)
            usable = [
                k
                for k in self.store.get_keys(notary.server_name).values()
                if k.valid_until_ts >= now
            ]
        return [decode_verify_key(k.key_id, k.verify_key) for k in usable]

    def _accept_document(
        self, server_name: str, document, notary: str | None = None, notary_keys: list | None = None
    ) -> None:
        """Verifies a key document (self-signature, and the notary's if any) and stores it."""
        if not isinstance(document, dict) or document.get("server_name") != server_name:
            raise MalformedResponse(server_name, "key document for another server")
        valid_until = document.get("valid_until_ts")
        verify_keys = document.get("verify_keys")
        old_keys = document.get("old_verify_keys") or {}
        if (
            not isinstance(valid_until, int)
            or not isinstance(verify_keys, dict)
            or not isinstance(old_keys, dict)
        ):
            raise MalformedResponse(server_name, "malformed key document")
        current = current_verify_keys(server_name, verify_keys)
        signatures = check_self_signed(document, server_name, current)
        if notary is not None:
            self._verify_by_any(document, notary, notary_keys or [])

        now = _now_ms()
        valid_until = min(valid_until, now + MAX_KEY_VALIDITY_MS)
        keys = [StoredKey(kid, verify_keys[kid]["key"], valid_until, None) for kid in current]
        keys += expired_keys(old_keys, current)
        # Served again by our notary endpoint: keep only the origin's own signatures.
        kept = dict(document, signatures={server_name: signatures})
        self.store.store_document(
            server_name, encode_canonical_json(kept).decode(), valid_until, keys, now
        )

    @staticmethod
    def _verify_by_any(document: dict, signer: str, keys: list) -> None:
        signatures = document.get("signatures", {}).get(signer, {})
        for key in keys:
            if f"{key.alg}:{key.version}" in signatures:
                verify_signature(document, signer, key)
                return
        raise InvalidSignature(f"not signed by notary {signer}")
