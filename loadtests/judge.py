"""From a load test run's raw records to its figures and verdict (pure: no I/O, no locust).

The judged figures and their limits (issue 11):
- no local request fails, in either phase;
- local p99 under attack is at most 1.5x the baseline p99 plus 20 ms;
- refusals (429s to attackers) take Weir under 20 ms at p99, and there are some: an attack
  that is never refused did not test the defence. This one is measured where the refusal
  happens, Weir's access log (request read to response written): the attackers' own
  figures add the load generator's scheduling on a shared machine (reported beside it);
- the main pool is never full (sampled from /metrics twice a second): the budget leaves
  room for the requests that never leave the server, which is the point of ADR-0079;
- the tarpit, and the silent peers together, never hold more connections at once than the
  budgets guarding the attackers' calls allow;
- every budget is back to zero after the run.

Percentiles are nearest-rank over every sample (no interpolation, no histogram rounding).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from datetime import datetime, timezone

from loadtests.scenario import (
    ATTACK,
    ATTACK_BUDGETS,
    ATTACKER_NETWORK,
    ELEMENT,
    LOCAL,
    REFUSED,
    REMOTE,
    Sample,
)

P99_FACTOR = 1.5
P99_SLACK_MS = 20.0
REFUSAL_P99_LIMIT_MS = 20.0
BUDGETS = ("client_outbound", "media_fetch", "key_resolution")


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def latency_figures(samples: list[Sample]) -> dict:
    times = [s.ms for s in samples]
    return {
        "requests": len(samples),
        "failures": sum(s.failed for s in samples),
        "p50_ms": _rounded(percentile(times, 50)),
        "p99_ms": _rounded(percentile(times, 99)),
    }


def by_endpoint(samples: list[Sample]) -> dict:
    groups: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        groups[s.name].append(s)
    return {name: latency_figures(group) for name, group in sorted(groups.items())}


def per_second(samples: list[Sample], start: float) -> list[dict]:
    """p50 and p99 of the requests started in each second since `start`."""
    buckets: dict[int, list[float]] = defaultdict(list)
    for s in samples:
        buckets[int(s.t - start)].append(s.ms)
    return [
        {
            "second": sec,
            "requests": len(ms),
            "p50_ms": percentile(ms, 50),
            "p99_ms": percentile(ms, 99),
        }
        for sec, ms in sorted(buckets.items())
    ]


def window(samples: list[Sample]) -> tuple[float, float]:
    """From the first request's start to the last one's end."""
    if not samples:
        return 0.0, 0.0
    return min(s.t for s in samples), max(s.t + s.ms / 1000 for s in samples)


# Weir's access log message (logging.format = "json"): METHOD PATH STATUS 1.2ms CLIENT
_ACCESS = re.compile(r"^(\S+) (\S+) (\S+) ([\d.]+)ms (\S+)")


def refusals_in_log(lines, start: float, end: float) -> list[float]:
    """Milliseconds Weir took for each 429 it gave an attacker address between `start` and
    `end` (Unix times, when the response was done), from its JSON log lines."""
    found = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("logger") != "weir.access":
            continue
        match = _ACCESS.match(entry["message"])
        if not match or match.group(3) != "429" or not match.group(5).startswith(ATTACKER_NETWORK):
            continue
        t = (
            datetime.strptime(entry["ts"], "%Y-%m-%dT%H:%M:%S.%fZ")
            .replace(tzinfo=timezone.utc)
            .timestamp()
        )
        if start <= t <= end:
            found.append(float(match.group(4)))
    return found


def phase_figures(
    local_run: list[Sample], attack_run: list[Sample] | None = None, weir_log: list[str] = ()
) -> dict:
    figures = {"local": latency_figures([s for s in local_run if s.category == LOCAL])}
    for category, key in ((REMOTE, "remote_honest"), (ELEMENT, "element")):
        samples = [s for s in local_run if s.category == category]
        figures[key] = {
            **latency_figures(samples),
            "refused": sum(s.kind == REFUSED for s in samples),
        }
    attacks: list[Sample] = []
    if attack_run is not None:
        # The attack as the local users met it: the attackers' ramp-up (a burst of locust's
        # own work, before the local users start) is not part of the phase.
        start, end = window(local_run)
        attacks = [s for s in attack_run if s.category == ATTACK and start <= s.t <= end]
        seen = [s.ms for s in attacks if s.kind == REFUSED]
        refusals = refusals_in_log(weir_log, start, end)
        figures["refusals"] = {
            "count": len(refusals),
            "p50_ms": _rounded(percentile(refusals, 50)),
            "p99_ms": _rounded(percentile(refusals, 99)),
            "measured": "by Weir (access log)",
            "seen_by_attackers": {
                "count": len(seen),
                "p50_ms": _rounded(percentile(seen, 50)),
                "p99_ms": _rounded(percentile(seen, 99)),
            },
        }
        figures["attack"] = {
            "requests": len(attacks),
            "failures": sum(s.failed for s in attacks),
            "outcomes": dict(Counter(s.kind for s in attacks)),
        }
    figures["by_endpoint"] = by_endpoint(local_run + attacks)
    return figures


def _rule(rule: str, value, limit, ok: bool) -> dict:
    return {"rule": rule, "value": value, "limit": limit, "ok": bool(ok)}


def verdict(
    baseline: dict, attack: dict, peers: dict, caps: dict, budgets_after: dict, main_pool: dict
) -> dict:
    """`caps`: each exported budget's global cap; `budgets_after`: in flight after the run
    (None for a budget this server does not have yet); `main_pool`: its size and the most
    greenlets seen in it."""
    rules = []
    b_local, a_local = baseline["local"], attack["local"]
    failures = b_local["failures"] + a_local["failures"]
    rules.append(
        _rule(
            "local requests failed, both phases",
            failures,
            0,
            failures == 0 and b_local["requests"] > 0 and a_local["requests"] > 0,
        )
    )

    limit = None
    if b_local["p99_ms"] is not None:
        limit = round(P99_FACTOR * b_local["p99_ms"] + P99_SLACK_MS, 2)
    value = a_local["p99_ms"]
    rules.append(
        _rule(
            f"local p99 under attack (ms) <= {P99_FACTOR} x baseline p99 + {P99_SLACK_MS:.0f}",
            value,
            limit,
            value is not None and limit is not None and value <= limit,
        )
    )

    refusals = attack["refusals"]
    rules.append(
        _rule(
            f"refusal p99 (ms, in Weir) < {REFUSAL_P99_LIMIT_MS:.0f}, over "
            f"{refusals['count']} refusals",
            refusals["p99_ms"],
            REFUSAL_P99_LIMIT_MS,
            refusals["count"] > 0 and refusals["p99_ms"] < REFUSAL_P99_LIMIT_MS,
        )
    )

    rules.append(
        _rule(
            "main pool: most greenlets at once (sampled) < its size",
            main_pool["max_greenlets"],
            main_pool["size"],
            main_pool["max_greenlets"] < main_pool["size"],
        )
    )

    guard = [b for b in ATTACK_BUDGETS if b in caps]
    bound = sum(caps[b] for b in guard) if guard else None
    guarded_by = " + ".join(guard) or "(budgets missing)"
    for peer, figure in (
        ("tarpit", peers["tarpit"]["max_concurrent"]),
        ("silent peers together", peers["silent_combined"]["max_concurrent"]),
    ):
        rules.append(
            _rule(
                f"{peer}: most connections at once <= cap of {guarded_by}",
                figure,
                bound,
                bound is not None and figure <= bound,
            )
        )

    present = {k: v for k, v in budgets_after.items() if v is not None}
    left = sum(present.values())
    rules.append(
        _rule(
            f"slots in flight after the run ({', '.join(sorted(present))})",
            left,
            0,
            bool(present) and left == 0,
        )
    )
    return {"passed": all(r["ok"] for r in rules), "rules": rules}


def summarize(
    samples: dict[str, list[Sample]],
    weir_log: list[str],
    peers: dict,
    caps: dict,
    budgets_after: dict,
    main_pool: dict,
    **extra,
) -> dict:
    """The summary.json document. `samples` has "baseline" (the local users' run), and
    "attack_local" and "attack" (the attackers' run) of the attack phase; `weir_log` is
    Weir's log, JSON lines."""
    baseline = phase_figures(samples["baseline"])
    attack = phase_figures(samples["attack_local"], samples["attack"], weir_log)
    return {
        "phases": {"baseline": baseline, "attack": attack},
        "tarpit": {
            "accepted": peers["tarpit"]["accepted"],
            "max_concurrent": peers["tarpit"]["max_concurrent"],
        },
        "budgets_after": {name: budgets_after.get(name) for name in BUDGETS},
        "verdict": verdict(baseline, attack, peers, caps, budgets_after, main_pool),
        "peers": peers,
        "budget_caps": caps,
        "main_pool": main_pool,
        **extra,
    }
