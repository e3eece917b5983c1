"""One Weir instance beside two on one PostgreSQL, measured in the same run: prints each
figure beside issue 39's target.

    .venv/bin/python -m loadtests.cluster_bench [--connections 50] [--duration 5]
        [--rounds 3] [--rooms 40] [--members 4] [--parked 2000] [--wake-rounds 10]
        [--postgres URL]

What runs. A private PostgreSQL 15 (tests/support/postgres.py; or `--postgres`, a
superuser URL of a cluster on this machine). Users and rooms are written once, through the
storage layer, into a database that is then copied twice (`CREATE DATABASE ... TEMPLATE`),
so both deployments start from the same data: "1" is one instance (`cluster.instances =
1`, nothing announced) on one copy, pinned to core 0; "2" is instances a and b
(`cluster.instances = 2`, LISTEN/NOTIFY) on the other, a pinned to core 0 and b to core 1.
All three processes run for the whole bench; the deployments take turns, round after round,
so a slow spell of this shared VM falls on both alike, and each ratio is the median of the
rounds' ratios.

- `/versions`: wrk (C, one thread), one per instance, `--connections` spread over them.
- Mixed client traffic: per instance, a wrk whose Lua script alternates `PUT /send` and
  `GET /messages?limit=10` over the rooms whose sender uses that instance (a room is
  written through one instance at a time, as a room's few senders would be; a room written
  through two at once makes them rebuild each other's events, docs/architecture.md, "Several
  instances"); one connection per room. Every room's `--members` members (its sender
  among them) keep a `/sync` long-poll open, spread over the instances so that half the
  wakes cross from one instance to the other: every send wakes them all. The figure is
  requests answered per second: sends, `/messages` and sync answers together; the
  messages the syncs received are counted too, and PostgreSQL's sessions waiting on a lock
  are sampled (the events stream's row, a room's advisory lock).
- Parked syncs: `--parked` members of one room each park a `/sync` (half on a, half on b,
  on raw keep-alive sockets as loadtests/sync_bench.py does); one message, sent through a
  and through b in turn, wakes them all. The latency is from the send's start to the end of
  each woken sync's answer, also apart for the syncs on the instance the message went
  through and on the other, with how each instance's woken syncs were answered (from
  memory or from the database). The same on the one instance, for comparison.

Presence is off in all three: each of the big room's members coming online would wake
every other member (presence is shared with everyone in a room), n² wakes before anything
is measured.

What the ratio means on this machine. It has two cores. One instance has core 0 to itself,
and PostgreSQL and the load generator (wrk, and this process's sync clients) share core 1
with nothing else. Two instances have a core each, and PostgreSQL and the load generator
take their share of the same two cores: the ratio cannot reach 2, and how far below 2 it
stays is what the CPU lines show (cores used by the instances, PostgreSQL and the load
generator in each deployment). So each comparison also prints the work done per core the
instances used, and what two instances would reach with a core each (derived, not
measured): on machines of their own, instances share their cores with neither the database
nor the clients. Another process on the machine takes cores from the instances too: the
CPU lines show how much of their pinned cores they got, and a `/versions` ratio whose one
instance got under 0.8 of its core is printed as unreliable.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from urllib.parse import quote, urlsplit

import gevent
import psutil
import psycopg
import requests
from gevent.event import Event
from gevent.lock import BoundedSemaphore

from loadtests.sync_bench import Bench, Client, percentile, populate, raise_fd_limit, rss_kb
from loadtests.throughput_bench import parse_wrk, wrk_command
from loadtests.waiting_bench import wakes_by_answer
from tests.support.postgres import PostgresCluster, find_pg_bin
from tests.support.server import WeirProcess

VERSIONS = "/_matrix/client/versions"
MIXED_FIGURES = ("requests_rps", "p99", "sync_rps", "delivered")
LOCKS = ("transactionid", "tuple", "advisory")
# Under this share of its pinned core, the one instance shared it with another process.
STARVED = 0.8
SYNC = "/_matrix/client/v3/sync"
SERVER_NAME = "bench.test"
# Every message of a round in the timeline, not just the last 10.
MIXED_FILTER = '{"room":{"timeline":{"limit":1000}}}'
MIXED_SCRIPT = """
local rooms, n, prefix = {}, 0, ""
function init(args)
  prefix = args[1]
  for line in io.lines(args[2]) do
    local token, room = line:match("(%S+) (%S+)")
    rooms[#rooms + 1] = {token, room}
  end
end
function request()
  n = n + 1
  local room = rooms[(math.floor(n / 2) % #rooms) + 1]
  local headers = {["Authorization"] = "Bearer " .. room[1]}
  local path = "/_matrix/client/v3/rooms/" .. room[2]
  if n % 2 == 0 then
    headers["Content-Type"] = "application/json"
    return wrk.format("PUT", path .. "/send/m.room.message/" .. prefix .. n, headers,
                      '{"msgtype":"m.text","body":"bench"}')
  end
  return wrk.format("GET", path .. "/messages?dir=b&limit=10", headers)
end
"""


class Deployment:
    """One instance, or several on one database; each pinned to a core of its own."""

    def __init__(self, label: str, processes: list[WeirProcess], database: str):
        self.label = label
        self.processes = processes
        self.urls = [p.client_url for p in processes]
        self.database = database  # its URL

    def cpu_seconds(self) -> float:
        return sum(p.cpu_seconds() for p in self.processes)

    def rss_mb(self) -> list[float]:
        return [rss_kb(p.proc.pid) / 1024 for p in self.processes]

    @property
    def generator_cores(self) -> str:
        # Alone, the instance has core 0 and the generator core 1; as a pair, both share.
        return "1" if len(self.processes) == 1 else "0,1"


class CpuMeter:
    """Cores used during a measurement by the instances, PostgreSQL and the load generator
    (the wrk processes that ended, and this process's sync clients)."""

    def __init__(self, deployment: Deployment, postmaster: psutil.Process):
        self.deployment = deployment
        self.postmaster = postmaster

    def _postgres_seconds(self) -> float:
        total = 0.0
        for process in [self.postmaster, *self.postmaster.children()]:
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:  # a backend that ended meanwhile
                continue
            total += times.user + times.system
        return total

    @staticmethod
    def _generator_seconds() -> float:
        total = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            usage = resource.getrusage(who)
            total += usage.ru_utime + usage.ru_stime
        return total

    def read(self) -> tuple[float, ...]:
        return (
            time.monotonic(),
            self.deployment.cpu_seconds(),
            self._postgres_seconds(),
            self._generator_seconds(),
        )

    @staticmethod
    def cores(before: tuple[float, ...], after: tuple[float, ...]) -> dict[str, float]:
        wall = after[0] - before[0]
        names = ("instances", "postgres", "generator")
        return {name: (after[i + 1] - before[i + 1]) / wall for i, name in enumerate(names)}


def run_wrks(deployment: Deployment, duration: int, loads: list[tuple[str, int, tuple]]):
    """One wrk per instance, all at once: `loads` is each one's (URL, connections, Lua
    script and its arguments). Their results, in that order."""
    commands = [
        wrk_command(url, connections, duration, cores=deployment.generator_cores, script=script)
        for url, connections, script in loads
    ]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True) for c in commands]
    outs = [p.communicate()[0] for p in procs]
    for command, proc in zip(commands, procs):
        if proc.returncode != 0:
            raise RuntimeError(f"{command} exited with {proc.returncode}")
    return [parse_wrk(out, url) for out, (url, _, _) in zip(outs, loads)]


def versions_round(deployment: Deployment, meter: CpuMeter, args) -> dict:
    before = meter.read()
    # The same clients, spread over the instances.
    connections = max(1, args.connections // len(deployment.urls))
    loads = [(url + VERSIONS, connections, ()) for url in deployment.urls]
    results = run_wrks(deployment, args.duration, loads)
    return {
        "rps": sum(r["rps"] for r in results),
        "p99": max(r["p99"] for r in results),
        "cpu": meter.cores(before, meter.read()),
    }


class Syncers(Bench):
    """The sync clients parked on one deployment's instances: counts their answers and the
    messages in them."""

    def __init__(self, urls: list[str]):
        super().__init__(urls[0])
        self.server_urls = urls
        self.clients: list[Client] = []
        self.greenlets: list[gevent.Greenlet] = []
        self.answers = 0
        self.messages = 0

    def woken(self, client: Client, at: float, body: bytes = b"") -> None:
        self.answers += 1
        self.messages += body.count(b'"m.room.message"')
        super().woken(client, at, body)

    def park(self, placed: list[tuple[str, str]], since: str, sync_filter: str = "") -> list:
        """Parks one sync per (instance URL, token) from `since`; returns their clients."""
        clients = [Client(address(url), token, since, self, sync_filter) for url, token in placed]
        admitted = BoundedSemaphore(100)  # connecting at most this many at once
        self.greenlets += [gevent.spawn(client.run, admitted) for client in clients]
        self.clients += clients
        self.wait_parked(len(self.clients))
        return clients


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def first_since(url: str, token: str) -> str:
    """A token to sync from: where the positions are now."""
    r = requests.get(
        url + SYNC,
        params={"filter": '{"room":{"rooms":[]}}'},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    r.raise_for_status()
    return r.json()["next_batch"]


# --- the data and the processes -----------------------------------------------------------


class Population:
    """Users u0.. of populate(): the first `parked` in one big room, then `rooms` rooms of
    `members` each; the creator of every room is the last user."""

    def __init__(self, tokens: list[str], room_ids: list[str], args):
        self.tokens = tokens
        self.big_room = room_ids[0]
        self.rooms = room_ids[1:]
        self.parked = args.parked
        self.members = args.members

    @property
    def creator(self) -> str:
        return self.tokens[-1]

    def room_members(self, index: int) -> list[str]:
        first = self.parked + index * self.members
        return self.tokens[first : first + self.members]


class Databases:
    """Databases of one PostgreSQL cluster, through its superuser URL."""

    def __init__(self, admin_url: str):
        self.admin_url = admin_url
        self.names: list[str] = []

    def create(self, name: str, template: str | None = None) -> str:
        name = f"weir_cluster_{os.getpid()}_{name}"
        clause = f' TEMPLATE "{template}"' if template else ""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"{clause}')
        self.names.append(name)
        return self.admin_url.rsplit("/", 1)[0] + "/" + name

    def postmaster(self) -> psutil.Process:
        with psycopg.connect(self.admin_url) as conn:
            data = conn.execute("SHOW data_directory").fetchone()[0]
        with open(os.path.join(data, "postmaster.pid")) as f:
            return psutil.Process(int(f.readline()))

    def drop_all(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            for name in self.names:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def settings(directory: str, url: str, name: str = "main", instances: int = 1, log="INFO"):
    return {
        "server_name": SERVER_NAME,
        # One signing key for all: the one populate() made.
        "data_dir": os.path.join(directory, "data"),
        "instance_name": name,
        "cluster": {"instances": instances},
        "database": {"url": url},
        "server": {"http": {"port": 0}},
        "federation": {"port": 0},
        "logging": {"level": log},
        "presence": {"enabled": False},  # see the module's docstring
    }


def prepare(directory: str, databases: Databases, args) -> tuple[Population, str, str]:
    """Writes the users and rooms once, then copies them: (population, one instance's
    database URL, the pair's)."""
    started = time.monotonic()
    base = databases.create("base")
    groups = [args.parked] + [args.members] * args.rooms
    tokens, room_ids = populate(
        settings(directory, base), args.parked + args.rooms * args.members, groups
    )
    base_name = base.rsplit("/", 1)[1]
    solo, pair = databases.create("one", base_name), databases.create("two", base_name)
    print(
        f"setup: {len(tokens)} users, a room of {args.parked} and {args.rooms} rooms of"
        f" {args.members}, written once and copied ({time.monotonic() - started:.0f} s)"
    )
    return Population(tokens, room_ids, args), solo, pair


def start_deployments(directory: str, urls: tuple[str, str], args, started: list):
    """The one instance on the first database, the pair on the second; every process
    started is put in `started` as soon as it is, for the caller to stop."""

    def start(url: str, name: str, instances: int, core: str) -> WeirProcess:
        folder = os.path.join(directory, name)
        os.makedirs(folder)
        chosen = settings(directory, url, name, instances, args.log_level)
        process = WeirProcess(folder, chosen, launcher=("taskset", "-c", core))
        started.append(process)
        return process.start()

    # All at once: the databases are migrated already, and each name is taken once.
    chosen = [(urls[0], "one", 1, "0"), (urls[1], "a", 2, "0"), (urls[1], "b", 2, "1")]
    starts = [gevent.spawn(start, *arguments) for arguments in chosen]
    gevent.joinall(starts, raise_error=True)
    one, a, b = [g.get() for g in starts]
    return Deployment("1", [one], urls[0]), Deployment("2", [a, b], urls[1])


# --- the measurements ---------------------------------------------------------------------


def mixed_loads(directory: str, deployment: Deployment, population: Population, round_: int):
    """Per instance, wrk's load: one connection per room sent to through it (room r through
    instance r mod n), the Lua script, a prefix for its transaction IDs, and the file of
    those rooms with their senders."""
    script = os.path.join(directory, "mixed.lua")
    with open(script, "w") as f:
        f.write(MIXED_SCRIPT)
    n, loads = len(deployment.urls), []
    for i, url in enumerate(deployment.urls):
        mine = [r for r in range(len(population.rooms)) if r % n == i]
        rooms = os.path.join(directory, f"rooms-{deployment.label}-{i}.txt")
        with open(rooms, "w") as f:
            for r in mine:
                room_id = quote(population.rooms[r], safe="")
                f.write(f"{population.room_members(r)[0]} {room_id}\n")
        loads.append((url, len(mine), (script, f"d{deployment.label}i{i}r{round_}t", rooms)))
    return loads


def park_mixed(deployment: Deployment, syncers: Syncers, population: Population) -> None:
    """Every member of every room syncs, member j of room r through instance (r + j) mod n:
    with two instances, half of a send's wakes cross to the other."""
    n = len(deployment.urls)
    placed = [
        (deployment.urls[(r + j) % n], token)
        for r in range(len(population.rooms))
        for j, token in enumerate(population.room_members(r))
    ]
    since = first_since(deployment.urls[0], population.creator)
    syncers.park(placed, since, MIXED_FILTER)


class LockWaits:
    """How many of a database's sessions wait on a lock, sampled every 20 ms, by what they
    wait for: a row (`transactionid`, `tuple`: the events stream's row, held from a
    write's `advance` to its commit) or an advisory lock (one writer per room)."""

    def __init__(self, url: str):
        self.url = url
        self.samples = 0
        self.waiting: dict[str, int] = {}
        self.statements: dict[str, int] = {}  # the waiting statements' beginnings
        self._stop = Event()

    def __enter__(self) -> "LockWaits":
        self._greenlet = gevent.spawn(self._sample)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()  # after its query: killed in one, the connection is left unusable
        self._greenlet.join()

    def _sample(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.wait(0.02):
                for event, statement in conn.execute(
                    "SELECT wait_event, left(query, 70) FROM pg_stat_activity WHERE"
                    " datname = current_database() AND wait_event_type = 'Lock'"
                ):
                    self.waiting[event] = self.waiting.get(event, 0) + 1
                    self.statements[statement] = self.statements.get(statement, 0) + 1
                self.samples += 1

    def mean(self) -> dict[str, float]:
        return {event: n / max(1, self.samples) for event, n in self.waiting.items()}


def mixed_round(deployment, syncers: Syncers, loads, meter: CpuMeter, args) -> dict:
    syncers.wait_parked(len(syncers.clients))
    answers, messages = syncers.answers, syncers.messages
    wakes_before = answered_from(deployment)
    before = meter.read()
    with LockWaits(deployment.database) as waits:
        results = run_wrks(deployment, args.duration, loads)
    after = meter.read()
    wall = after[0] - before[0]
    sends = sum(r["requests"] // 2 for r in results)
    rps = sum(r["rps"] for r in results)
    sync_rps = (syncers.answers - answers) / wall
    return {
        "rps": rps + sync_rps,
        "requests_rps": rps,
        "sync_rps": sync_rps,
        "p99": max(r["p99"] for r in results),
        "delivered": (syncers.messages - messages) / max(1, sends * args.members),
        "cpu": meter.cores(before, after),
        "lock_waits": waits.mean(),
        "waiting_statements": waits.statements,
        "answered_from": answered_from(deployment) - wakes_before,
    }


def answered_from(deployment: Deployment) -> Counter[str]:
    """The deployment's woken syncs so far, by how they were answered; and its long-polls
    parked on their last answer's registration with no computation ("held")."""
    total: Counter[str] = Counter()
    for url in deployment.urls:
        total.update(wakes_by_answer(url))
        text = requests.get(url + "/metrics", timeout=30).text
        total["held"] += float(re.search(r"^weir_sync_held_parks_total (\S+)$", text, re.M)[1])
    return total


def wake_rounds(deployment: Deployment, syncers: Syncers, population: Population, args):
    """The big room's members parked, spread over the instances; one message at a time,
    through each instance in turn. The latencies (ms): of the syncs parked on the instance
    the message was sent through, and of those on another."""
    n = len(deployment.urls)
    placed = [(deployment.urls[i % n], population.tokens[i]) for i in range(args.parked)]
    since = first_since(deployment.urls[0], population.creator)
    rss_before, started = deployment.rss_mb(), time.monotonic()
    clients = syncers.park(placed, since)
    parked_in = time.monotonic() - started
    rss = deployment.rss_mb()
    # What each parked sync added to its instance's memory, process growth included.
    kb_each = statistics.mean((b - a) * 1024 * n / len(clients) for a, b in zip(rss_before, rss))
    on = {client: deployment.urls.index(url) for client, (url, _) in zip(clients, placed)}
    sender = requests.Session()
    sender.headers["Authorization"] = f"Bearer {population.creator}"
    samples: list[list[float]] = [[], []]  # the sending instance's, the others'
    before = [wakes_by_answer(url) for url in deployment.urls]
    for round_ in range(args.wake_rounds):
        url = deployment.urls[round_ % n]
        path = f"/_matrix/client/v3/rooms/{population.big_room}/send/m.room.message/w{round_}"

        def send():
            r = sender.put(url + path, json={"msgtype": "m.text", "body": "wake"}, timeout=60)
            r.raise_for_status()

        syncers.wait_parked(len(syncers.clients))
        syncers.round(clients, send)
        for client, at in syncers.times.items():
            elsewhere = on[client] != round_ % n
            samples[elsewhere].append((at - syncers.started) * 1000)
    after = [wakes_by_answer(url) for url in deployment.urls]
    answered = [{k: v - b.get(k, 0) for k, v in a.items()} for a, b in zip(after, before)]
    return {
        "samples": samples,
        "parked_in": parked_in,
        "rss": rss,
        "kb_each": kb_each,
        "answered": answered,
    }


# --- the report ---------------------------------------------------------------------------


def cpu_line(runs: list[dict], instances: int) -> str:
    cores = {k: statistics.median(r["cpu"][k] for r in runs) for k in runs[0]["cpu"]}
    return (
        f"cores used: instances {cores['instances']:.2f} (of {instances} pinned), PostgreSQL"
        f" {cores['postgres']:.2f}, load generator {cores['generator']:.2f}"
    )


def compare(name, key: str, one: list[dict], two: list[dict], target: float, saturates=False):
    """Both deployments' medians, and the median of the rounds' ratios against `target`.
    `saturates`: the load keeps one instance's core busy, unless another process has it."""
    ratios = sorted(b[key] / a[key] for a, b in zip(one, two))
    ratio = statistics.median(ratios)
    verdict = "met" if ratio >= target else "NOT met"
    print(
        f"{name}: 1 instance {statistics.median(r[key] for r in one):.0f}/s,"
        f" 2 instances {statistics.median(r[key] for r in two):.0f}/s:"
        f" {ratio:.2f}x (rounds {ratios[0]:.2f}-{ratios[-1]:.2f}x), target >= {target}x:"
        f" {verdict}"
    )
    print(f"  1 instance: {cpu_line(one, 1)}")
    print(f"  2 instances: {cpu_line(two, 2)}")
    # Work per core of the instances: what two would do with cores of their own.
    per_core = statistics.median(
        (b[key] / b["cpu"]["instances"]) / (a[key] / a["cpu"]["instances"])
        for a, b in zip(one, two)
    )
    print(
        f"  per instance core, 2 instances do {per_core:.0%} of what one does: with a core"
        f" each, free of PostgreSQL and the load, they would reach {2 * per_core:.2f}x"
        f" (derived, not measured)"
    )
    alone = statistics.median(r["cpu"]["instances"] for r in one)
    if saturates and alone < STARVED:
        # Its pinned core was shared with another process: the ratio overstates.
        verdict += f" (unreliable: the one instance got {alone:.2f} of its core)"
        print(f"  UNRELIABLE: the one instance got {alone:.2f} of its core; run again")
    return f"{name} {ratio:.2f}x (target >= {target}x): {verdict}"


def report_wakes(label: str, woken: dict, target_ms: float | None) -> str:
    every = [s for samples in woken["samples"] for s in samples]
    p99 = percentile(every, 99)
    verdict = (
        ""
        if target_ms is None
        else f", target < {target_ms:.0f} ms: " + ("met" if p99 < target_ms else "NOT met")
    )
    print(
        f"{label}: parked in {woken['parked_in']:.0f} s, RSS "
        + " + ".join(f"{mb:.0f} MB" for mb in woken["rss"])
        + f" ({woken['kb_each']:.0f} KB a parked sync); send -> woken:"
        f" p50 {percentile(every, 50):.0f} ms, p99 {p99:.0f} ms,"
        f" max {max(every):.0f} ms ({len(every)} wake-ups){verdict}"
    )
    for where, samples in zip(("the sending instance", "the other"), woken["samples"]):
        if woken["samples"][1]:  # only with instances to tell apart
            print(
                f"  parked on {where}: p50 {percentile(samples, 50):.0f} ms,"
                f" p99 {percentile(samples, 99):.0f} ms"
            )
    for name, answered in zip("ab", woken["answered"]):
        if len(woken["answered"]) > 1:
            counts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(answered.items()))
            print(f"  woken syncs on instance {name} answered from: {counts}")
    return f"{label} p99 {p99:.0f} ms{verdict}"


# --- the run ------------------------------------------------------------------------------


class Run:
    """The deployments side by side, taking turns round after round."""

    def __init__(self, directory: str, population: Population, deployments, postmaster, args):
        self.directory = directory
        self.population = population
        self.solo, self.pair = deployments
        self.args = args
        self.meters = {d.label: CpuMeter(d, postmaster) for d in deployments}
        self.syncers = {d.label: Syncers(d.urls) for d in deployments}
        # Who goes first alternates, so that neither always follows the other.
        self.turns = [deployments if r % 2 == 0 else deployments[::-1] for r in range(args.rounds)]

    def versions(self) -> str:
        args = self.args
        for d in (self.solo, self.pair):  # warm up: caches, the allocator, the CPU's clock
            warm_up = argparse.Namespace(**{**vars(args), "duration": 1})
            versions_round(d, self.meters[d.label], warm_up)
        runs: dict[str, list[dict]] = {"1": [], "2": []}
        for turn in self.turns:
            for d in turn:
                runs[d.label].append(versions_round(d, self.meters[d.label], args))
        return compare("/versions", "rps", runs["1"], runs["2"], 1.7, saturates=True)

    def mixed(self) -> str:
        for d in (self.solo, self.pair):
            park_mixed(d, self.syncers[d.label], self.population)
        runs: dict[str, list[dict]] = {"1": [], "2": []}
        for round_, turn in enumerate(self.turns):
            for d in turn:
                loads = mixed_loads(self.directory, d, self.population, round_)
                syncers, meter = self.syncers[d.label], self.meters[d.label]
                runs[d.label].append(mixed_round(d, syncers, loads, meter, self.args))
        verdict = compare("mixed traffic", "rps", runs["1"], runs["2"], 1.5)
        for label, rounds in runs.items():
            median = {k: statistics.median(r[k] for r in rounds) for k in MIXED_FIGURES}
            waits = {k: statistics.mean(r["lock_waits"].get(k, 0) for r in rounds) for k in LOCKS}
            print(
                f"  {label}: sends and /messages {median['requests_rps']:.0f}/s (p99"
                f" {median['p99']:.0f} ms), sync answers {median['sync_rps']:.0f}/s,"
                f" messages delivered within the run {median['delivered']:.0%}; sessions"
                " waiting on a lock, on average: "
                + ", ".join(f"{n:.1f} for {kind}" for kind, n in waits.items())
            )
            answered: Counter[str] = Counter()
            for r in rounds:
                answered.update(r["answered_from"])
            split = ", ".join(f"{k} {v:.0f}" for k, v in answered.items())
            print(f"    woken syncs answered from: {split} (long-polls parked held)")
            statements: Counter[str] = Counter()
            for r in rounds:
                statements.update(r["waiting_statements"])
            for statement, n in statements.most_common(3):
                print(f"    waiting most often ({n} samples): {statement}")
        return verdict

    def wakes(self) -> str:
        parked = self.args.parked
        woken = wake_rounds(self.pair, self.syncers["2"], self.population, self.args)
        verdict = report_wakes(f"{parked} parked on 2 instances", woken, 500)
        woken = wake_rounds(self.solo, self.syncers["1"], self.population, self.args)
        report_wakes(f"{parked} parked on 1 instance (for comparison)", woken, None)
        return verdict

    def stop_clients(self) -> None:
        for syncers in self.syncers.values():
            gevent.killall(syncers.greenlets, block=True)


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--connections", type=int, default=50, help="/versions: wrk's, spread over the instances"
    )
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rooms", type=int, default=40, help="rooms of the mixed traffic")
    parser.add_argument("--members", type=int, default=4, help="syncing members per room")
    parser.add_argument("--parked", type=int, default=2000)
    parser.add_argument("--wake-rounds", type=int, default=10)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--figures", default="versions,mixed,wakes", help="which of them to measure, in order"
    )
    parser.add_argument(
        "--postgres", help="a superuser URL of a PostgreSQL on this machine; default: our own"
    )
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: `make bench-tools` installs it (apt-get, as root)")
    raise_fd_limit()
    directory = tempfile.mkdtemp(prefix="weir-cluster-bench-")
    cluster = None if args.postgres else PostgresCluster(find_pg_bin() or "").start()
    databases = Databases(args.postgres or cluster.url())
    started: list[WeirProcess] = []
    try:
        population, *urls = prepare(directory, databases, args)
        deployments = start_deployments(directory, tuple(urls), args, started)
        run = Run(directory, population, deployments, databases.postmaster(), args)
        print(
            f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; {args.rounds}"
            f" rounds of {args.duration} s, wrk -t1 -c{args.connections} spread over the instances"
        )
        try:
            figures = {"versions": run.versions, "mixed": run.mixed, "wakes": run.wakes}
            verdicts = [figures[name]() for name in args.figures.split(",")]
        finally:
            run.stop_clients()
        print(f"against issue 39's targets (load average now {os.getloadavg()[0]:.1f}):")
        for line in verdicts:
            print(f"  {line}")
    finally:
        for process in started:
            process.stop()
        if cluster is not None:
            cluster.stop()
        else:
            databases.drop_all()
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
