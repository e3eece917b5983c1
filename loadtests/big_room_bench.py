"""What a big room costs Weir: joining one, and its inbound federation path. Prints figures
and, beside them, the targets they are read against; it judges nothing (exit 0 either way).

    .venv/bin/python -m loadtests.big_room_bench [--only a,b,c,d,e] [--members 2000]
        [--messages 1000] [--growth 5000] [--origins 20] [--database-url URL]
        [--join-members 10000] [--join-deadline 1200] [--no-synapse] [--weir-repo DIR]
        [--flood-members 10000] [--flood-seconds 30] [--flood-senders 4]

(a) Join (loadtests/big_room_join.py): a Weir process of its own joins a fake resident's
    public room of `--join-members` members and 20 messages, all on 127.78.X; then a real
    Synapse does the same, if .venv-synapse is there. Printed: the join's time, RSS before,
    peak and after, /versions during the join against the 5 s before, the database's size,
    and what the first /sync and /messages then show of the room. `--weir-repo`: (a)'s
    Weir runs that checkout's app.py (an earlier build, to compare), not this one's.

For (b) to (e), a real Weir process (TLS federation on 127.77.X.1:8448; a temporary SQLite
file, or the empty PostgreSQL database `--database-url` names) and, in this process, fake
servers on 127.77.X.2-3: a test DNS server, and one TLS peer serving the keys of `--origins`
origins (tests/peers/origins.py) and taking the transactions Weir sends them. Every PDU is
built and signed by the test helpers and sent by `PUT /send` as its origin, at most 50 a
transaction, and every answer is checked to hold no error.

(b) Inbound messages. Alice (local) creates a public room and it grows to `--members` by
    inbound joins (50 a transaction, the origins in turn, each join following the one
    before). Then one origin sends `--messages` messages, 50 a transaction, a linear chain;
    they are signed before the clock starts. Printed: PDUs a second, Weir's CPU (utime +
    stime from /proc, all its threads; the probe's requests included) per PDU, /versions
    p99 meanwhile, database growth per message (SQLite: the file and its -wal, which is
    reused and so moves in steps, and page_count x page_size as a reader sees it).
(c) Growth. A second room grows from 1 to `--growth` members by inbound joins, 50 a
    transaction. Printed at 1,000, 2,000 and 5,000 members: the database's size and its
    state storage's (SQLite: dbstat over state_groups, state_group_entries,
    event_state_groups, room_state_positions and any table named state_*, indexes included).
(d) Fork. In the room of (b) (built here if (b) did not run), alice gives a remote member
    power; from the same fork point two branches of 100 state events each set the same 100
    keys of a custom type (100 conflicts), then one message's prev_events are both tips.
    Printed: the merge's /send round trip, how long Weir's hub was held meanwhile (its own
    weir_hub_lateness_seconds) and the longest /versions request; also branch b's, each of
    whose events meets branch a's tip in the current state.
(e) Flood (loadtests/big_room_flood.py). The room of (b), grown to `--flood-members` if
    smaller; its first remote member's origin sends messages as fast as it can for
    `--flood-seconds`: `--flood-senders` (4) concurrent senders, transactions of 50 back to
    back, each one a linear chain from that sender's last PDU (the chains fork from the
    room's tip; signed in this process as it goes). Printed: PDUs accepted a second,
    transactions answered, /send latency p50/p99, /versions p50/p99/max in the 5 s before
    and during the flood, Weir's CPU and the bench's.

/versions latency is measured from outside, by a probe process of its own
(loadtests/stall_probe.py): a GET on a fresh connection every 20 ms (10 ms in (d)). The
bench, the probe and Weir share the machine's cores: read the figures as this machine's.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from urllib.parse import quote

from loadtests.big_room_common import (
    MB,
    V3,
    Figure,
    HubLateness,
    Probe,
    Sizes,
    percentile,
    pick_block,
    print_figures,
    probe_line,
)
from loadtests.big_room_flood import section_e
from loadtests.big_room_join import section_a
from tests.peers.dns import DnsServer
from tests.peers.origins import FakeOrigin, OriginKeyServer, send_transaction
from tests.peers.receiver import TransactionSink
from tests.support.federation import tls_weir
from tests.support.remote_room import RemoteRoom
from tests.support.server import REPO, MatrixClient
from tests.support.tls import TestCA

BLOCK = "127.77"  # this bench's loopback addresses; the test suite's are elsewhere
WEIR_NAME = "weir.test"
PER_TXN = 50  # spec: at most 50 PDUs a transaction
CHECKPOINTS = (1000, 2000, 5000)
FORK_LENGTH = 100
FORK_TYPE = "org.weir.bench.fork"
CREATE, POWER, JOIN_RULES = (
    ("m.room.create", ""),
    ("m.room.power_levels", ""),
    ("m.room.join_rules", ""),
)


@dataclass
class Room:
    remote: RemoteRoom
    tip: str  # the latest event: the next PDU's prev_event
    join_auth: list[str]
    base_auth: list[str]  # create and power levels; a member's own join goes after them
    members: int = 1
    speaker: tuple[FakeOrigin, str] | None = None  # the first remote member


class Bench:
    """Weir, the fake servers, and the room building they share."""

    def __init__(self, stack: ExitStack, args, directory: str):
        prefix = pick_block(BLOCK)
        self.ca = TestCA(os.path.join(directory, "ca"))
        self.dns = stack.enter_context(DnsServer(f"{prefix}.3"))
        keys = OriginKeyServer("bigroom.test", self.ca, self.dns, host=f"{prefix}.2")
        self.keys = stack.enter_context(keys)
        # Weir sends its own events (the power levels of (d)) to every origin in the room.
        self.sink = TransactionSink(self.keys)
        self.origins = [self.keys.add_origin(f"o{i}") for i in range(args.origins)]
        url = args.database_url or f"sqlite:///{directory}/weir.db"
        self.sizes = Sizes(url)
        # Every origin's key is fetched from one address: the per-IP key rate must allow it.
        keys_rate = {"key_resolution_per_ip_rate": {"max_requests": 100_000, "per_seconds": 60}}
        weir = tls_weir(
            self.ca,
            directory,
            f"{prefix}.1",
            WEIR_NAME,
            dns=self.dns,
            database={"url": url},
            security={"federation": keys_rate},
            logging={"level": "WARNING"},
        )
        self.weir = stack.enter_context(weir)
        self.sink.trust(WEIR_NAME, self.weir.federation_url, self.ca)
        self.alice = MatrixClient(self.weir.client_url)
        self.alice.register("alice")
        self._txns = 0
        self._turn = 0
        self._big: Room | None = None

    def send(self, origin: FakeOrigin, pdus: list[dict]) -> float:
        """Seconds until the transaction was applied; raises unless every PDU was accepted.
        A transaction not applied within a second is answered 200 with no results (staged:
        rooms/staging.py); it is sent again, as a server retries, until its answer is
        recorded."""
        self._txns += 1
        txn_id = f"big{self._txns}"
        started = time.monotonic()
        for _ in range(6000):
            r = send_transaction(
                self.weir.federation_url, origin, WEIR_NAME, txn_id, pdus, self.ca, timeout=600
            )
            took = time.monotonic() - started
            if r.status_code == 429:  # past the staging caps
                time.sleep(r.json().get("retry_after_ms", 1000) / 1000)
            elif r.status_code == 200 and pdus and not r.json().get("pdus"):
                time.sleep(0.05)  # staged, being applied
            else:
                break
        results = r.json().get("pdus", {}) if r.status_code == 200 else {}
        if len(results) != len(pdus) or any(results.values()):
            raise RuntimeError(f"/send {txn_id}: {r.status_code} {r.text[:1000]}")
        return took

    def new_room(self) -> Room:
        remote = RemoteRoom.create(self.alice, room_version="10")
        return Room(
            remote,
            remote.latest_event_id(),
            remote.auth_ids(CREATE, POWER, JOIN_RULES),
            remote.auth_ids(CREATE, POWER),
        )

    def join(self, room: Room, count: int) -> None:
        """`count` new members by inbound joins, 50 a transaction from one origin, the
        origins in turn; each join follows the one before."""
        while count > 0:
            origin = self.origins[self._turn % len(self.origins)]
            self._turn += 1
            pdus = []
            for _ in range(min(PER_TXN, count)):
                localpart = f"u{room.members}"
                user = origin.user(localpart)
                event_id, pdu = room.remote.pdu(
                    origin,
                    user,
                    "m.room.member",
                    {"membership": "join"},
                    state_key=user,
                    prev_events=[room.tip],
                    auth_events=room.join_auth,
                )
                room.remote.members[user] = event_id
                room.speaker = room.speaker or (origin, localpart)
                room.tip = event_id
                room.members += 1
                pdus.append(pdu)
            self.send(origin, pdus)
            count -= len(pdus)

    def big_room(self, members: int) -> Room:
        """The room of (b) and (d), built once."""
        if self._big is None:
            room, started = self.new_room(), time.monotonic()
            self.join(room, members - 1)
            took = time.monotonic() - started
            self.check_members(room)
            self._big = room
            print(f"  built a room of {members} members in {took:.1f} s", end="")
            print(f" ({(members - 1) / took:.0f} joins/s)", flush=True)
        return self._big

    def check_members(self, room: Room) -> None:
        # (Weir has no /joined_members.)
        path = f"{V3}/rooms/{quote(room.remote.room_id, safe='')}/members?membership=join"
        r = self.alice.get(path, timeout=120)
        joined = len(r.json().get("chunk", [])) if r.status_code == 200 else -1
        if joined != room.members:
            raise RuntimeError(
                f"Weir shows {joined} joined members, not {room.members}: {r.text[:300]}"
            )

    def log_problems(self) -> list[str]:
        """Weir's log lines at WARNING or above (the level it runs at), tracebacks included."""
        with open(self.weir.stderr_path, errors="replace") as f:
            return [line.rstrip() for line in f if line.strip()]


# -- (b) inbound messages --------------------------------------------------------------------


def section_b(bench: Bench, args) -> list[Figure]:
    print(f"(b) inbound messages: a room of {args.members} members, {args.messages} messages")
    room = bench.big_room(args.members)
    origin, localpart = room.speaker
    auth = [*room.base_auth, room.remote.members[origin.user(localpart)]]
    bodies = [f"message {i}" for i in range(args.messages)]
    ids, pdus = room.remote.messages(origin, localpart, bodies, prev=room.tip, auth=auth)
    room.tip = ids[-1]
    sizes, weir = bench.sizes, bench.weir
    disk, pages, cpu = sizes.on_disk(), sizes.pages(), weir.cpu_seconds()
    with Probe(weir.client_url, 20) as probe:
        started = time.monotonic()
        for i in range(0, len(pdus), PER_TXN):
            bench.send(origin, pdus[i : i + PER_TXN])
        ended = time.monotonic()
        cpu = weir.cpu_seconds() - cpu
    disk, pages = sizes.on_disk() - disk, (sizes.pages() or 0) - (pages or 0)
    latest = room.remote.latest_event_id()
    if latest != ids[-1]:
        raise RuntimeError(f"the room's latest event is {latest}, not the last message")
    n = len(pdus)
    rate, versions = n / (ended - started), probe.during(started, ended)
    p99 = percentile(versions, 0.99)
    figures = [
        Figure("b", "PDUs per second", f"{rate:.0f}", ">= 300", rate >= 300),
        Figure("b", "Weir CPU per PDU", f"{cpu / n * 1000:.2f} ms"),
        Figure("b", "/versions p99 meanwhile", f"{p99:.1f} ms", "<= 50 ms", p99 <= 50),
        Figure("b", "/versions p50 / max, requests", probe_line(versions)),
        Figure("b", "DB growth per message, on disk", f"{disk / n:.0f} B", "<= 4096 B"),
    ]
    figures[-1].met = disk / n <= 4096
    if sizes.path:
        line = f"{pages / n:.0f} B"
        figures.append(Figure("b", "DB growth per message, pages", line, "<= 4096 B"))
        figures[-1].met = pages / n <= 4096
    print_figures(figures)
    return figures


# -- (c) growth ------------------------------------------------------------------------------


def section_c(bench: Bench, args) -> list[Figure]:
    print(f"(c) growth: a second room from 1 to {args.growth} members")
    sizes = bench.sizes
    state = sizes.state_tables()
    if state is None:
        print("  SQLite's dbstat virtual table is unavailable: file sizes only")
    state_before = sum(state.values()) if state else 0
    room = bench.new_room()
    figures = []
    steps = sorted({c for c in CHECKPOINTS if c < args.growth} | {args.growth})
    for step in steps:
        started, first = time.monotonic(), room.members
        bench.join(room, step - room.members)
        rate = (step - first) / (time.monotonic() - started)
        size = f"{sizes.on_disk() / MB:.1f} MB on disk"
        if sizes.path:
            size += f", {sizes.pages() / MB:.1f} MB of pages"
        figures.append(Figure("c", f"DB at {step} members", size))
        figures.append(Figure("c", f"joins per second, {first} to {step}", f"{rate:.0f}"))
        if state is not None:
            figures += state_figures(sizes.state_tables(), state_before, step, args.growth)
        print_figures(figures[-4:] if state is not None else figures[-2:])
    bench.check_members(room)
    return figures


def state_figures(state: dict[str, int], before: int, step: int, last: int) -> list[Figure]:
    total = sum(state.values())
    parts = ", ".join(f"{name} {size / MB:.1f}" for name, size in sorted(state.items()))
    added = total - before
    figure = Figure("c", f"state storage at {step}, this room", f"{added / MB:.1f} MB")
    if step == last:
        figure.target = "<= 30 MB at 5,000 members"
        figure.met = added <= 30 * MB if step >= 5000 else None
    tables = Figure("c", f"state tables at {step}, all rooms", f"{total / MB:.1f} MB: {parts}")
    return [figure, tables]


# -- (d) fork --------------------------------------------------------------------------------


def grant_power(bench: Bench, room: Room, user: str) -> None:
    """Alice lets `user` send state: a local event, the fork point."""
    path = f"{V3}/rooms/{quote(room.remote.room_id, safe='')}/state/m.room.power_levels"
    content = bench.alice.get(path).json()
    content.setdefault("users", {})[user] = 100
    r = bench.alice.put(path, json=content)
    r.raise_for_status()
    room.tip = r.json()["event_id"]
    room.base_auth = room.remote.auth_ids(CREATE, POWER)


def branch(room: Room, origin, user: str, label: str, depth: int) -> tuple[str, list[dict]]:
    """100 state events from the fork point, each after the one before, setting k0..k99."""
    auth = [*room.base_auth, room.remote.members[user]]
    prev, pdus = room.tip, []
    for i in range(FORK_LENGTH):
        prev, pdu = room.remote.pdu(
            origin,
            user,
            FORK_TYPE,
            {"branch": label, "n": i},
            state_key=f"k{i}",
            prev_events=[prev],
            auth_events=auth,
            depth=depth + i,
        )
        pdus.append(pdu)
    return prev, pdus


def section_d(bench: Bench, args) -> list[Figure]:
    print(f"(d) fork: two branches of {FORK_LENGTH} state events, then a merge")
    room = bench.big_room(args.members)
    origin, localpart = room.speaker
    user = origin.user(localpart)
    grant_power(bench, room, user)
    depth = room.remote.depth + 2  # past the power levels event
    tip_a, branch_a = branch(room, origin, user, "a", depth)
    tip_b, branch_b = branch(room, origin, user, "b", depth)
    merge_id, merge = room.remote.pdu(
        origin,
        user,
        "m.room.message",
        {"msgtype": "m.text", "body": "merge"},
        prev_events=[tip_a, tip_b],
        auth_events=[*room.base_auth, room.remote.members[user]],
        depth=depth + FORK_LENGTH,
    )
    took_a = sum(bench.send(origin, branch_a[i : i + PER_TXN]) for i in range(0, 100, PER_TXN))
    with HubLateness(bench.weir.client_url) as hub_b:
        took_b, cpu_b, during_b = probed(bench, origin, branch_b)
    with HubLateness(bench.weir.client_url) as hub:
        took, cpu, during = probed(bench, origin, [merge])
    room.tip = merge_id
    stall = max(during, default=float("nan"))
    figures = [
        Figure("d", "merge /send round trip", f"{took * 1000:.0f} ms", "< 1000 ms", took < 1),
        Figure("d", "hub held over 50 ms, merge (inside)", hub.line(), "0 over 50 ms"),
        Figure("d", "hub held over 50 ms, branch b (inside)", hub_b.line(), "0 over 50 ms"),
        Figure("d", "longest /versions (outside), merge", f"{stall:.1f} ms"),
        Figure("d", "/versions during the merge", probe_line(during)),
        Figure("d", "Weir CPU during the merge", f"{cpu * 1000:.0f} ms"),
        Figure("d", "branch a, then b: /send total", f"{took_a:.2f} s, {took_b:.2f} s"),
        Figure("d", "Weir CPU during branch b", f"{cpu_b:.2f} s"),
        Figure("d", "/versions during branch b", probe_line(during_b)),
        Figure("d", "the merged room", fork_outcome(bench, room, merge_id)),
    ]
    figures[1].met = hub.over(0.05) == 0
    figures[2].met = hub_b.over(0.05) == 0
    print_figures(figures)
    print(
        "  (inside: Weir's weir_hub_lateness_seconds, a timer every 10 ms and how late the hub"
        " woke it; outside: /versions on a fresh connection every 10 ms, which also waits for"
        " the OS to run the probe, the bench and Weir on this machine's cores)"
    )
    return figures


def probed(bench: Bench, origin, pdus: list[dict]) -> tuple[float, float, list[float]]:
    """Sends `pdus`, 50 a transaction, under a 10 ms probe: seconds of /send in all, Weir's
    CPU seconds, and the milliseconds of the /versions requests meanwhile."""
    with Probe(bench.weir.client_url, 10) as probe:
        cpu, started = bench.weir.cpu_seconds(), time.monotonic()
        took = sum(bench.send(origin, pdus[i : i + PER_TXN]) for i in range(0, len(pdus), PER_TXN))
        ended, cpu = time.monotonic(), bench.weir.cpu_seconds() - cpu
    return took, cpu, probe.during(started, ended)


def fork_outcome(bench: Bench, room: Room, merge_id: str) -> str:
    """Which branch won k0 and k99, and that the merge is the room's latest event."""
    base = f"{V3}/rooms/{quote(room.remote.room_id, safe='')}/state/{FORK_TYPE}"
    won = [bench.alice.get(f"{base}/k{i}").json().get("branch") for i in (0, FORK_LENGTH - 1)]
    latest = room.remote.latest_event_id() == merge_id
    return f"k0 and k99 from branches {won}; merge is the latest event: {latest}"


# -- the run ---------------------------------------------------------------------------------

SECTIONS = {
    "b": section_b,
    "c": section_c,
    "d": section_d,
    "e": section_e,
}  # (a) runs apart: its own Weir


def summary(figures: list[Figure], header: list[str]) -> None:
    print("\n== summary ==")
    for line in header:
        print(line)
    for f in figures:
        verdict = {True: "met", False: "NOT MET", None: ""}[f.met]
        target = f"target {f.target}" if f.target else ""
        print(f"({f.section}) {f.label:<40} {f.value:<26} {target:<30} {verdict}".rstrip())
    print(
        "targets: (a) /messages shows the latest messages, /sync no auth chain event;"
        " (b) >= 300 PDUs/s, /versions p99 <= 50 ms, <= 4 KB of database per message;"
        " (c) state storage <= 30 MB at 5,000 members; (d) resolution < 1 s, no stall over 50 ms;"
        " (e) /versions p99 <= 50 ms during the flood"
    )


def revision() -> str:
    found = subprocess.run(
        ["git", "-C", REPO, "describe", "--always", "--dirty"], capture_output=True, text=True
    )
    return found.stdout.strip() or "(no git)"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="a,b,c,d,e", help="sections, comma-separated")
    parser.add_argument("--members", type=int, default=2000, help="the room of (b) and (d)")
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--growth", type=int, default=5000, help="members (c) grows to")
    parser.add_argument("--origins", type=int, default=20, help="fake remote servers")
    parser.add_argument("--database-url", default=None, help="an empty PostgreSQL database")
    parser.add_argument("--join-members", type=int, default=10_000, help="the room (a) joins")
    parser.add_argument("--join-deadline", type=float, default=1200, help="seconds, for (a)")
    parser.add_argument("--no-synapse", action="store_true", help="(a) without Synapse")
    parser.add_argument("--weir-repo", default=None, help="(a): the checkout Weir runs from")
    parser.add_argument("--flood-members", type=int, default=10_000, help="the room of (e)")
    parser.add_argument("--flood-senders", type=int, default=4, help="(e)'s concurrent senders")
    parser.add_argument("--flood-seconds", type=float, default=30, help="(e)'s flood")
    args = parser.parse_args()
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    if any(s not in ["a", *SECTIONS] for s in args.only):
        parser.error(f"--only takes sections of a,{','.join(SECTIONS)}")
    if args.join_members < 2:
        parser.error("--join-members at least 2")
    if args.members < 2 or args.growth < 2 or args.messages < 1 or args.origins < 1:
        parser.error("--members and --growth at least 2, --messages and --origins at least 1")
    if args.flood_members < 2 or args.flood_seconds <= 0 or args.flood_senders < 1:
        parser.error("--flood-members at least 2, --flood-seconds above 0, --flood-senders 1+")
    return args


def main() -> int:
    args = parse_args()
    directory = tempfile.mkdtemp(prefix="weir-big-room-")
    figures: list[Figure] = []
    header = [f"Weir {revision()}; {os.cpu_count()} cores; load average at the start: "]
    header[0] += " ".join(f"{load:.2f}" for load in os.getloadavg())
    print(header[0], flush=True)
    try:
        if "a" in args.only:
            figures += section_a(args, os.path.join(directory, "a"))
        if set(args.only) - {"a"}:
            figures += inbound(args, os.path.join(directory, "inbound"), header)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    header.append(f"load average at the end: {os.getloadavg()[0]:.2f}")
    summary(figures, header)
    return 0


def inbound(args, directory: str, header: list[str]) -> list[Figure]:
    """(b) to (e), on one Weir."""
    figures: list[Figure] = []
    os.makedirs(directory)
    with ExitStack() as stack:
        bench = Bench(stack, args, directory)
        header.append(
            f"(b-e) Weir pid {bench.weir.proc.pid}, at {bench.weir.federation_url};"
            f" {bench.sizes.kind()}; {args.origins} origins"
        )
        print(header[-1], flush=True)
        for name in sorted(set(args.only) - {"a"}):
            figures += SECTIONS[name](bench, args)
        problems = bench.log_problems()
        header.append(f"(b-e) Weir's log at WARNING and above: {len(problems)} lines")
        header += [f"  {line[:200]}" for line in problems[:10]]
    return figures


if __name__ == "__main__":
    sys.exit(main())
