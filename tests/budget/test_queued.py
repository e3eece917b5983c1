"""QueuedBudget: running places per key, a short FIFO per key behind them, a global cap."""

import gevent
import pytest

from budget import QueuedBudget


def test_a_key_runs_its_cap_then_queues_then_is_refused():
    budget = QueuedBudget(100, running_per_key=2, queued_per_key=3, name="media_fetch")
    tickets = [budget.try_enter("a") for _ in range(5)]
    assert [t.running for t in tickets] == [True, True, False, False, False]
    assert budget.try_enter("a") is None  # past its queue: refused at once
    assert (budget.running_for("a"), budget.queued_for("a"), budget.in_flight) == (2, 3, 5)
    assert budget.refusals == 1
    # Another key is not behind "a"'s queue.
    assert budget.try_enter("b").running


def test_the_global_cap_counts_running_and_queued():
    budget = QueuedBudget(4, running_per_key=1, queued_per_key=10)
    held = [budget.try_enter("a") for _ in range(3)] + [budget.try_enter("b")]
    assert all(held)
    assert budget.try_enter("c") is None
    assert budget.snapshot()["queued"] == 2


def test_turns_are_first_come_first_served_within_a_key():
    budget = QueuedBudget(10, running_per_key=1, queued_per_key=5)
    first = budget.try_enter("a")
    order = []

    def queued(name: str):
        with budget.try_enter("a") as ticket:
            ticket.wait()
            order.append(name)
            gevent.sleep(0)  # hold the place across a hub turn

    jobs = [gevent.spawn(queued, name) for name in "xyz"]
    gevent.sleep(0)
    assert order == [] and budget.queued_for("a") == 3
    first.release()
    gevent.joinall(jobs, raise_error=True)
    assert order == ["x", "y", "z"]
    assert budget.in_flight == 0 and budget.snapshot()["keys"] == 0


def test_a_ticket_that_gives_up_while_queued_leaves_its_place_to_the_next():
    budget = QueuedBudget(10, running_per_key=1, queued_per_key=5)
    running = budget.try_enter("a")
    impatient = budget.try_enter("a")
    patient = budget.try_enter("a")
    with pytest.raises(gevent.Timeout):
        with impatient, gevent.Timeout(0.01):
            impatient.wait()
    assert budget.queued_for("a") == 1
    running.release()
    running.release()  # idempotent: frees one place, once
    assert patient.running and budget.running_for("a") == 1
    patient.release()
    assert budget.in_flight == 0 and budget.queued == 0


def test_caps_are_validated():
    with pytest.raises(ValueError):
        QueuedBudget(0, 1, 1)
    with pytest.raises(ValueError):
        QueuedBudget(1, 1, -1)
    with pytest.raises(ValueError):
        QueuedBudget(1, 1.5, 1)
    assert QueuedBudget(1, 1, 0).try_enter("a").running
