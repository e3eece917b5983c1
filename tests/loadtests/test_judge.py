"""The load test's judge, on figures made up to sit on either side of each limit."""

import json

from loadtests.judge import percentile, phase_figures, refusals_in_log, summarize
from loadtests.scenario import (
    ATTACK,
    DEADLINE,
    LOCAL,
    REFUSED,
    REMOTE,
    Sample,
    attack_outcome,
    attacker_address,
)

PEERS = {
    "tarpit": {"accepted": 40, "max_concurrent": 16},
    "silent_combined": {"current": 0, "max_concurrent": 16},
}
CAPS = {"client_outbound": 16, "key_resolution": 16}
POOL = {"size": 32, "max_greenlets": 20}


def local(t, ms, failed=False, name="GET /versions"):
    return Sample(t, LOCAL, name, 0 if failed else 200, ms, failed, "")


def attack(t, ms, kind=REFUSED):
    return Sample(t, ATTACK, "attack: publicRooms at tarpit", 429, ms, False, kind)


def access_line(t: str, status: int, ms: float, client: str) -> str:
    return json.dumps(
        {
            "ts": t,
            "level": "INFO",
            "logger": "weir.access",
            "request_id": "ab",
            "message": f"GET /_matrix/client/v3/publicRooms?server=x {status} {ms}ms {client}",
        }
    )


def run(baseline_ms, attack_ms, refusal_ms=(1.0, 2.0), failed=False, peers=PEERS, after=None):
    baseline = [local(1000 + i, ms) for i, ms in enumerate(baseline_ms)]
    attack_local = [local(2000 + i, ms, failed and i == 0) for i, ms in enumerate(attack_ms)]
    attacks = [attack(2000.5, 9.0)]
    log = [
        access_line("1970-01-01T00:33:21.000Z", 429, ms, attacker_address(3)) for ms in refusal_ms
    ]  # 2001 s: inside the attack window
    return summarize(
        {"baseline": baseline, "attack_local": attack_local, "attack": attacks},
        log,
        peers,
        CAPS,
        after or {"client_outbound": 0, "key_resolution": 0},
        POOL,
    )


def test_percentiles_are_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) is None


def test_a_run_within_every_limit_passes_in_the_issue_shape():
    summary = run([5.0] * 100, [6.0] * 100)
    assert summary["verdict"]["passed"], summary["verdict"]
    assert summary["phases"]["baseline"]["local"] == {
        "requests": 100,
        "failures": 0,
        "p50_ms": 5.0,
        "p99_ms": 5.0,
    }
    refusals = summary["phases"]["attack"]["refusals"]
    assert (refusals["count"], refusals["p99_ms"]) == (2, 2.0)
    assert refusals["seen_by_attackers"]["count"] == 1
    assert summary["tarpit"] == {"accepted": 40, "max_concurrent": 16}
    # media_fetch arrives with remote media: reported as absent, not as a made-up zero.
    assert summary["budgets_after"] == {
        "client_outbound": 0,
        "media_fetch": None,
        "key_resolution": 0,
    }
    assert all({"rule", "value", "limit", "ok"} == set(r) for r in summary["verdict"]["rules"])


def test_each_limit_fails_the_run():
    slow = run([5.0] * 100, [5.0] * 98 + [40.0, 40.0])  # limit 1.5 * 5 + 20 = 27.5
    assert not slow["verdict"]["passed"]
    assert [r["ok"] for r in slow["verdict"]["rules"]].count(False) == 1

    assert not run([5.0] * 10, [5.0] * 10, failed=True)["verdict"]["passed"]
    assert not run([5.0] * 10, [5.0] * 10, refusal_ms=(1.0, 25.0))["verdict"]["passed"]
    assert not run([5.0] * 10, [5.0] * 10, refusal_ms=())["verdict"]["passed"]  # no refusals
    over = dict(PEERS, tarpit={"accepted": 40, "max_concurrent": 17})
    assert not run([5.0] * 10, [5.0] * 10, peers=over)["verdict"]["passed"]
    left = run([5.0] * 10, [5.0] * 10, after={"client_outbound": 1, "key_resolution": 0})
    assert not left["verdict"]["passed"]


def test_refusals_are_read_from_the_access_log_within_the_window():
    lines = [
        access_line("1970-01-01T00:00:10.500Z", 429, 1.5, attacker_address(0)),
        access_line("1970-01-01T00:00:10.600Z", 429, 3.0, "10.1.0.1"),  # a local user
        access_line("1970-01-01T00:00:10.700Z", 504, 9000.0, attacker_address(0)),
        access_line("1970-01-01T00:00:30.000Z", 429, 2.0, attacker_address(1)),
        "not json",
    ]
    assert refusals_in_log(lines, 10.0, 20.0) == [1.5]


def test_remote_lookups_and_the_attackers_ramp_are_not_judged():
    local_run = [local(100 + i, 5.0) for i in range(10)]
    local_run.append(
        Sample(105, REMOTE, "GET remote publicRooms (honest peer)", 429, 900.0, False, REFUSED)
    )
    attacks = [attack(50, 500.0), attack(105, 2.0), attack(106, 20_000.0, DEADLINE)]
    figures = phase_figures(local_run, attacks)
    assert figures["local"]["p99_ms"] == 5.0
    assert figures["remote_honest"]["refused"] == 1
    assert figures["attack"]["outcomes"] == {REFUSED: 1, DEADLINE: 1}  # not the one at 50


def test_attack_outcomes():
    assert attack_outcome(429, "") == REFUSED
    assert attack_outcome(504, '{"error": "Timed out waiting for x"}') == DEADLINE
    assert (
        attack_outcome(504, '{"error": "Not trying x again yet: a is cooling down"}') == "cooling"
    )
    assert attack_outcome(502, "{}") == "unreachable"
    assert attack_outcome(200, "{}") == "unexpected"
