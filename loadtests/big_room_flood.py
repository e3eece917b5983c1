"""Part (e) of the big-room bench (loadtests/big_room_bench.py runs it): a flood.

One origin, a member of a room of `--flood-members` members, sends message PDUs as fast as
it can for `--flood-seconds`: `--flood-senders` (4) greenlets in this process, each sending
transactions of 50 back to back, each transaction a linear chain continuing from that
sender's last PDU (the senders' chains fork from the room's tip when the flood starts).
Each transaction is signed just before it is sent, in this process (its CPU is printed).
A 429 is retried after its retry_after_ms (at most 1 s) with the same transaction ID, as a
server would; a transaction staged (answered before it was applied) is asked again until its
recorded answer comes; any other failure is counted and the sender goes on with a new transaction.
Meanwhile /versions is probed from outside every 20 ms; the 5 s before the flood are the
baseline.
"""

import os
import time
from dataclasses import dataclass, field

import gevent
import requests

from loadtests.big_room_common import (
    Figure,
    Probe,
    percentile,
    print_figures,
    probe_line,
)
from tests.peers.origins import send_transaction

PER_TXN = 50
BASELINE_SECONDS = 5.0
WEIR_NAME = "weir.test"


@dataclass
class Tally:
    accepted: int = 0
    refused: int = 0  # PDUs answered with an error
    answered: int = 0  # transactions answered 200
    retried: int = 0  # 429s, retried
    staged: int = 0  # transactions answered before they were applied, asked again
    failed: list[str] = field(default_factory=list)  # other statuses and exceptions
    latencies: list[float] = field(default_factory=list)  # seconds, each 200's round trip


def section_e(bench, args) -> list[Figure]:
    print(
        f"(e) flood: a room of {args.flood_members} members, one origin,"
        f" {args.flood_senders} senders for {args.flood_seconds:.0f} s"
    )
    room = bench.big_room(args.flood_members)
    if room.members < args.flood_members:
        started = time.monotonic()
        bench.join(room, args.flood_members - room.members)
        bench.check_members(room)
        print(f"  grew the room to {room.members} members in {time.monotonic() - started:.1f} s")
    origin, localpart = room.speaker
    user = origin.user(localpart)
    auth = [*room.base_auth, room.remote.members[user]]
    tally = Tally()
    weir = bench.weir
    with Probe(weir.client_url, 20) as probe:
        before = time.monotonic()
        gevent.sleep(BASELINE_SECONDS)
        cpu, mine, started = weir.cpu_seconds(), cpu_of(os.times()), time.monotonic()
        deadline = started + args.flood_seconds
        tips = [room.tip] * args.flood_senders
        senders = [
            gevent.spawn(flood_sender, bench, room, origin, (user, auth), tips, i, deadline, tally)
            for i in range(args.flood_senders)
        ]
        gevent.joinall(senders, raise_error=True)
        ended, cpu = time.monotonic(), weir.cpu_seconds() - cpu
        mine = cpu_of(os.times()) - mine
    room.tip = tips[0]
    return report(tally, probe, (before, started, ended), (cpu, mine), room.members)


def cpu_of(times) -> float:
    return times.user + times.system


def flood_sender(bench, room, origin, who, tips, i, deadline, tally: Tally) -> None:
    """Transactions of 50 back to back until `deadline`, each continuing tips[i]'s chain."""
    user, auth = who
    n = 0
    while time.monotonic() < deadline:
        n += 1
        pdus = []
        for k in range(PER_TXN):
            tips[i], pdu = room.remote.pdu(
                origin,
                user,
                "m.room.message",
                {"msgtype": "m.text", "body": f"flood {i}.{n}.{k}"},
                prev_events=[tips[i]],
                auth_events=auth,
            )
            pdus.append(pdu)
        send_once(bench, origin, f"flood{i}.{n}", pdus, tally)


def send_once(bench, origin, txn_id: str, pdus: list[dict], tally: Tally) -> None:
    """One transaction, retried on 429 as a server would, and asked again while it is staged
    (answered 200 with no per-PDU results before it was applied: rooms/staging.py) until its
    recorded answer comes; tallied. Its latency runs to that answer: the PDUs applied."""
    url, ca = bench.weir.federation_url, bench.ca
    started = time.monotonic()
    staged = False
    while True:
        try:
            r = send_transaction(url, origin, WEIR_NAME, txn_id, pdus, ca, timeout=120)
        except requests.RequestException as e:
            tally.failed.append(f"{txn_id}: {type(e).__name__}")
            return
        if time.monotonic() - started > 120:
            break
        if r.status_code == 429:
            tally.retried += 1
            gevent.sleep(min(1.0, r.json().get("retry_after_ms", 1000) / 1000))
        elif r.status_code == 200 and pdus and not r.json().get("pdus"):
            staged = True
            gevent.sleep(0.05)
        else:
            break
    took = time.monotonic() - started
    if r.status_code != 200:
        tally.failed.append(f"{txn_id}: {r.status_code} {r.text[:200]}")
        return
    results = r.json().get("pdus", {})
    tally.answered += 1
    tally.staged += staged
    tally.latencies.append(took)
    bad = sum(1 for value in results.values() if value)
    tally.refused += bad + max(0, len(pdus) - len(results))
    tally.accepted += min(len(pdus), len(results)) - bad


def report(tally: Tally, probe: Probe, times, cpus, members: int) -> list[Figure]:
    before, started, ended = times
    cpu, mine = cpus
    window = ended - started
    base, during = probe.during(before, started), probe.during(started, ended)
    lat = [s * 1000 for s in tally.latencies]
    p50, p99 = percentile(lat, 0.5), percentile(lat, 0.99)
    figures = [
        Figure("e", "members; flood window", f"{members}; {window:.1f} s"),
        Figure("e", "PDUs accepted per second", f"{tally.accepted / window:.0f}"),
        Figure("e", "PDUs accepted / refused", f"{tally.accepted} / {tally.refused}"),
        Figure("e", "transactions answered (200)", f"{tally.answered}"),
        Figure(
            "e",
            "429s retried; staged, asked again; other failures",
            f"{tally.retried}; {tally.staged}; {len(tally.failed)}",
        ),
        Figure(
            "e",
            "/send latency p50 / p99 / max",
            " / ".join(f"{v:.0f}" for v in (p50, p99, max(lat, default=0))) + " ms",
        ),
        Figure("e", "/versions p50 / max before", probe_line(base)),
        Figure("e", "/versions p99 before", f"{percentile(base, 0.99):.1f} ms"),
        Figure("e", "/versions p50 / max during", probe_line(during)),
        Figure("e", "/versions p99 during", f"{percentile(during, 0.99):.1f} ms", "<= 50 ms"),
        Figure(
            "e", "Weir CPU during the flood", f"{cpu:.1f} s ({cpu / window * 100:.0f}% of a core)"
        ),
        Figure(
            "e", "bench process CPU (signing, TLS)", f"{mine:.1f} s ({mine / window * 100:.0f}%)"
        ),
    ]
    figures[9].met = percentile(during, 0.99) <= 50
    print_figures(figures)
    for line in tally.failed[:5]:
        print(f"  failure: {line}")
    return figures
