"""Cost of the admission checks on the request path: ``python -m budget.bench``.

Prints mean, p50 and p99 per operation in microseconds. Each operation is
timed on its own with ``perf_counter_ns``; the cost of the timer itself
(measured the same way around nothing) is subtracted. Each case runs a
short warm-up first. The garbage collector stays on, as in the server. A benchmark that
prints figures, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import statistics
import time
from typing import Iterable

from budget.clientkey import Network, client_key, parse_networks
from budget.inflight import InFlightBudget, Slot
from budget.ratelimit import RateLimiter

_now = time.perf_counter_ns


def _held(slot: Slot | None) -> Slot:
    # Outside the timed region: the caps here are set so that these acquires succeed.
    if slot is None:
        raise RuntimeError("bench budget refused an acquire it was sized for")
    return slot


def _timer_overhead(n: int) -> float:
    samples = []
    for _ in range(n):
        t0 = _now()
        t1 = _now()
        samples.append(t1 - t0)
    return statistics.median(samples)


def _report(label: str, samples_ns: list[int], overhead_ns: float) -> None:
    xs = sorted(max(0.0, s - overhead_ns) / 1000.0 for s in samples_ns)
    n = len(xs)
    mean = sum(xs) / n
    p50 = xs[n // 2]
    p99 = xs[min(n - 1, (n * 99) // 100)]
    print(f"  {label:<48} {mean:8.3f} {p50:8.3f} {p99:8.3f}   (n={n})")


def bench_budget_single_key(n: int) -> list[int]:
    b = InFlightBudget(1000, 1000, name="bench")
    out = []
    for _ in range(n):
        t0 = _now()
        slot = b.try_acquire("203.0.113.7")
        if slot is None:
            raise RuntimeError("bench budget refused an acquire it was sized for")
        slot.release()
        out.append(_now() - t0)
    return out


def bench_budget_thousand_keys(n: int) -> list[int]:
    # 1,000 clients each hold a slot; each measured acquire is a client's
    # second slot (the key exists; the count goes 1 -> 2 -> 1).
    keys = [f"198.51.{i // 256}.{i % 256}" for i in range(1000)]
    b = InFlightBudget(10_000, 8, name="bench")
    held = [_held(b.try_acquire(k)) for k in keys]
    out = []
    for i in range(n):
        k = keys[i % 1000]
        t0 = _now()
        slot = b.try_acquire(k)
        if slot is None:
            raise RuntimeError("bench budget refused an acquire it was sized for")
        slot.release()
        out.append(_now() - t0)
    for s in held:
        s.release()
    return out


def bench_budget_thousand_keys_fresh(n: int) -> list[int]:
    # Cycling over 1,000 keys none of which holds a slot: every acquire
    # inserts the key and every release deletes it.
    keys = [f"198.51.{i // 256}.{i % 256}" for i in range(1000)]
    b = InFlightBudget(10_000, 1, name="bench")
    out = []
    for i in range(n):
        k = keys[i % 1000]
        t0 = _now()
        slot = b.try_acquire(k)
        if slot is None:
            raise RuntimeError("bench budget refused an acquire it was sized for")
        slot.release()
        out.append(_now() - t0)
    return out


def bench_budget_refusal(n: int) -> list[int]:
    b = InFlightBudget(1, 1, name="bench")
    held = _held(b.try_acquire("x"))
    out = []
    for _ in range(n):
        t0 = _now()
        b.try_acquire("x")
        out.append(_now() - t0)
    held.release()
    return out


def bench_ratelimit(
    n: int, keys: int, max_requests: int = 30, per_seconds: float = 60
) -> list[int]:
    r = RateLimiter(max_requests, per_seconds)
    names = [
        f"10.{(i // 65536) % 256}.{(i // 256) % 256}.{i % 256}:{i // 2**24}" for i in range(keys)
    ]
    out = []
    for i in range(n):
        k = names[i % keys]
        t0 = _now()
        r.check(k)
        out.append(_now() - t0)
    return out


def bench_client_key(
    n: int, addrs: list[str], xff: str | None, trusted: Iterable[str | Network]
) -> list[int]:
    out = []
    m = len(addrs)
    for i in range(n):
        a = addrs[i % m]
        t0 = _now()
        client_key(a, xff, trusted)
        out.append(_now() - t0)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=200_000, help="iterations per case")
    args = p.parse_args(argv)
    n = args.n
    if n < 1:
        p.error("-n must be at least 1")

    overhead = _timer_overhead(n)
    print(f"budget bench: {n} iterations per case; timer overhead {overhead:.0f} ns subtracted")
    print(f"  {'case':<48} {'mean µs':>8} {'p50 µs':>8} {'p99 µs':>8}")

    trusted = parse_networks(["10.0.0.0/8", "2001:db8:ffff::/48"])
    v4_cold = [
        str(ipaddress.IPv4Address(0xC6336400 + i)) for i in range(10_000)
    ]  # 198.51.100.0 + i
    v6_cold = [
        str(ipaddress.IPv6Address((0x20010DB8 << 96) + (i << 64) + 1)) for i in range(10_000)
    ]

    cases = [
        ("InFlightBudget acquire+release, one key", bench_budget_single_key),
        ("InFlightBudget acquire+release, 1,000 keys held", bench_budget_thousand_keys),
        ("InFlightBudget acquire+release, 1,000 keys fresh", bench_budget_thousand_keys_fresh),
        ("InFlightBudget refused acquire", bench_budget_refusal),
        ("RateLimiter.check allowed, one key", lambda n: bench_ratelimit(n, 1, 10**9, 1)),
        ("RateLimiter.check refused, one key (30/60s)", lambda n: bench_ratelimit(n, 1)),
        ("RateLimiter.check allowed, 10,000 keys (30/60s)", lambda n: bench_ratelimit(n, 10_000)),
        ("RateLimiter.check, a new key every call", lambda n: bench_ratelimit(n, n)),
        (
            "client_key IPv4, no proxy, cached",
            lambda n: bench_client_key(n, ["203.0.113.7"], None, ()),
        ),
        (
            "client_key IPv4, no proxy, 10k addrs (uncached)",
            lambda n: bench_client_key(n, v4_cold, None, ()),
        ),
        (
            "client_key IPv6 /64, 10k addrs (uncached)",
            lambda n: bench_client_key(n, v6_cold, None, ()),
        ),
        (
            "client_key via 2 trusted proxies, cached",
            lambda n: bench_client_key(n, ["10.0.0.1"], "203.0.113.7, 10.1.2.3", trusted),
        ),
    ]
    for label, run in cases:
        run(max(1, n // 10))  # warm-up: caches, allocator, CPU frequency
        gc.collect()
        _report(label, run(n), overhead)


if __name__ == "__main__":
    main()
