"""Prometheus metrics, one registry per runtime (no process-global state).

Gauges and counters that mirror live objects (budgets, rate limiters, pools, cool-downs)
are read at scrape time by a collector, so they can never drift from the thing they
describe. Events (deadline expiries, cache hits) are counters the code increments where
they happen. docs/operations.md says what each one means to an operator.

What registers here: every budget (`track_budget`: client_outbound, key_resolution,
media_fetch), every rate limiter (`track_rate_limiter`), every pool (`track_pool`: main,
federation, media), every thread pool's queue (`track_threadpool`, `track_queue`:
password_hashing, thumbnails, database_read, database_write), the address cool-down, waiting
syncs, remote fetches, the process itself (CPU, memory, open file descriptors against the
limit), and the federation worker shards' liveness (federation/shards.py).
"""

from __future__ import annotations

import ipaddress
from typing import Callable, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from budget import InFlightBudget, QueuedBudget, RateLimiter

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _LiveCollector:
    def __init__(self):
        self.budgets: list[InFlightBudget | QueuedBudget] = []
        self.rate_limiters: list[tuple[str, RateLimiter]] = []
        self.pools: list[tuple[str, Callable[[], int], int]] = []
        self.threadpools: list[tuple[str, Callable[[], int], int]] = []
        self.pool_waits: list[tuple[str, object]] = []
        self.gauges: list[tuple[str, str, Callable[[], float]]] = []
        self.labelled: list[tuple[str, str, str, Callable[[], Mapping[str, float]]]] = []
        self.counters: list[tuple[str, str, Callable[[], float]]] = []

    def collect(self):
        in_flight = GaugeMetricFamily("weir_budget_in_flight", "Slots taken now", labels=["budget"])
        capacity = GaugeMetricFamily(
            "weir_budget_capacity", "Global cap of the budget", labels=["budget"]
        )
        refusals = CounterMetricFamily(
            "weir_budget_refusals", "Requests refused by the budget", labels=["budget"]
        )
        queued = GaugeMetricFamily(
            "weir_budget_queued", "Slots queued for their client's turn", labels=["budget"]
        )
        for budget in self.budgets:
            snap = budget.snapshot()
            in_flight.add_metric([snap["name"]], snap["in_flight"])
            capacity.add_metric([snap["name"]], snap["global_cap"])
            refusals.add_metric([snap["name"]], snap["refusals"])
            if "queued" in snap:
                queued.add_metric([snap["name"]], snap["queued"])
        yield from (in_flight, capacity, refusals, queued)

        limited = CounterMetricFamily(
            "weir_rate_limit_refusals", "Requests refused by a rate limiter", labels=["limiter"]
        )
        for name, limiter in self.rate_limiters:
            limited.add_metric([name], limiter.refusals)
        yield limited

        occupancy = GaugeMetricFamily(
            "weir_pool_greenlets", "Greenlets running in the pool", labels=["pool"]
        )
        size = GaugeMetricFamily("weir_pool_size", "Greenlets the pool may run", labels=["pool"])
        for name, count, limit in self.pools:
            occupancy.add_metric([name], count())
            size.add_metric([name], limit)
        yield from (occupancy, size)

        queued = GaugeMetricFamily(
            "weir_threadpool_queued", "Greenlets waiting for a thread of the pool", labels=["pool"]
        )
        threads = GaugeMetricFamily(
            "weir_threadpool_threads", "Threads the pool may run", labels=["pool"]
        )
        for name, waiting, limit in self.threadpools:
            queued.add_metric([name], waiting())
            threads.add_metric([name], limit)
        yield from (queued, threads)

        yield from self._pool_waits()
        for name, doc, read in self.gauges:
            yield GaugeMetricFamily(name, doc, value=read())
        for name, doc, label, read_all in self.labelled:
            family = GaugeMetricFamily(name, doc, labels=[label])
            for value_of, value in read_all().items():
                family.add_metric([value_of], value)
            yield family
        for name, doc, read in self.counters:
            yield CounterMetricFamily(name, doc, value=read())

    def _pool_waits(self):
        # Requests ready to run that wait for a place in a full work pool (http/places.py).
        families = (
            (GaugeMetricFamily, "weir_pool_waiting", "Requests waiting for a place now", "waiting"),
            (CounterMetricFamily, "weir_pool_waits", "Requests that found the pool full", "waits"),
            (
                CounterMetricFamily,
                "weir_pool_wait_seconds",
                "Seconds requests spent waiting for a place",
                "waited_seconds",
            ),
            (
                CounterMetricFamily,
                "weir_pool_wait_timeouts",
                "Requests refused with 503 after waiting for a place",
                "timeouts",
            ),
        )
        for kind, name, doc, attribute in families:
            family = kind(name, doc, labels=["pool"])
            for pool, places in self.pool_waits:
                family.add_metric([pool], getattr(places, attribute))
            yield family


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self._live = _LiveCollector()
        self.registry.register(self._live)
        # CPU, memory, and open file descriptors against the limit (`ulimit -n`): every open
        # connection is one.
        ProcessCollector(registry=self.registry)
        self.deadline_expiries = Counter(
            "weir_outbound_deadline_expiries",
            "Outbound calls that ran out of their deadline",
            ["call"],
            registry=self.registry,
        )
        self.outbound_calls = Counter(
            "weir_outbound_calls",
            "Client-triggered outbound calls by outcome",
            ["call", "outcome"],
            registry=self.registry,
        )
        self.cache_hits = Counter(
            "weir_cache_hits",
            "Answers served from a cache without an outbound call",
            ["cache"],
            registry=self.registry,
        )
        self.cache_misses = Counter(
            "weir_cache_misses",
            "Lookups a cache could not answer",
            ["cache"],
            registry=self.registry,
        )
        self.coalesced = Counter(
            "weir_coalesced_waits",
            "Requests that waited on an identical call in flight",
            ["call"],
            registry=self.registry,
        )
        self._federation_figures()
        self.inbound_edu_items = self._inbound_edu_items()
        # A woken sync answers from the events that woke it, or computes its whole answer
        # (homeserver/sync/woken.py says when).
        self.sync_wakes = Counter(
            "weir_sync_wakes",
            "Woken syncs, by where their answer came from (recent_events, database)",
            ["answered_from"],
            registry=self.registry,
        )
        # A sliding sync's room list: its connection's kept list brought up to date, or
        # read whole (homeserver/sync/sliding_lists.py says when).
        self.sliding_lists = Counter(
            "weir_sliding_sync_lists",
            "Sliding sync room lists made, by how (kept, whole)",
            ["made_from"],
            registry=self.registry,
        )
        self._hub_figures()

    def _hub_figures(self) -> None:
        """What held the hub: collections, and how late it woke a timer."""
        # Every cyclic collection, timed (core/collector.py, watch_pauses): it holds the hub.
        self.gc_pauses = Histogram(
            "weir_gc_pause_seconds",
            "Cyclic garbage collections, by generation, and how long each held the hub",
            ["generation"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
            registry=self.registry,
        )
        # How late the hub woke a 10 ms timer (core/hub_lateness.py): each ready socket
        # waited as long.
        self.hub_lateness = Histogram(
            "weir_hub_lateness_seconds",
            "How late the hub woke a timer asked for every 10 ms: the time it was held",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
            registry=self.registry,
        )

    def _federation_figures(self) -> None:
        """The federation sender's outcomes, address cool-downs and remote joins."""
        self.federation_transactions = Counter(
            "weir_federation_transactions",
            "Outbound federation transactions by outcome (success, failure, refused)",
            ["outcome"],
            registry=self.registry,
        )
        self.federation_edus_dropped = Counter(
            "weir_federation_edus_dropped",
            "Durable EDUs (to-device, device list updates) dropped: past a destination's"
            " backlog (federation.sender.max_queued_edus), or refused too often",
            ["edu_type", "reason"],
            registry=self.registry,
        )
        self.cooldown_refusals = Counter(
            "weir_cooldown_refusals",
            "Calls refused at once because the address is cooling down",
            registry=self.registry,
        )
        # A remote join from make_join to the room stored, by outcome: a big room's state
        # and its key fetches are what make it slow.
        self.send_join_duration = Histogram(
            "weir_send_join_duration_seconds",
            "Remote joins: make_join, send_join and checking the room's state",
            ["outcome"],
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=self.registry,
        )

    def _inbound_edu_items(self) -> Counter:
        # Typing changes and receipts of other servers' users, each accepted or dropped
        # (homeserver/sync/edus.py says why one is dropped; its log line says which).
        return Counter(
            "weir_inbound_edu_items",
            "Typing changes and read receipts received from other servers, by outcome",
            ["edu_type", "outcome"],
            registry=self.registry,
        )

    def track_budget(self, budget: InFlightBudget | QueuedBudget) -> None:
        self._live.budgets.append(budget)

    def track_rate_limiter(self, name: str, limiter: RateLimiter) -> None:
        self._live.rate_limiters.append((name, limiter))

    def track_pool(self, name: str, pool, size: int) -> None:
        self._live.pools.append((name, pool.__len__, size))

    def track_pool_waits(self, name: str, places) -> None:
        """Waits for a place in a work pool (homeserver/http/places.py: WorkPlaces)."""
        self._live.pool_waits.append((name, places))

    def track_threadpool(self, name: str, pool) -> None:
        """A CountedThreadPool (homeserver/core/threads.py)."""
        self.track_queue(name, lambda: pool.queued, pool.maxsize)

    def track_queue(self, name: str, waiting: Callable[[], int], threads: int) -> None:
        """Work that waits for one of `threads` native threads (or connections on them)."""
        self._live.threadpools.append((name, waiting, threads))

    def track_gauge(self, name: str, doc: str, read: Callable[[], float]) -> None:
        self._live.gauges.append((name, doc, read))

    def track_gauges(
        self, name: str, doc: str, label: str, read: Callable[[], Mapping[str, float]]
    ) -> None:
        """Gauges of one name, one per `label` value that `read` gives."""
        self._live.labelled.append((name, doc, label, read))

    def track_counter(self, name: str, doc: str, read: Callable[[], float]) -> None:
        """A count kept by a live object that only rises; exposed as `<name>_total`."""
        self._live.counters.append((name, doc, read))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def scrape_allowed(client_key: str, networks) -> bool:
    """Whether a client key (an IPv4 address or an IPv6 /64) lies in one of `networks`."""
    try:
        client = ipaddress.ip_network(client_key, strict=False)
    except ValueError:
        return False
    return any(client.version == net.version and client.subnet_of(net) for net in networks)
