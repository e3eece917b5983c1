"""RateLimiter: token buckets per key, with an injected clock."""

import gevent
import pytest
from gevent.threadpool import ThreadPool
from hypothesis import example, given, settings
from hypothesis import strategies as st

from budget import Decision, RateLimiter


class FakeClock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


def test_allows_a_burst_of_max_requests_then_refuses():
    clock = FakeClock()
    r = RateLimiter(3, 1.0, clock=clock)
    assert [r.check("k") for _ in range(3)] == [Decision(True, 0)] * 3
    d = r.check("k")
    assert d == Decision(False, 334)  # one token per 1/3 s, rounded up
    assert not d and not d.allowed
    assert r.check("other").allowed  # keys are independent


def test_decision_is_a_named_tuple_whose_truth_is_allowed():
    allowed, retry = Decision(False, 5)
    assert (allowed, retry) == (False, 5)
    assert bool(Decision(True, 0)) and not Decision(False, 1)
    with pytest.raises(AttributeError):
        Decision(True, 0).allowed = False


def test_retry_after_is_exact_when_the_caller_waits_that_long():
    clock = FakeClock()
    r = RateLimiter(30, 60, clock=clock)  # key_resolution_per_ip_rate default
    for _ in range(30):
        assert r.check("ip").allowed
    d = r.check("ip")
    assert d == Decision(False, 2000)
    clock.advance(1.999)
    assert r.check("ip") == Decision(False, 1)
    clock.advance(0.001)
    assert r.check("ip").allowed
    assert r.check("ip") == Decision(False, 2000)


def test_refills_continuously_up_to_capacity():
    clock = FakeClock()
    r = RateLimiter(2, 10, clock=clock)
    assert r.check("k") and r.check("k") and not r.check("k")
    clock.advance(5)  # one token back
    assert r.check("k") and not r.check("k")
    clock.advance(1000)  # long idle: full again, but never more than 2
    assert r.check("k") and r.check("k") and not r.check("k")


def test_refused_checks_do_not_consume():
    clock = FakeClock()
    r = RateLimiter(1, 1, clock=clock)
    assert r.check("k")
    for _ in range(10):
        assert r.check("k") == Decision(False, 1000)
    assert r.refusals == 10  # each refused check counts once, for metrics
    clock.advance(1)
    assert r.check("k")
    assert r.refusals == 10


def test_peek_does_not_consume():
    clock = FakeClock()
    r = RateLimiter(2, 1, clock=clock)
    for _ in range(5):
        assert r.peek("k") == Decision(True, 0)
    assert r.tracked_keys == 0  # peeking at a new key stores nothing
    assert r.check("k") and r.check("k")
    assert r.peek("k") == Decision(False, 500)
    assert r.peek("k") == r.check("k")
    assert r.refusals == 1  # the check counted; the peeks did not
    clock.advance(0.5)
    assert r.peek("k").allowed and r.peek("k").allowed
    assert r.check("k") and not r.check("k")


def test_an_empty_limiter_is_truthy():
    assert RateLimiter(1, 1)


def test_full_buckets_are_forgotten():
    clock = FakeClock()
    r = RateLimiter(5, 10, clock=clock)
    for i in range(100):
        r.check(f"k{i}")
    assert r.tracked_keys == 100
    clock.advance(10)  # every bucket is full again
    r.check("new")
    assert r.tracked_keys == 1


def test_flood_of_a_million_distinct_keys_stays_bounded():
    clock = FakeClock()
    r = RateLimiter(2, 60, clock=clock, max_keys=100)
    check = r.check
    refused = 0
    for block in range(1000):
        clock.advance(0.001)
        for i in range(block * 1000, block * 1000 + 1000):
            if not check(i).allowed:  # a new key is never refused
                refused += 1
        assert r.tracked_keys <= 100
    assert refused == 0
    assert r.tracked_keys == 100
    assert len(r._full_at) == 100  # the storage itself, not just the counter


def test_eviction_prefers_full_buckets_then_least_recently_used():
    clock = FakeClock(0.0)
    r = RateLimiter(1, 10, clock=clock, max_keys=3)
    r.check("a")  # full again at t=10
    clock.advance(5)
    r.check("b")  # full again at t=15
    r.check("c")
    clock.advance(5)
    # "a" is full, so it is the one dropped: "b" and "c" keep their state.
    assert r.check("d").allowed
    assert r.tracked_keys == 3
    assert not r.peek("b").allowed and not r.peek("c").allowed
    # Now all three are refilling. A new key evicts the least recently used
    # ("b"), which errs toward allowing: "b" starts again with a full bucket.
    assert r.check("e").allowed
    assert r.tracked_keys == 3
    assert r.peek("b").allowed
    assert not r.peek("c").allowed


@settings(deadline=None, max_examples=200)
@given(
    max_requests=st.integers(1, 50),
    per_seconds=st.floats(0.01, 3600),
    steps=st.lists(st.floats(0, 10), max_size=60),
)
def test_never_more_than_the_bucket_allows(max_requests, per_seconds, steps):
    """Over any window, allowed <= max_requests + rate * window."""
    clock = FakeClock(0.0)
    r = RateLimiter(max_requests, per_seconds, clock=clock)
    allowed_at = []
    for dt in steps:
        clock.advance(dt)
        d = r.check("k")
        if d.allowed:
            assert d.retry_after_ms == 0
            allowed_at.append(clock.now)
        else:
            assert d.retry_after_ms >= 1
    rate = max_requests / per_seconds
    for i in range(len(allowed_at)):
        for j in range(i, len(allowed_at)):
            window = allowed_at[j] - allowed_at[i]
            assert j - i + 1 <= max_requests + rate * window + 1e-6


@settings(deadline=None, max_examples=300)
@given(
    max_requests=st.integers(1, 50), per_seconds=st.floats(0.01, 3600), spent=st.integers(1, 100)
)
@example(max_requests=25, per_seconds=1.00001, spent=26)  # 40.0004 ms must not round to 40
def test_waiting_retry_after_ms_is_always_enough(max_requests, per_seconds, spent):
    clock = FakeClock(0.0)
    r = RateLimiter(max_requests, per_seconds, clock=clock)
    d = None
    for _ in range(spent):
        d = r.check("k")
    if d.allowed:
        return
    clock.advance(d.retry_after_ms / 1000)
    assert r.check("k").allowed
    # ...and not much more than needed: one millisecond earlier was too soon,
    # unless the wait was under a millisecond (it is rounded up to 1).
    if d.retry_after_ms > 1:
        clock2 = FakeClock(0.0)
        r2 = RateLimiter(max_requests, per_seconds, clock=clock2)
        for _ in range(spent):
            r2.check("k")
        clock2.advance((d.retry_after_ms - 1) / 1000)
        assert not r2.check("k").allowed


@pytest.mark.parametrize(
    "args",
    [(0, 1), (-1, 1), (1.5, 1), (1, 0), (1, -1), (1, float("inf")), (1, float("nan"))],
)
def test_arguments_are_validated(args):
    with pytest.raises(ValueError):
        RateLimiter(*args)


def test_max_keys_is_validated():
    with pytest.raises(ValueError):
        RateLimiter(1, 1, max_keys=0)


def test_thread_safety_smoke():
    """Real threads and greenlets spend one bucket: exactly max_requests pass."""
    r = RateLimiter(5000, 3600)  # real clock; refill is negligible over the test
    pool = ThreadPool(4)
    counts = []

    def spend(n):
        counts.append(sum(r.check("shared").allowed for _ in range(n)))

    try:
        jobs = [pool.spawn(spend, 2000) for _ in range(4)]
        jobs += [gevent.spawn(spend, 2000) for _ in range(2)]
        gevent.joinall(jobs, raise_error=True)
    finally:
        pool.kill()
    # 12,000 tries at a 5,000 bucket; the refill over the test's duration
    # (5000/3600 per second) could add a few tokens at most.
    assert 5000 <= sum(counts) <= 5000 + 50
