"""Reading a server's /metrics in tests: budgets' in-flight counts, pool occupancy, counters."""

from __future__ import annotations

import time

import gevent
import requests
from prometheus_client.parser import text_string_to_metric_families


def read_metrics(base_url: str) -> dict[tuple, float]:
    """{(sample name, frozenset of label items): value} from GET /metrics."""
    r = requests.get(base_url + "/metrics", timeout=10)
    r.raise_for_status()
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def metric(base_url: str, name: str, **labels) -> float:
    return read_metrics(base_url).get((name, frozenset(labels.items())), 0.0)


def in_flight(base_url: str, budget: str) -> float:
    return metric(base_url, "weir_budget_in_flight", budget=budget)


def wait_for_metric(
    base_url: str, name: str, value: float, timeout: float = 5.0, **labels
) -> float:
    """Seconds until the metric read `value`; fails after `timeout`. The server offers no
    event to wait on across the process boundary, so this re-reads /metrics."""
    started = time.monotonic()
    with gevent.Timeout(timeout, AssertionError(f"{name}{labels} never reached {value}")):
        while metric(base_url, name, **labels) != value:
            gevent.sleep(0.02)
    return time.monotonic() - started
