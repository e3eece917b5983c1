"""Part (a) of loadtests/big_room_bench.py, Join: what joining a big remote room costs.

A fake resident server (loadtests/big_room_resident.py) on 127.78.X.2:8448, named by its IP
literal, holds a public room of `--join-members` members of its own and 20 messages; it is
built and signed before anything is timed. A Weir process of its own (127.78.X.1:8448, a
temporary SQLite file) registers a user who joins it by `POST /join/{room}?server_name=`.
Printed: the join's time and Weir's CPU; Weir's RSS before, its peak (sampled every 100 ms,
and VmHWM) and after; /versions on a fresh connection every 20 ms during the join against
the 5 s before; the database's size after; then what the user's first `/sync` holds of the
room (its timeline and state section), and what `/messages?dir=b&limit=10` answers first.
Then the same join by a real Synapse (tests/support/synapse.py) on 127.78.X.4:8448, if its
venv is there.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import quote

import gevent

from loadtests.big_room_common import (
    MB,
    V3,
    Figure,
    Probe,
    Sizes,
    percentile,
    pick_block,
    print_figures,
    probe_line,
)
from loadtests.big_room_resident import BigResident
from tests.support.federation import tls_weir
from tests.support.server import MatrixClient
from tests.support.synapse import SynapseServer, synapse_available
from tests.support.tls import TestCA

BLOCK = "127.78"  # part (a)'s loopback addresses; (b) to (d) use 127.77
MESSAGES = 20
QUIET_SECONDS = 5  # /versions before the join, to read the join's figures against
WEIR_DEFAULT_DEADLINE = 300  # federation.joins.deadline's default (homeserver/config.py)


@dataclass
class Joiner:
    """A homeserver that joins the resident's room, and how to read it from outside."""

    name: str
    client: MatrixClient
    pid: int
    sizes: Sizes
    problems: Callable[[], list[str]]  # its log lines at WARNING and above


@dataclass
class JoinRun:
    status: int
    answer: str
    seconds: float
    cpu: float
    rss_kb: tuple[int, int, int, int]  # before, sampled peak, VmHWM, after
    quiet: list[float]  # /versions ms in the QUIET_SECONDS before the join
    during: list[float]  # and during it


def proc_status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of the process (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssPeak:
    """The highest VmRSS seen, read every 100 ms by a greenlet, during a `with`."""

    def __init__(self, pid: int):
        self.pid, self.kb = pid, 0

    def __enter__(self) -> RssPeak:
        self._greenlet = gevent.spawn(self._sample)
        return self

    def _sample(self) -> None:
        while True:
            self.kb = max(self.kb, proc_status_kb(self.pid, "VmRSS"))
            gevent.sleep(0.1)

    def __exit__(self, *exc) -> None:
        self._greenlet.kill()
        self.kb = max(self.kb, proc_status_kb(self.pid, "VmRSS"))


def timed_join(joiner: Joiner, resident: BigResident, timeout: float) -> JoinRun:
    pid, client = joiner.pid, joiner.client
    before = proc_status_kb(pid, "VmRSS")
    path = f"{V3}/join/{quote(resident.room_id, safe='')}"
    with Probe(client.base_url, 20) as probe:
        gevent.sleep(QUIET_SECONDS)
        cpu = cpu_seconds(pid)
        with RssPeak(pid) as peak:
            started = time.monotonic()
            params = {"server_name": resident.server_name}
            r = client.post(path, params=params, json={}, timeout=timeout)
            ended = time.monotonic()
        cpu = cpu_seconds(pid) - cpu
        hwm = proc_status_kb(pid, "VmHWM")
    after = proc_status_kb(pid, "VmRSS")
    quiet = [
        ms for at, ms in probe.samples if at >= started - QUIET_SECONDS and at + ms / 1000 < started
    ]
    return JoinRun(
        r.status_code,
        r.text[:300],
        ended - started,
        cpu,
        (before, peak.kb, hwm, after),
        quiet,
        probe.during(started, ended),
    )


def join_figures(name: str, run: JoinRun, sizes: Sizes) -> list[Figure]:
    before, peak, hwm, after = (kb / 1024 for kb in run.rss_kb)
    outcome = "200" if run.status == 200 else f"{run.status} {run.answer}"
    rss = f"{before:.0f} / {peak:.0f} / {after:.0f} MB (peak sampled every 100 ms)"
    figures = [
        Figure("a", f"{name}: join", f"{run.seconds:.1f} s, {outcome}"),
        Figure("a", f"{name}: CPU during the join", f"{run.cpu:.1f} s"),
        Figure("a", f"{name}: RSS before / peak / after", rss),
        Figure("a", f"{name}: VmHWM (its life's peak) after", f"{hwm:.0f} MB"),
    ]
    for label, samples in (("5 s before", run.quiet), ("during the join", run.during)):
        p99 = percentile(samples, 0.99)
        line = f"p99 {p99:.1f} ms; p50 / max {probe_line(samples)}"
        figures.append(Figure("a", f"{name}: /versions {label}", line))
    size = f"{sizes.on_disk() / MB:.1f} MB on disk"
    if sizes.path:
        size += f", {sizes.pages() / MB:.1f} MB of pages"
    figures.append(Figure("a", f"{name}: database after the join", size))
    return figures


def describe(event: dict) -> str:
    kind, content = event.get("type", "?"), event.get("content", {})
    if kind == "m.room.message":
        return f"{kind} {content.get('body')!r}"
    if "state_key" in event:
        what = content.get("membership", "") if kind == "m.room.member" else ""
        return f"{kind} [{event['state_key']}] {what}".rstrip()
    return kind


def runs(items: list[str]) -> str:
    """'a, b x3, c': consecutive repeats counted."""
    out: list[list] = []
    for item in items:
        if out and out[-1][0] == item:
            out[-1][1] += 1
        else:
            out.append([item, 1])
    return ", ".join(f"{i} x{n}" if n > 1 else i for i, n in out) or "(nothing)"


def details(lines: list[str], most: int = 12) -> None:
    for n, line in enumerate(lines[:most], 1):
        print(f"      {n:>2}. {line}")
    if len(lines) > most:
        print(f"      ... and {len(lines) - most} more")


def messages_figures(joiner: Joiner, resident: BigResident, user_id: str) -> list[Figure]:
    """What /messages?dir=b&limit=10 answers first, against what the room holds: our join,
    then its latest messages, newest first."""
    path = f"{V3}/rooms/{quote(resident.room_id, safe='')}/messages"
    started = time.monotonic()
    r = joiner.client.get(path, params={"dir": "b", "limit": "10"}, timeout=120)
    took = time.monotonic() - started
    chunk = r.json().get("chunk", []) if r.status_code == 200 else []
    shown = [describe(e) for e in chunk]
    want = [f"m.room.member [{user_id}] join"]
    want += [f"m.room.message 'message {n} of {MESSAGES}'" for n in range(MESSAGES, 11, -1)]
    kinds = runs([e.get("type", "?") for e in chunk])
    line = f"{r.status_code} in {took:.2f} s, {len(chunk)} events: {kinds}"
    figure = Figure("a", f"{joiner.name}: /messages?dir=b&limit=10", line)
    figure.target, figure.met = "our join, then messages 20 to 12", shown == want
    print_figures([figure])
    details(shown)
    return [figure]


def sync_figures(joiner: Joiner, resident: BigResident) -> list[Figure]:
    """The room in the user's first /sync: its timeline, and how many of the timeline's
    events are of the send_join answer's auth chain or state (the issue: none of the
    auth chain); and its state section's size."""
    started = time.monotonic()
    r = joiner.client.get(f"{V3}/sync", params={"timeout": "0"}, timeout=300)
    took = time.monotonic() - started
    room = r.json().get("rooms", {}).get("join", {}).get(resident.room_id, {})
    timeline, state = room.get("timeline", {}), room.get("state", {}).get("events", [])
    events = timeline.get("events", [])
    ids = [e.get("event_id") for e in events]
    answer_state = {i for i, _ in resident.events}
    chain = set(resident.auth_closure(list(answer_state)))
    in_chain, in_state = sum(i in chain for i in ids), sum(i in answer_state for i in ids)
    messages = sum(e.get("type") == "m.room.message" for e in events)
    name = joiner.name
    kinds = runs([e.get("type", "?") for e in events])
    shown = f"{len(events)} events: {kinds}; limited {timeline.get('limited')}"
    of_answer = f"auth chain {in_chain}, state {in_state}; the room's messages {messages}"
    state_kinds = f"{len(state)} events: {runs(sorted(e.get('type', '?') for e in state))}"
    figures = [
        Figure("a", f"{name}: first /sync", f"{r.status_code} in {took:.2f} s"),
        Figure("a", f"{name}: /sync timeline", shown),
        # The issue names the auth chain; the answer's other state events are no timeline
        # either.
        Figure(
            "a",
            f"{name}: /sync timeline, of the answer",
            of_answer,
            "none (the issue: no auth chain event)",
            in_chain == 0 and in_state == 0,
        ),
        # No lazy loading asked for: the whole state before the timeline, as Synapse sends.
        Figure(
            "a",
            f"{name}: /sync state section",
            state_kinds,
            f"all {len(resident.events)} state events",
            {e.get("event_id") for e in state} == answer_state,
        ),
    ]
    print_figures(figures)
    details([describe(e) for e in events])
    return figures


def after_join(joiner: Joiner, resident: BigResident, user_id: str) -> list[Figure]:
    """/sync first, as a client would after its join, then /messages."""
    seen_before = resident.seen()
    figures = sync_figures(joiner, resident)
    figures += messages_figures(joiner, resident, user_id)
    seen = {k: n - seen_before.get(k, 0) for k, n in resident.seen().items()}
    asked = ", ".join(f"{k} {n}" for k, n in seen.items() if n) or "nothing"
    figures.append(Figure("a", f"{joiner.name}: asked of the resident after", asked))
    problems = joiner.problems()
    figures.append(Figure("a", f"{joiner.name}: log lines at WARNING+", f"{len(problems)}"))
    print_figures(figures[-2:])
    for line in problems[:10]:
        print(f"      {line[:200]}")
    return figures


def measure(joiner: Joiner, resident: BigResident, args) -> list[Figure]:
    load = os.getloadavg()[0]
    run = timed_join(joiner, resident, args.join_deadline + 60)
    figures = join_figures(joiner.name, run, joiner.sizes)
    figures.append(Figure("a", f"{joiner.name}: load average", f"{load:.2f} before"))
    figures[-1].value += f", {os.getloadavg()[0]:.2f} after the join"
    print_figures(figures)
    if run.status != 200:
        return figures
    user_id = joiner.client.get(f"{V3}/account/whoami").json()["user_id"]
    return figures + after_join(joiner, resident, user_id)


def weir_join(args, directory: str, ca: TestCA, prefix: str, resident) -> list[Figure]:
    url = f"sqlite:///{directory}/weir.db"
    weir = tls_weir(
        ca,
        directory,
        f"{prefix}.1",
        f"{prefix}.1:8448",
        database={"url": url},
        federation={"joins": {"deadline": args.join_deadline}},
        logging={"level": "WARNING"},
    )
    weir.repo = args.weir_repo or weir.repo  # another build's app.py, to compare with
    with weir:
        client = MatrixClient(weir.client_url)
        client.register("joiner")

        def problems() -> list[str]:
            with open(weir.stderr_path, errors="replace") as f:
                return [line.rstrip() for line in f if line.strip()]

        print(f"  Weir pid {weir.proc.pid} at {weir.federation_url}, from {weir.repo}", flush=True)
        return measure(Joiner("Weir", client, weir.proc.pid, Sizes(url), problems), resident, args)


def synapse_join(args, directory: str, ca: TestCA, prefix: str, resident) -> list[Figure]:
    if args.no_synapse or not synapse_available():
        why = "--no-synapse" if args.no_synapse else "no .venv-synapse (make synapse)"
        print(f"  Synapse: skipped ({why})")
        return []
    synapse = SynapseServer(directory, ca, ip=f"{prefix}.4")
    try:
        synapse.start()
    except (
        RuntimeError,
        OSError,
        subprocess.SubprocessError,
    ) as e:  # the join is Weir's figure; Synapse's is a bonus
        print(f"  Synapse: did not start, skipped: {str(e)[:500]}")
        return []
    try:
        token = synapse.register("joiner")["access_token"]
        client = MatrixClient(synapse.client_url, token)
        sizes = Sizes(f"sqlite:///{directory}/homeserver.db")

        def problems() -> list[str]:
            levels = (" WARNING ", " ERROR ", " CRITICAL ")
            with open(synapse.log_path, errors="replace") as f:
                found = [line.rstrip() for line in f if any(w in line for w in levels)]
            # Synapse logs its start-up banner at WARNING.
            return [line for line in found if "synapse.config.logger" not in line]

        print(f"  Synapse pid {synapse.proc.pid} at {synapse.federation_url}", flush=True)
        return measure(Joiner("Synapse", client, synapse.proc.pid, sizes, problems), resident, args)
    finally:
        synapse.stop()


def section_a(args, directory: str) -> list[Figure]:
    """Its own Weir, resident and addresses: (b) to (d)'s rooms are not in its figures."""
    members = args.join_members
    print(f"(a) join: a remote room of {members} members and {MESSAGES} messages")
    prefix = pick_block(BLOCK)
    ca = TestCA(os.path.join(directory, "join-ca"))
    started = time.monotonic()
    resident = BigResident(ca, f"{prefix}.2", members, MESSAGES)
    built = time.monotonic() - started
    size = resident.join_answer_bytes / MB
    figures = [
        Figure("a", "resident room built and signed", f"{len(resident.chain)} events in "),
        Figure("a", "send_join answer", f"{len(resident.events)} state events, {size:.1f} MB"),
        Figure("a", "join deadline given", f"{args.join_deadline:.0f} s"),
    ]
    figures[0].value += f"{built:.1f} s (before any clock starts)"
    figures[2].value += f" (Weir's default: {WEIR_DEFAULT_DEADLINE} s)"
    print_figures(figures)
    with resident:
        weir_dir, synapse_dir = (os.path.join(directory, d) for d in ("join-weir", "join-synapse"))
        os.makedirs(weir_dir)
        figures += weir_join(args, weir_dir, ca, prefix, resident)
        figures += synapse_join(args, synapse_dir, ca, prefix, resident)
    return figures
