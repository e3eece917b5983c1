"""OutboundDeadline: one total deadline over every step of an outbound call."""

import os
import pickle
import socket
import time

import gevent
import gevent.event
import psutil
import pytest
import urllib3
from greenlet import GreenletExit

from budget import DeadlineExceeded, OutboundDeadline
from tests.peers.tarpit import Tarpit

# Precision tolerance for the one kind of timed assertion we make: a deadline
# fires at or after its target, and within this much of it.
TOLERANCE = 0.1


def never():
    """A step that waits forever (a peer that never answers)."""
    gevent.event.Event().wait()


def open_fds():
    return sorted(os.listdir("/proc/self/fd"))


def socket_fds():
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                fds.append(fd)
        except FileNotFoundError:  # the fd listing itself, closed meanwhile
            pass
    return sorted(fds)


def connections_to(port):
    return [c for c in psutil.Process().net_connections("tcp") if c.raddr and c.raddr.port == port]


# --- the clock, without timing ----------------------------------------------


def test_remaining_elapsed_and_step_timeout():
    d = OutboundDeadline(10, what="x")
    assert d.seconds == 10.0 and d.what == "x"
    assert 0 <= d.elapsed() < d.seconds
    assert 0 < d.remaining() <= 10
    assert not d.expired
    assert d.step_timeout(5) == 5
    assert d.step_timeout(None) <= 10
    assert 9 < d.step_timeout(30) <= 10  # capped by what is left
    d.check()


def test_the_clock_starts_at_construction_not_on_entry():
    d = OutboundDeadline(10)
    gevent.sleep(0.05)  # e.g. waiting for a media-pool place
    assert d.remaining() <= 9.95
    with d:
        assert d.step_timeout(60) <= 9.95


def test_expired_deadline():
    d = OutboundDeadline(0, what="nothing left")
    assert d.expired and d.remaining() == 0.0
    with pytest.raises(DeadlineExceeded):
        d.check()
    with pytest.raises(DeadlineExceeded):
        d.step_timeout(5)  # not 0, which a socket would read as non-blocking


def test_expired_on_entry_raises_at_once_and_skips_the_body():
    d = OutboundDeadline(0, what="late")
    ran = []
    with pytest.raises(DeadlineExceeded) as ei:
        with d:
            ran.append(1)
    assert not ran and ei.value.what == "late"
    assert not d._armed


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf")])
def test_seconds_are_validated(bad):
    with pytest.raises(ValueError):
        OutboundDeadline(bad)


def test_exception_message_fields_and_pickling():
    e = DeadlineExceeded(10.0, 10.013, "publicRooms from example.org")
    assert str(e) == "deadline of 10.0s exceeded after 10.01s (publicRooms from example.org)"
    assert str(DeadlineExceeded(0.5, 0.5)) == "deadline of 0.5s exceeded after 0.50s"
    assert isinstance(e, Exception)
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.seconds, e2.elapsed, e2.what, str(e2)) == (e.seconds, e.elapsed, e.what, str(e))


# --- firing and conversion ----------------------------------------------------


def test_fires_inside_with_as_deadline_exceeded():
    d = OutboundDeadline(0.05, what="step")
    with pytest.raises(DeadlineExceeded) as ei:
        with d:
            never()
    e = ei.value
    assert e.seconds == 0.05 and e.what == "step" and e.elapsed >= 0.05
    assert d.owns(e.__cause__)  # chained to the Timeout that fired
    assert not d._armed


def test_broad_except_exception_inside_cannot_swallow_it():
    d = OutboundDeadline(0.05)
    swallowed = []
    with pytest.raises(DeadlineExceeded):
        with d:
            try:
                never()
            except Exception as e:  # what sloppy step code does
                swallowed.append(e)
    assert not swallowed


def test_inner_shorter_deadline_fires_for_itself():
    outer = OutboundDeadline(30, what="outer")
    inner = OutboundDeadline(0.05, what="inner")
    after_inner = []
    with pytest.raises(DeadlineExceeded) as ei:
        with outer:
            try:
                with inner:
                    never()
            finally:
                after_inner.append(outer.remaining())
    assert ei.value.what == "inner"
    assert after_inner and after_inner[0] > 0
    assert not outer._armed and not inner._armed


def test_outer_shorter_deadline_passes_through_inner_and_is_converted_by_outer():
    outer = OutboundDeadline(0.05, what="outer")
    inner = OutboundDeadline(30, what="inner")
    seen_by_inner = []
    with pytest.raises(DeadlineExceeded) as ei:
        with outer:
            try:
                with inner:
                    never()
            except BaseException as e:
                seen_by_inner.append(e)
                raise
    assert ei.value.what == "outer"
    # What left the inner ``with`` was still the outer's raw Timeout.
    assert isinstance(seen_by_inner[0], gevent.Timeout)
    assert outer.owns(seen_by_inner[0]) and not inner.owns(seen_by_inner[0])


def test_foreign_gevent_timeout_propagates_unchanged():
    d = OutboundDeadline(30)
    foreign = gevent.Timeout(0.05)
    with pytest.raises(gevent.Timeout) as ei:
        with foreign:
            with d:
                never()
    assert ei.value is foreign
    assert not d._armed


def test_foreign_timeout_raised_by_hand_and_other_errors_propagate_unchanged():
    d = OutboundDeadline(30)
    t = gevent.Timeout()
    with pytest.raises(gevent.Timeout) as ei:
        with d:
            raise t
    assert ei.value is t
    with pytest.raises(KeyError):
        with d:
            raise KeyError("x")
    assert not d._armed


def test_greenlet_kill_inside_a_deadline_disarms_it():
    d = OutboundDeadline(30)
    entered = gevent.event.Event()

    def step():
        with d:
            entered.set()
            never()

    g = gevent.spawn(step)
    assert entered.wait(5)
    g.kill(block=True)
    assert isinstance(g.value, GreenletExit)
    assert not d._armed


# --- re-entry ----------------------------------------------------------------


def test_reentry_for_a_second_step_and_nesting_the_same_object():
    d = OutboundDeadline(0.2, what="two steps")
    with d:  # discovery
        gevent.sleep(0)
    assert not d._armed  # nothing left armed between steps
    with d:  # the request
        with d:  # some helper entering it again
            gevent.sleep(0)
    with pytest.raises(DeadlineExceeded) as ei:
        with d:
            with d:
                never()
    assert ei.value.what == "two steps"
    assert not d._armed
    with pytest.raises(DeadlineExceeded):
        with d:  # expired now: refused on entry
            pass


def test_a_finished_step_leaves_no_timer_that_fires_later():
    d = OutboundDeadline(0.05)
    with d:
        pass
    # Wait past the deadline on something that would be interrupted.
    assert not gevent.event.Event().wait(d.remaining() + 0.1)


def test_several_greenlets_of_one_request_share_a_deadline():
    d = OutboundDeadline(0.05, what="shared")

    def step():
        with d:
            never()

    gs = [gevent.spawn(step) for _ in range(3)]
    gevent.joinall(gs, timeout=10)
    assert all(isinstance(g.exception, DeadlineExceeded) for g in gs)
    assert not d._armed


def test_start_and_cancel_without_with():
    d = OutboundDeadline(30)
    d.start()
    assert d._armed
    d.cancel()
    d.cancel()  # harmless
    assert not d._armed


# --- real sockets ---------------------------------------------------------------


def test_deadline_around_a_real_urllib3_request_to_a_tarpit():
    socket.getaddrinfo("127.0.0.1", 80)  # warm gevent's resolver threadpool first
    fds_before, sockets_before = open_fds(), socket_fds()
    with Tarpit() as tarpit:
        pm = urllib3.PoolManager()
        t0 = time.monotonic()
        d = OutboundDeadline(0.5, what=f"GET {tarpit.url}")
        with pytest.raises(DeadlineExceeded) as ei:
            with d:
                pm.request(
                    "GET",
                    tarpit.url + "/_matrix/federation/v1/publicRooms",
                    retries=False,
                    timeout=d.step_timeout(5),
                )
        elapsed = time.monotonic() - t0
        assert 0.5 <= elapsed < 0.5 + TOLERANCE, elapsed
        assert ei.value.elapsed >= 0.5
        assert tarpit.accepted == 1 and tarpit.bytes_received > 0  # the request was sent
        pm.clear()
        # The client's socket is closed: the tarpit saw EOF...
        assert tarpit.wait_current(0, timeout=5)
        # ...and this process has no connection to the tarpit left.
        assert connections_to(tarpit.port) == []
    assert socket_fds() == sockets_before
    assert open_fds() == fds_before


def test_discovery_and_request_draw_from_one_deadline():
    with Tarpit() as tarpit:
        pm = urllib3.PoolManager()
        t0 = time.monotonic()
        d = OutboundDeadline(0.8, what="discovery then request")
        # Step one: a .well-known lookup with its own 0.3 s cap times out by
        # itself (the socket timeout), and discovery carries on.
        with d:
            with pytest.raises(urllib3.exceptions.ReadTimeoutError):
                pm.request(
                    "GET",
                    tarpit.url + "/.well-known/matrix/server",
                    retries=False,
                    timeout=d.step_timeout(0.3),
                )
        # Step two gets only what is left, and the deadline fires at the
        # total target, not 0.8 s after step two began.
        left = d.step_timeout(5)
        assert left <= 0.8 - 0.3
        with pytest.raises(DeadlineExceeded):
            with d:
                pm.request(
                    "GET",
                    tarpit.url + "/_matrix/federation/v1/query/directory",
                    retries=False,
                    timeout=d.step_timeout(5),
                )
        elapsed = time.monotonic() - t0
        assert 0.8 <= elapsed < 0.8 + TOLERANCE, elapsed
        assert tarpit.accepted == 2
        pm.clear()
        assert tarpit.wait_current(0, timeout=5)
        assert connections_to(tarpit.port) == []


def test_check_with_slack_names_the_deadline_a_moment_early():
    d = OutboundDeadline(0.2)
    d.check(0.1)  # 0.2 s left: more than the slack
    with pytest.raises(DeadlineExceeded):
        d.check(0.5)  # within the slack: the deadline is what ran out
