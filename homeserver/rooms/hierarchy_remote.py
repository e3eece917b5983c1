"""Rooms of a space that live on other servers, asked for over federation (`GET
/_matrix/federation/v1/hierarchy/{roomId}`) while a client walks the space (rooms/
hierarchy.py).

A client's walk is a client-triggered outbound call (ADR-0079; docs/architecture.md,
"Budgets"): the first remote room takes one `client_outbound_budget` slot for the rest of the
request, and every remote question draws from one 10 s total deadline. A peer that never
answers costs the slot and that deadline; the rooms we could reach are still returned, and so
is everything local when the budget is full (no 429 for a walk that needs no peer).
"""

from __future__ import annotations

import contextlib
import copy
import time
from typing import Any
from urllib.parse import quote

import gevent
import gevent.pool

from budget import DeadlineExceeded, InFlightBudget
from homeserver.core.caching import TtlCache
from homeserver.core.errors import MatrixError
from homeserver.federation.admission import (
    DIRECTORY_DEADLINE_SECONDS,
    Caller,
    admitted,
    count_failure,
)
from homeserver.federation.client import FederationClient
from homeserver.federation.cooldown import AddressCooldown
from homeserver.federation.errors import FederationError, MalformedResponse
from homeserver.metrics import Metrics

HIERARCHY_PATH = "/_matrix/federation/v1/hierarchy/"
# A space's answer is its summary and its children's: small objects, but many of them.
HIERARCHY_MAX_BYTES = 4 * 1024 * 1024
# Servers tried for one room: a child naming many dead servers must not use the whole
# deadline on itself before its siblings are asked.
MAX_VIAS_PER_ROOM = 3
# Siblings asked at once: a silent server then holds the deadline beside its siblings'
# questions, not ahead of them. They share the walk's one slot and deadline.
ASKED_AT_ONCE = 5
# Paging walks the space again for every page: remote answers are kept briefly, so the
# next pages ask no peer again.
ANSWER_CACHE_SECONDS = 30.0
ANSWER_CACHE_ENTRIES = 1024


def _summary_of(entry: Any) -> dict | None:
    """A remote room summary in the spec's shape, or None."""
    if not isinstance(entry, dict) or not isinstance(entry.get("room_id"), str):
        return None
    if not isinstance(entry.get("num_joined_members"), int):
        return None
    children = entry.get("children_state", [])
    if not isinstance(children, list):
        return None
    entry["children_state"] = [
        c
        for c in children
        if isinstance(c, dict)
        and c.get("type") == "m.space.child"
        and isinstance(c.get("state_key"), str)
        and isinstance(c.get("content"), dict)
    ]
    return entry


def _answer_of(server: str, room_id: str, body: Any) -> dict[str, dict]:
    """room id -> summary, of the room asked for and of the children the answer names."""
    room = _summary_of(body.get("room")) if isinstance(body, dict) else None
    if room is None or room["room_id"] != room_id:
        raise MalformedResponse(server, "hierarchy answer has no summary of the room")
    found = {room_id: room}
    children = body.get("children", [])
    for child in children if isinstance(children, list) else []:
        summary = _summary_of(child)
        if summary is not None:
            found.setdefault(summary["room_id"], summary)
    return found


class RemoteHierarchy:
    def __init__(
        self,
        client: FederationClient,
        budget: InFlightBudget,
        cooldown: AddressCooldown,
        metrics: Metrics,
        server_name: str,
    ):
        self._client = client
        self._budget = budget
        self._cooldown = cooldown
        self._metrics = metrics
        self._server_name = server_name
        self._cache = TtlCache(time.monotonic, ANSWER_CACHE_ENTRIES)

    def asker(self, caller: Caller, suggested_only: bool) -> RemoteAsker:
        return RemoteAsker(self, caller, suggested_only)


class RemoteAsker:
    """The remote questions of one client walk: one slot, one deadline, taken at the first
    question. Use as a context manager: leaving it frees the slot."""

    def __init__(self, remote: RemoteHierarchy, caller: Caller, suggested_only: bool):
        self._remote = remote
        self._caller = caller
        self._suggested_only = suggested_only
        self._stack = contextlib.ExitStack()
        self._deadline: Any = None
        self._unavailable = False
        self._answers: dict[str, dict] = {}
        self._failed: set[str] = set()

    def __enter__(self) -> RemoteAsker:
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _admit(self) -> bool:
        if self._deadline is None and not self._unavailable:
            try:
                self._stack.enter_context(admitted(self._remote._budget, self._caller))
            except MatrixError:
                self._remote._metrics.outbound_calls.labels("hierarchy", "refused").inc()
                self._unavailable = True
                return False
            self._deadline = self._remote._client.deadline(
                DIRECTORY_DEADLINE_SECONDS, what="space hierarchy"
            )
        return not self._unavailable and not self._deadline.expired

    def summary(self, room_id: str, via: list[str]) -> dict | None:
        """What the servers in `via` say of `room_id`, or None if none could say in time."""
        if room_id in self._answers or room_id in self._failed:
            return copy.deepcopy(self._answers.get(room_id))
        cached = self._remote._cache.get((room_id, self._suggested_only))
        if cached is not None:
            self._answers.update(cached)
            return copy.deepcopy(cached[room_id])
        servers = [s for s in dict.fromkeys(via) if s != self._remote._server_name]
        for server in servers[:MAX_VIAS_PER_ROOM]:
            if not self._admit():
                return None
            try:
                with self._deadline:
                    body = self._remote._client.get_json(
                        server,
                        HIERARCHY_PATH + quote(room_id, safe=""),
                        {"suggested_only": "true" if self._suggested_only else "false"},
                        deadline=self._deadline,
                        max_bytes=HIERARCHY_MAX_BYTES,
                        target_health=self._remote._cooldown,
                    )
                answers = _answer_of(server, room_id, body)
            except (FederationError, DeadlineExceeded, MatrixError) as e:
                count_failure(self._remote._metrics, "hierarchy", e)
                continue
            self._remote._metrics.outbound_calls.labels("hierarchy", "ok").inc()
            self._remote._cache.put((room_id, self._suggested_only), answers, ANSWER_CACHE_SECONDS)
            for known_id, summary in answers.items():
                self._answers.setdefault(known_id, summary)
            return copy.deepcopy(self._answers[room_id])
        self._failed.add(room_id)
        return None

    def prefetch(self, rooms: list[tuple[str, list[str]]]) -> None:
        """Asks for sibling rooms at once; `summary` then reads their answers."""
        wanted = [(r, v) for r, v in rooms if r not in self._answers and r not in self._failed]
        if len(wanted) < 2 or not self._admit():
            return
        pool = gevent.pool.Pool(ASKED_AT_ONCE)
        jobs = [pool.spawn(self.summary, room_id, via) for room_id, via in wanted]
        try:
            # Each question ends at the deadline; the margin only covers its conversion.
            gevent.joinall(jobs, timeout=self._deadline.remaining() + 1)
        finally:
            gevent.killall([job for job in jobs if not job.ready()])
