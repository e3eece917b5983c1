import gevent
import pytest
from gevent.event import Event

from homeserver.core.concurrency import GatheredReads, SingleFlight, in_turns


def test_concurrent_callers_share_one_call():
    flight = SingleFlight()
    release = Event()
    calls = []

    def fetch():
        calls.append(1)
        release.wait()
        return "value"

    callers = [gevent.spawn(flight.run, "k", fetch) for _ in range(20)]
    gevent.sleep(0)  # every caller has reached run(); one leads, the rest wait
    assert flight.in_flight("k")
    release.set()
    gevent.joinall(callers, raise_error=True)
    assert [c.value for c in callers] == ["value"] * 20
    assert calls == [1]
    assert not flight.in_flight("k") and len(flight) == 0


def test_failure_is_shared_and_not_cached():
    flight = SingleFlight()
    release = Event()

    def failing():
        release.wait()
        raise ValueError("remote said no")

    callers = [gevent.spawn(flight.run, "k", failing) for _ in range(5)]
    gevent.sleep(0)
    release.set()
    gevent.joinall(callers)
    assert all(isinstance(c.exception, ValueError) for c in callers)
    assert flight.run("k", lambda: "fresh") == "fresh"


def test_waiters_take_over_when_the_leader_is_killed():
    flight = SingleFlight()
    first_started = Event()
    release = Event()
    leaders = []

    def fetch():
        leaders.append(gevent.getcurrent())
        first_started.set()
        release.wait()
        return len(leaders)

    leader = gevent.spawn(flight.run, "k", fetch)
    first_started.wait()
    waiters = [gevent.spawn(flight.run, "k", fetch) for _ in range(3)]
    gevent.sleep(0)
    leader.kill()  # e.g. its client hung up
    gevent.sleep(0)
    release.set()
    gevent.joinall(waiters, raise_error=True)
    # One waiter led the second attempt; the others shared its result.
    assert len(leaders) == 2 and leaders[1] in waiters
    assert [w.value for w in waiters] == [2, 2, 2]
    assert len(flight) == 0


def test_a_waiter_times_out_on_its_own_deadline_without_disturbing_the_call():
    flight = SingleFlight()
    release = Event()

    def fetch():
        release.wait()
        return "late"

    leader = gevent.spawn(flight.run, "k", fetch)
    gevent.sleep(0)
    with pytest.raises(gevent.Timeout):
        with gevent.Timeout(0.01):
            flight.run("k", fetch)
    release.set()
    assert leader.get() == "late"


def test_in_turns_lets_other_greenlets_run_between_turns():
    ran: list[int] = []
    seen = []
    gevent.spawn(ran.append, 1)
    for n in in_turns(range(10), 4):
        seen.append((n, len(ran)))
    # The other greenlet ran after the 4th item, not before it.
    assert seen[3] == (3, 0) and seen[4] == (4, 1)
    assert [n for n, _ in seen] == list(range(10))


def test_readers_woken_together_are_read_at_once_and_each_gets_its_own():
    batches = []

    def read_many(keys):
        batches.append(keys)
        return {k: k * 10 for k in keys}

    reads = GatheredReads(read_many, lambda k: -1)
    asked = [gevent.spawn(reads.get, k) for k in (1, 2, 2, 3)]
    gevent.joinall(asked, raise_error=True)
    assert [g.value for g in asked] == [10, 20, 20, 30]
    assert batches == [[1, 2, 3]] and reads.reads == 1
    assert reads.get(4) == 40 and batches[-1] == [4]  # the next wake-up is a read of its own


def test_a_failed_gathered_read_is_every_askers_and_a_stopped_leader_is_nobodys():
    def failing(keys):
        raise ValueError("down")

    reads = GatheredReads(failing, lambda k: -1)
    asked = [gevent.spawn(reads.get, k) for k in (1, 2)]
    gevent.joinall(asked)
    assert [type(g.exception) for g in asked] == [ValueError, ValueError]

    alone, reading = [], Event()

    def slow(keys):
        reading.set()
        gevent.sleep(30)

    reads = GatheredReads(slow, lambda k: alone.append(k) or k)
    leader, waiter = gevent.spawn(reads.get, 1), gevent.spawn(reads.get, 2)
    reading.wait(5)  # both asked, and the leader reads for both
    leader.kill()  # its client hung up
    assert waiter.get(timeout=5) == 2 and alone == [2]
