"""One event that wakes many more parked syncs than the main pool has places: every one of
them answers 200 with the event, none waits out its place (503), and no place is kept."""

import time

import gevent
import pytest
import requests

from tests.rooms.conftest import V3, create_room, send
from tests.support.server import MatrixClient
from tests.sync.conftest import event_ids, metric, sync, timeline

POOL = 8
PARKED = 60
ROUNDS = 3


@pytest.fixture(scope="module")
def weir(tmp_path_factory):
    from tests.support.server import WeirProcess, base_settings, merge

    directory = tmp_path_factory.mktemp("wake_storm")
    settings = merge(
        base_settings(str(directory / "data")),
        {"server": {"http": {"main_pool_size": POOL}}},
    )
    proc = WeirProcess(str(directory), settings).start()
    yield proc
    proc.stop()


def pool_metric(weir, name: str) -> float:
    text = requests.get(weir.url("/metrics"), timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith(f'{name}{{pool="main"}}'))
    return float(line.split()[1])


def test_one_event_wakes_more_parked_syncs_than_there_are_places(weir):
    owner = MatrixClient(weir.client_url)
    owner.register("storm_owner")
    room_id = create_room(owner, preset="public_chat")
    members = []
    for i in range(PARKED):
        member = MatrixClient(weir.client_url)
        member.register(f"storm{i}")
        assert member.post(f"{V3}/join/{room_id}", json={}).status_code == 200
        members.append(member)
    # Tokens taken after every join: nothing is new for anyone until the event. Syncs that
    # leave presence alone: one member coming online would wake the others.
    tokens = [(m, sync(m, set_presence="offline")["next_batch"]) for m in members]

    answers: list = []

    def park(member, since):
        # As a client does: parks again with the new token as soon as it has an answer.
        for _ in range(ROUNDS):
            params = {"since": since, "timeout": 60000, "set_presence": "offline"}
            r = member.get(f"{V3}/sync", params=params, timeout=90)
            answers.append((r.status_code, r.json(), time.monotonic()))
            if r.status_code != 200:
                return
            since = r.json()["next_batch"]

    def all_parked():
        deadline = time.monotonic() + 30
        while metric(weir, "weir_sync_waiters") < PARKED:
            assert time.monotonic() < deadline, "the syncs did not all park"
            gevent.sleep(0.05)

    parked = [gevent.spawn(park, m, since) for m, since in tokens]
    sent = []
    for i in range(ROUNDS):
        all_parked()
        sent.append((send(owner, room_id, f"wake up {i}"), time.monotonic()))
        gevent.sleep(0.2)  # some answered, some still waiting: the next event lands on both
    gevent.joinall(parked, timeout=60, raise_error=True)

    assert [status for status, _, _ in answers] == [200] * (PARKED * ROUNDS)
    seen = [e for _, body, _ in answers for e in event_ids(timeline(body, room_id))]
    for event_id, _ in sent:
        assert seen.count(event_id) == PARKED
    assert pool_metric(weir, "weir_pool_wait_timeouts_total") == 0
    assert pool_metric(weir, "weir_pool_waiting") == 0
    assert metric(weir, "weir_sync_waiters") == 0
    slowest = max(at for _, _, at in answers) - sent[-1][1]
    print(f"{PARKED} syncs x {ROUNDS} events; the last answered {slowest * 1000:.0f} ms after it")
