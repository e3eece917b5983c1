"""Property tests: no interleaving of acquires, releases and exceptions
breaks the caps or leaks a slot."""

import gevent
import gevent.event
from greenlet import GreenletExit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from budget import InFlightBudget

KEYS = st.sampled_from(["a", "b", "c", "d", "e"])
CAPS = st.integers(min_value=1, max_value=6)
PER_KEY_CAPS = st.none() | st.integers(min_value=1, max_value=3)

# Exits from inside ``with slot``: normal, Exception, and the BaseExceptions
# gevent uses to interrupt a greenlet.
EXITS = {
    "normal": None,
    "exception": ValueError,
    "timeout": gevent.Timeout,
    "greenlet_exit": GreenletExit,
}

# Hypothesis' own per-example deadline would be flaky on a loaded machine.
SETTINGS = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])


class BudgetMachine(RuleBasedStateMachine):
    """One greenlet, a model of the counts, and every kind of exit."""

    held = Bundle("held")

    @initialize(global_cap=CAPS, per_key_cap=PER_KEY_CAPS)
    def make(self, global_cap, per_key_cap):
        self.budget = InFlightBudget(global_cap, per_key_cap, name="model")
        self.model = {}  # key -> count held
        self.attempts = 0
        self.refused = 0
        self.granted = []  # every slot handed out, released or not

    def _room(self, key):
        total = sum(self.model.values())
        cap = self.budget.per_key_cap
        return total < self.budget.global_cap and (cap is None or self.model.get(key, 0) < cap)

    @rule(target=held, key=KEYS)
    def acquire(self, key):
        expected = self._room(key)
        self.attempts += 1
        slot = self.budget.try_acquire(key)
        assert (slot is not None) == expected
        if slot is None:
            self.refused += 1
            return None  # goes into the bundle; release rules skip it
        self.model[key] = self.model.get(key, 0) + 1
        self.granted.append(slot)
        assert len(self.granted) == self.attempts - self.refused
        return slot

    def _released(self, slot, was_released):
        # A second release must change nothing: the invariant checks that.
        if was_released:
            return
        self.model[slot.key] -= 1
        if not self.model[slot.key]:
            del self.model[slot.key]

    @rule(slot=consumes(held))
    def release(self, slot):
        if slot is not None:
            was = slot.released
            slot.release()
            self._released(slot, was)

    @rule(slot=consumes(held), how=st.sampled_from(sorted(EXITS)))
    def leave_with(self, slot, how):
        if slot is None:
            return
        exc = EXITS[how]
        was = slot.released
        try:
            with slot:
                if exc is not None:
                    raise exc()
        except BaseException as e:  # noqa: B036 - we raised it ourselves
            assert type(e) is exc
        assert slot.released
        self._released(slot, was)

    @rule(key=KEYS, how=st.sampled_from(sorted(EXITS)))
    def acquire_and_leave(self, key, how):
        slot = self.acquire(key)
        if slot is not None:
            self.leave_with(slot, how)

    @rule(slot=held)
    def release_twice(self, slot):
        # Not consumed: the slot stays in the bundle, already released.
        if slot is not None:
            was = slot.released
            slot.release()
            slot.release()
            self._released(slot, was)

    @invariant()
    def counts_match_the_model(self):
        b = self.budget
        total = sum(self.model.values())
        assert b.in_flight == total <= b.global_cap
        for key in "abcde":
            n = b.in_flight_for(key)
            assert n == self.model.get(key, 0)
            assert b.per_key_cap is None or n <= b.per_key_cap
        snap = b.snapshot()
        assert snap["keys"] == len(self.model)
        assert snap["refusals"] == b.refusals == self.refused

    def teardown(self):
        if not hasattr(self, "budget"):
            return
        # Whatever is still held goes back; nothing is left behind.
        assert self.budget.in_flight == sum(s is not None and not s.released for s in self.granted)
        for slot in self.granted:
            slot.release()
        assert self.budget.in_flight == 0
        assert self.budget.snapshot()["keys"] == 0


BudgetMachine.TestCase.settings = settings(SETTINGS, max_examples=100, stateful_step_count=40)
TestBudgetMachine = BudgetMachine.TestCase


# --- many greenlets --------------------------------------------------------

greenlet_script = st.tuples(
    st.lists(KEYS, min_size=1, max_size=4),  # keys to acquire, nested
    st.lists(st.integers(0, 3), min_size=4, max_size=4),  # yields after each acquire
    st.sampled_from(sorted(EXITS) + ["killed"]),  # how it leaves
)


@SETTINGS
@given(
    global_cap=CAPS,
    per_key_cap=PER_KEY_CAPS,
    scripts=st.lists(greenlet_script, min_size=1, max_size=25),
)
def test_interleaved_greenlets_never_exceed_caps_and_leak_nothing(global_cap, per_key_cap, scripts):
    b = InFlightBudget(global_cap, per_key_cap, name="interleaved")
    violations = []
    attempts = [0]
    refused = [0]
    arrived = [0]
    all_arrived = gevent.event.Event()
    go = gevent.event.Event()
    never = gevent.event.Event()

    def check():
        if b.in_flight > global_cap:
            violations.append(("global", b.in_flight))
        for key in "abcde":
            if per_key_cap is not None and b.in_flight_for(key) > per_key_cap:
                violations.append((key, b.in_flight_for(key)))

    def run(keys, yields, how):
        slots = []
        try:
            # Take slots one after another, yielding so that greenlets
            # interleave their acquisitions in every order hypothesis picks.
            for key, n in zip(keys, yields):
                attempts[0] += 1
                slot = b.try_acquire(key)
                if slot is None:
                    refused[0] += 1
                else:
                    slots.append(slot)
                check()
                for _ in range(n):
                    gevent.sleep(0)
            arrived[0] += 1
            if arrived[0] == len(scripts):
                all_arrived.set()
            go.wait()
            # Leave through nested ``with`` blocks, all of them.
            try:
                _leave(slots, how)
            except (ValueError, gevent.Timeout) as e:
                assert type(e) is EXITS[how]
        finally:
            check()

    def _leave(slots, how):
        if slots:
            with slots[0]:
                _leave(slots[1:], how)
            return
        gevent.sleep(0)
        if how == "killed":
            never.wait()
        elif EXITS[how] is not None:
            raise EXITS[how]()

    greenlets = [gevent.spawn(run, *script) for script in scripts]
    assert all_arrived.wait(10)
    # Everybody holds what they got: exactly the granted ones are in flight.
    assert b.in_flight == attempts[0] - refused[0]
    assert b.refusals == refused[0]
    go.set()
    victims = [g for g, s in zip(greenlets, scripts) if s[2] == "killed"]
    others = [g for g, s in zip(greenlets, scripts) if s[2] != "killed"]
    gevent.joinall(others, timeout=10)
    gevent.killall(victims, block=True, timeout=10)
    assert all(g.dead for g in greenlets)
    assert not violations
    assert b.in_flight == 0
    assert b.snapshot()["keys"] == 0
