"""What the locustfile and the runner agree on: the plan file, the samples file, and how an
attacker's answer is classified. No locust here: the runner imports it without being patched.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass

# Request categories. Only "local" requests are judged: they never leave the server.
LOCAL = "local"
REMOTE = "remote"  # a local user's lookup at the honest peer: served, cached or refused (429)
ELEMENT = "element"  # remote images and thumbnails from the honest peer, as Element loads them
ATTACK = "attack"

# Budgets that guard the calls the attackers make, so those whose caps bound what the silent
# peers can see at once: remote room lists and aliases, and remote media.
ATTACK_BUDGETS = ("client_outbound", "media_fetch")
# Each attacker is one client address and sends this many lookups at once, so that both caps
# of the client outbound budget refuse: one per client, and half the main pool in all (when
# there are more attackers than that).
ATTACK_BURST = 2
# One attacker in this many asks for remote media instead, this many files at once: within
# the per-client cap (8), and together past the media budget's global cap (64).
MEDIA_ATTACKER_EVERY = 5
MEDIA_ATTACK_BURST = 4

# Outcomes of an attack request.
REFUSED = "refused"  # 429 at once: a budget had no room (the defence)
DEADLINE = "deadline"  # 504 after the total deadline: it held a slot until then
COOLING = "cooling"  # 502/504 at once: the address was cooling down
UNREACHABLE = "unreachable"  # 502: the peer refused, or the TLS or DNS step failed
UNEXPECTED = "unexpected"  # anything else is a failure

SAMPLE_FIELDS = ("t", "category", "name", "status", "ms", "failed", "kind")


def attack_outcome(status: int, body: str) -> str:
    if status == 429:
        return REFUSED
    if status in (502, 504) and "cooling down" in body:
        return COOLING
    if status == 504:
        return DEADLINE
    if status == 502:
        return UNREACHABLE
    return UNEXPECTED


def local_address(i: int) -> str:
    """The X-Forwarded-For address of the i-th local user: each user is its own client."""
    return f"10.1.{i // 250}.{i % 250 + 1}"


ATTACKER_NETWORK = "10.66."


def element_address(i: int) -> str:
    return f"10.2.{i // 250}.{i % 250 + 1}"


def attacker_address(i: int) -> str:
    return f"{ATTACKER_NETWORK}{i // 250}.{i % 250 + 1}"


@dataclass(frozen=True)
class Sample:
    t: float  # when the request started (Unix time, seconds)
    category: str
    name: str
    status: int  # 0: no HTTP answer
    ms: float
    failed: bool
    kind: str  # an attack's outcome; empty for the others


def read_samples(path: str) -> list[Sample]:
    with open(path, newline="") as f:
        return [
            Sample(
                float(r["t"]),
                r["category"],
                r["name"],
                int(r["status"]),
                float(r["ms"]),
                r["failed"] == "1",
                r["kind"],
            )
            for r in csv.DictReader(f)
        ]


def write_plan(path: str, plan: dict) -> None:
    with open(path, "w") as f:
        json.dump(plan, f, indent=1)


def read_plan(path: str) -> dict:
    with open(path) as f:
        return json.load(f)
