"""InFlightBudget: caps, release on every path, greenlets and OS threads."""

import sys
import threading

import gevent
import gevent.event
import gevent.queue
import pytest
from gevent import monkey
from gevent.threadpool import ThreadPool
from greenlet import GreenletExit

from budget import InFlightBudget, RateLimiter, Slot


def test_refuses_at_once_over_the_per_key_cap():
    b = InFlightBudget(global_cap=10, per_key_cap=1, name="t")
    slot = b.try_acquire("a")
    assert isinstance(slot, Slot) and slot.key == "a" and not slot.released
    assert b.try_acquire("a") is None
    other = b.try_acquire("b")
    assert other is not None
    assert b.in_flight == 2 and b.in_flight_for("a") == 1 and b.refusals == 1
    slot.release()
    other.release()
    assert b.try_acquire("a") is not None


def test_refuses_at_once_over_the_global_cap():
    b = InFlightBudget(2, None)
    held = [b.try_acquire("a"), b.try_acquire("a")]
    assert all(held)
    assert b.try_acquire("b") is None
    assert b.refusals == 1
    held[0].release()
    assert b.try_acquire("b") is not None


def test_no_per_key_cap_means_only_the_global_cap():
    b = InFlightBudget(5, None)
    slots = [b.try_acquire("same") for _ in range(5)]
    assert all(slots) and b.in_flight_for("same") == 5
    assert b.try_acquire("same") is None


def test_idle_keys_are_forgotten_and_snapshot_reports():
    b = InFlightBudget(3, 2, name="client_outbound_budget")
    s1, s2 = b.try_acquire("a"), b.try_acquire("b")
    assert b.snapshot() == {
        "name": "client_outbound_budget",
        "in_flight": 2,
        "global_cap": 3,
        "per_key_cap": 2,
        "keys": 2,
        "refusals": 0,
    }
    s1.release()
    s2.release()
    snap = b.snapshot()
    assert snap["in_flight"] == 0 and snap["keys"] == 0
    assert b.in_flight_for("a") == 0


def test_double_release_is_idempotent():
    b = InFlightBudget(2, 2)
    s1, s2 = b.try_acquire("a"), b.try_acquire("a")
    s1.release()
    s1.release()
    with s1:
        pass
    assert s1.released and not s2.released
    assert b.in_flight == 1 and b.in_flight_for("a") == 1
    s2.release()
    assert b.in_flight == 0


@pytest.mark.parametrize(
    "exc",
    [ValueError("boom"), gevent.Timeout(), GreenletExit(), KeyboardInterrupt()],
    ids=["Exception", "gevent.Timeout", "GreenletExit", "KeyboardInterrupt"],
)
def test_with_releases_on_every_exit_path(exc):
    b = InFlightBudget(1, 1)
    slot = b.try_acquire("k")
    with pytest.raises(type(exc)):
        with slot:
            raise exc
    assert slot.released and b.in_flight == 0 and b.snapshot()["keys"] == 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, "3", True])
def test_caps_are_validated(bad):
    with pytest.raises(ValueError):
        InFlightBudget(bad, None)
    with pytest.raises(ValueError):
        InFlightBudget(1, bad)


def test_thousand_greenlets_some_killed_some_timed_out():
    """Hammer one budget; a third of the holders are killed mid-slot, a
    third time out mid-slot (a real gevent.Timeout through the ``with``)."""
    b = InFlightBudget(global_cap=50, per_key_cap=3, name="hammer")
    never = gevent.event.Event()  # a peer that never answers
    to_kill = gevent.queue.Queue()
    violations = []
    timed_out = []

    def killer():
        for g in to_kill:
            g.kill(block=True)

    def worker(i):
        key = f"client-{i % 40}"
        for _ in range(5):
            slot = b.try_acquire(key)
            if slot is None:
                gevent.sleep(0)
                continue
            if b.in_flight > 50 or b.in_flight_for(key) > 3:
                violations.append((b.in_flight, key, b.in_flight_for(key)))
            if i % 3 == 0:
                with slot:
                    to_kill.put(gevent.getcurrent())
                    never.wait()
            elif i % 3 == 1:
                try:
                    with gevent.Timeout(0.001):
                        with slot:
                            never.wait()
                except gevent.Timeout:
                    timed_out.append(i)
            else:
                with slot:
                    gevent.sleep(0)

    k = gevent.spawn(killer)
    greenlets = [gevent.spawn(worker, i) for i in range(1000)]
    gevent.joinall(greenlets)
    to_kill.put(StopIteration)
    k.join()
    killed = [g for g in greenlets if isinstance(g.value, GreenletExit)]
    assert killed and timed_out
    assert all(g.successful() for g in greenlets)
    assert not violations
    assert b.in_flight == 0
    assert b.snapshot()["keys"] == 0


def test_greenlets_killed_before_and_while_holding():
    b = InFlightBudget(1000, None)
    inside = gevent.event.Event()
    entered = []

    def holder(i):
        with b.try_acquire(f"k{i}"):
            entered.append(i)
            if len(entered) == 500:
                inside.set()
            gevent.event.Event().wait()

    gs = [gevent.spawn(holder, i) for i in range(1000)]
    assert inside.wait(10)
    assert b.in_flight >= 500
    gevent.killall(gs, block=True)  # some mid-slot, some never started
    assert b.in_flight == 0 and b.snapshot()["keys"] == 0


def test_release_from_a_real_os_thread():
    b = InFlightBudget(10, 2)
    slots = [b.try_acquire(f"k{i % 5}") for i in range(10)]
    assert all(slots)
    pool = gevent.get_hub().threadpool
    for s in slots:
        pool.apply(s.release)
    # Releasing again, from a thread and from the hub, changes nothing.
    pool.apply(slots[0].release)
    slots[1].release()
    assert b.in_flight == 0 and b.snapshot()["keys"] == 0
    assert all(s.released for s in slots)


def test_the_lock_is_the_os_lock_not_the_patched_one():
    # A monkey-patched threading.Lock taken from a native thread can block
    # the hub for good (the race test below would hang, not fail).
    native = monkey.get_original("_thread", "allocate_lock")
    patched = threading.Lock
    assert patched is not native  # conftest patched everything
    b = InFlightBudget(1, None)
    assert type(b._lock) is type(native()) is not type(patched())
    assert type(RateLimiter(1, 1)._lock) is type(native())


def test_os_threads_race_on_one_budget():
    """Native threads contend on the lock (the GIL switches between them)."""
    b = InFlightBudget(4, 2)
    pool = ThreadPool(4)
    errors = []
    # Switch threads far more often than every 5 ms, so that a missing or
    # wrong lock shows up as lost updates within a few thousand iterations.
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def churn(n):
        for i in range(n):
            slot = b.try_acquire(f"k{i % 3}")
            if slot is None:
                continue
            snap = b.snapshot()
            if not (0 < snap["in_flight"] <= 4):
                errors.append(snap)
            slot.release()
            slot.release()

    try:
        results = [pool.spawn(churn, 5_000) for _ in range(4)]
        # Bounded, so a thread stuck on the lock fails the test. (A patched
        # gevent lock blocks the hub itself instead: see the test above.)
        gevent.joinall(results, timeout=30, raise_error=True)
        assert all(r.ready() for r in results), "threads stuck on the budget's lock"
    finally:
        sys.setswitchinterval(old_interval)
        pool.kill()
    assert not errors
    assert b.in_flight == 0 and b.snapshot()["keys"] == 0


def test_slots_acquired_in_threads_released_in_greenlets():
    b = InFlightBudget(100, None)
    pool = gevent.get_hub().threadpool
    slots = [pool.apply(b.try_acquire, (f"k{i}",)) for i in range(50)]
    assert b.in_flight == 50
    gevent.joinall([gevent.spawn(s.release) for s in slots])
    assert b.in_flight == 0
