"""What bounds several Weir instances on one PostgreSQL: prints the numbers that
docs/operations.md's sizing for 10 instances rests on.

    .venv/bin/python -m loadtests.cluster_limits [--writers 1,2,4] [--rooms 8]
        [--duration 5] [--listeners 10] [--notify-clients 8] [--notify-rate 1000]
        [--postgres URL] [--writes-only]

1. Events through Weir's write path. W writer processes (this module with `--writer`),
   each a HomeserverRuntime on one shared database as an instance of W (so each write
   also NOTIFYs, as with `cluster.instances` > 1), send messages back to back into rooms of
   their own (`RoomService.send_message`, as `PUT /send` calls it; one greenlet per room).
   First one writer with one room (the hold with nothing else on its hub), then W writers
   with `--rooms` each. Printed per run: events/s, the writers' and PostgreSQL's CPU per
   event, and how long each write held the events stream's row (storage/streams.py: from
   the `UPDATE` that takes it to the commit's end; every other writer of the stream waits
   meanwhile), with the round trips to PostgreSQL in that time (`HoldTimer`). A writer
   times its holds by wrapping `streams.take`, `Tx`'s statements and the database's
   writes in its own process: a timer, nothing else changes. The row's busy
   share (holds' total over the wall time) says how near the cluster-wide ceiling, one
   writer at a time, the writes came.
2. NOTIFY. pgbench (C, `--notify-clients` connections) commits transactions that update a
   row of their own, with and without a `pg_notify` on Weir's channel, while
   `--listeners` of Weir's own listeners (storage/announcements.py, a connection each)
   listen in this process: transactions/s without a NOTIFY, with one and nobody
   listening, and with one and the listeners, with the delay from each notification's
   making to a listener's reading it and the listeners' CPU per notification, at full
   speed and paced at `--notify-rate`. PostgreSQL
   serialises every notifying commit in the whole cluster (a lock held until the commit
   has ended, its WAL flush included), so the same runs are made with `fsync=on` (on a
   second cluster, as production runs it) beside the suite's `fsync=off` (with
   `--postgres`, on that cluster alone).
3. Connections. One instance (`cluster.instances = 2`) after a burst of 50 concurrent
   syncs: its connections in pg_stat_activity, by application name.

This machine has two cores, which the writers, PostgreSQL and pgbench share: the events/s
printed are this machine's, and the hold (its best, with one writer) is what carries over
to a cluster, where the instances have cores of their own and the row does not.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from urllib.parse import urlsplit

import gevent
import psutil
import psycopg

from homeserver.config import parse_config
from homeserver.core.requester import Requester
from homeserver.rooms.creation import CreateRoomRequest
from homeserver.runtime import HomeserverRuntime
from homeserver.storage import streams
from homeserver.storage.announcements import StreamAnnouncements
from homeserver.storage.database import Tx
from homeserver.storage.streams import CHANNEL
from loadtests.cluster_bench import Databases, settings
from loadtests.sync_bench import percentile
from tests.support.postgres import PostgresCluster, find_pg_bin
from tests.support.server import REPO, MatrixClient, WeirProcess

EVENTS_STREAM = "events"


# --- 1. events through Weir's write path --------------------------------------------------


class HoldTimer:
    """Times each write's hold of the events stream's row, from the UPDATE that takes it to
    the commit's end, and counts the round trips to PostgreSQL meanwhile. In a plain write
    the hold starts at the UPDATE's answer (any wait for the row is before), and each
    statement after it and the commit is a round trip. An event's write is pipelined
    (Database.write_pipelined): the UPDATE's answer comes with the commit's, so the hold is
    timed from its sending (with one writer, nothing waits for the row before it), and
    only a statement whose result is read waits, besides the commit."""

    def __init__(self, db):
        self.holds: list[float] = []  # seconds
        self.round_trips: list[int] = []
        original_take, original_execute = streams.take, Tx.execute
        original_fetchone, original_fetchall = Tx.fetchone, Tx.fetchall
        original_many, original_write = Tx.executemany, db.write
        original_pipelined = db.write_pipelined

        def take(tx, stream_name: str, count: int = 1):
            tx.taking = stream_name == EVENTS_STREAM and not getattr(tx, "hold", None)
            try:
                return original_take(tx, stream_name, count)
            finally:
                tx.taking = False

        def execute(tx, sql: str, params=()):
            if getattr(tx, "taking", False) and not getattr(tx, "hold", None):
                cursor = original_execute(tx, sql, params)  # the UPDATE: the row is ours
                tx.hold = [time.perf_counter(), 1]  # the commit's round trip, to come
                return cursor
            if getattr(tx, "hold", None) and not getattr(tx, "pipelined", False):
                tx.hold[1] += 1
            return original_execute(tx, sql, params)

        def fetched(original):
            def fetch(tx, sql: str, params=()):
                if getattr(tx, "hold", None) and getattr(tx, "pipelined", False):
                    tx.hold[1] += 1
                return original(tx, sql, params)

            return fetch

        def executemany(tx, sql: str, rows: list) -> None:
            if getattr(tx, "hold", None) and not getattr(tx, "pipelined", False):
                tx.hold[1] += 1  # one pipeline: one round trip
            original_many(tx, sql, rows)

        def timed(original, pipelined: bool):
            def write(fn, *args):
                seen: list = []

                def traced(tx, *inner):
                    tx.pipelined = pipelined
                    seen.append(tx)
                    return fn(tx, *inner)

                result = original(traced, *args)  # committed on return
                hold = getattr(seen[-1], "hold", None) if seen else None
                if hold:
                    self.holds.append(time.perf_counter() - hold[0])
                    self.round_trips.append(hold[1])
                return result

            return write

        streams.take, Tx.execute, Tx.executemany = take, execute, executemany
        Tx.fetchone, Tx.fetchall = fetched(original_fetchone), fetched(original_fetchall)
        db.write, db.write_pipelined = timed(original_write, False), timed(original_pipelined, True)

    def summary(self) -> dict:
        holds = [h * 1000 for h in self.holds] or [0.0]
        return {
            "holds": len(self.holds),
            "hold_sum_ms": sum(holds),
            "hold_p50_ms": percentile(holds, 50),
            "hold_p99_ms": percentile(holds, 99),
            "round_trips": statistics.mean(self.round_trips) if self.round_trips else 0,
        }


def writer(args) -> None:
    """One writer process: its rooms, then messages back to back until the deadline."""
    config = settings(args.data_dir, args.database, args.writer, args.writers, "WARNING")
    rt = HomeserverRuntime(parse_config(config))
    user = rt.accounts.register(f"writer-{args.writer}", "bench-password")
    requester = Requester(user.user_id, user.device_id, False, "")
    rooms = [rt.room_creator.create(user.user_id, CreateRoomRequest()) for _ in range(args.rooms)]
    timer = HoldTimer(rt.db)
    sent = 0

    def send_until(room_id: str, deadline: float) -> None:
        nonlocal sent
        while time.time() < deadline:
            content = {"msgtype": "m.text", "body": "bench"}
            rt.rooms.send_message(requester, room_id, "m.room.message", content, f"t{sent}")
            sent += 1

    print("ready", flush=True)
    start_at = float(sys.stdin.readline())  # all writers at once, once all are ready
    gevent.sleep(max(0.0, start_at - time.time()))
    cpu = time.process_time()
    deadline = start_at + args.duration
    gevent.joinall([gevent.spawn(send_until, r, deadline) for r in rooms], raise_error=True)
    result = {"events": sent, "cpu_s": time.process_time() - cpu, **timer.summary()}
    print(json.dumps(result), flush=True)
    sys.stdin.readline()  # its PostgreSQL connections stay until their CPU time is read
    rt.close()


def migrate(directory: str, url: str) -> None:
    """The database at its newest schema and the server's signing key, made once, before
    processes that would otherwise race to make them."""
    rt = HomeserverRuntime(parse_config(settings(directory, url)))
    assert rt.db and rt.signing_key  # each built on first use
    rt.close()


def postgres_seconds(postmaster: psutil.Process) -> float:
    total = 0.0
    for process in [postmaster, *postmaster.children()]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def write_run(databases: Databases, directory: str, count: int, rooms: int, args) -> dict:
    """`count` writer processes at once, each sending into `rooms` rooms, on a new
    database; their results summed."""
    url = databases.create(f"writers{count}x{rooms}")
    data_dir = os.path.join(directory, f"writers{count}x{rooms}")
    migrate(data_dir, url)
    command = [sys.executable, "-m", "loadtests.cluster_limits", "--database", url]
    command += ["--data-dir", data_dir, "--writers", str(count), "--rooms", str(rooms)]
    command += ["--duration", str(args.duration)]
    procs = [
        subprocess.Popen(
            [*command, "--writer", f"w{i}"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]
    for proc in procs:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a writer did not start: exit {proc.wait()}")
    start_at = time.time() + 0.5
    for proc in procs:
        proc.stdin.write(f"{start_at}\n")
        proc.stdin.flush()
    postmaster = databases.postmaster()
    gevent.sleep(max(0.0, start_at - time.time()))
    before = postgres_seconds(postmaster)
    results = [json.loads(proc.stdout.readline()) for proc in procs]
    pg_cpu = postgres_seconds(postmaster) - before
    for proc in procs:
        proc.communicate("exit\n")
    if any(proc.returncode for proc in procs):
        raise RuntimeError("a writer failed")
    events = sum(r["events"] for r in results)
    return {
        "writers": count,
        "rooms": rooms,
        "events_per_s": events / args.duration,
        "writer_cpu_ms": sum(r["cpu_s"] for r in results) / events * 1000,
        "pg_cpu_ms": pg_cpu / events * 1000,
        "hold_p50_ms": statistics.median(r["hold_p50_ms"] for r in results),
        "hold_p99_ms": max(r["hold_p99_ms"] for r in results),
        "hold_mean_ms": sum(r["hold_sum_ms"] for r in results) / sum(r["holds"] for r in results),
        "busy": sum(r["hold_sum_ms"] for r in results) / 1000 / args.duration,
        "round_trips": statistics.mean(r["round_trips"] for r in results),
    }


def report_writes(runs: list[dict]) -> None:
    print("events through Weir's write path (each writer a process; one room per greenlet):")
    print(
        "  (a write's hold is timed from the sending of the UPDATE that takes the row: with"
        " more than one room, it includes the wait for the others' turns at the row)"
    )
    for r in runs:
        print(
            f"  {r['writers']} writer(s) x {r['rooms']} room(s): {r['events_per_s']:.0f}"
            f" events/s; CPU per event:"
            f" writers {r['writer_cpu_ms']:.1f} ms, PostgreSQL {r['pg_cpu_ms']:.1f} ms; the"
            f" events row held p50 {r['hold_p50_ms']:.2f} ms, mean {r['hold_mean_ms']:.2f} ms,"
            f" p99 {r['hold_p99_ms']:.1f} ms, over {r['round_trips']:.0f} round trips"
            + (f"; held {r['busy']:.0%} of the time" if r["rooms"] * r["writers"] == 1 else "")
        )
    best = runs[0]
    print(
        f"  ceiling, one write at a time, each holding the row as long as one writer"
        f" alone: 1 / {best['hold_mean_ms']:.2f} ms ="
        f" {1000 / best['hold_mean_ms']:.0f} events/s on loopback; each 0.1 ms more per round"
        f" trip adds {best['round_trips'] * 0.1:.1f} ms to the hold"
    )


# --- 2. NOTIFY ----------------------------------------------------------------------------

# The same round trips both ways; only the pg_notify differs.
NOTIFY_SQL = """BEGIN;
UPDATE notify_rows SET v = v + 1 WHERE id = :client_id;
SELECT {call}('{channel}', 'pgbench bench '
  || (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
END;
"""
SCRIPTS = {
    "plain": NOTIFY_SQL.format(call="concat", channel=""),
    "notify": NOTIFY_SQL.format(call="pg_notify", channel=CHANNEL),
}


class HeardListener(StreamAnnouncements):
    """Weir's own listener (storage/announcements.py): counts what it hears, and how long
    after its notifying transaction began each was handed to Python."""

    def __init__(self, url: str, name: str, delays: list[float]):
        super().__init__(url, name, lambda positions: None)
        self.heard = 0
        self.delays = delays

    def _note(self, channel: str, payload: str) -> None:
        self.heard += 1
        sent_us = payload.rsplit(" ", 1)[-1]
        if payload.startswith("pgbench ") and sent_us.isdigit():
            self.delays.append(time.time() * 1000 - int(sent_us) / 1000)
        super()._note(channel, payload)


def pgbench(url: str, script: str, clients: int, duration: int, rate: int = 0) -> float:
    """Transactions per second pgbench committed."""
    parts = urlsplit(url)
    command = [os.path.join(find_pg_bin() or "", "pgbench"), "-n", "-h", parts.hostname or ""]
    command += ["-p", str(parts.port), "-U", parts.username or "postgres"]
    command += ["-c", str(clients), "-j", str(min(clients, 2)), "-T", str(duration)]
    command += ["-f", script, *(["-R", str(rate)] if rate else []), parts.path.lstrip("/")]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"^tps = ([\d.]+)", out, re.M).group(1))


def notify_runs(databases: Databases, directory: str, args) -> dict:
    """Commits/s without and with a NOTIFY each, to `--listeners` listeners, and the
    delays they heard them with, at full speed and at `--notify-rate`."""
    url = databases.create("notify")
    migrate(directory, url)  # stream_positions, which a listener reads first
    with psycopg.connect(url, autocommit=True) as conn:
        fsync = conn.execute("SHOW fsync").fetchone()[0]
        conn.execute("CREATE TABLE notify_rows (id int PRIMARY KEY, v bigint NOT NULL)")
        conn.execute(
            "INSERT INTO notify_rows SELECT i, 0 FROM generate_series(0, %s) i",
            (args.notify_clients,),
        )
    scripts = {}
    for name, text in SCRIPTS.items():
        scripts[name] = os.path.join(directory, f"{name}-{os.getpid()}.sql")
        with open(scripts[name], "w") as f:
            f.write(text)
    plain = pgbench(url, scripts["plain"], args.notify_clients, args.duration)
    unheard = pgbench(url, scripts["notify"], args.notify_clients, args.duration)
    result = {"fsync": fsync, "plain_tps": plain, "unheard_tps": unheard}
    for label, rate in (("full", 0), ("paced", args.notify_rate)):
        result[label] = heard_run(url, scripts["notify"], rate, args)
    return result


def heard_run(url: str, script: str, rate: int, args) -> dict:
    """pgbench's notifying transactions (at `rate` a second, or as fast as they go) while
    `--listeners` listeners hear them."""
    delays: list[float] = []
    listeners = [HeardListener(url, f"l{i}", delays) for i in range(args.listeners)]
    for listener in listeners:
        listener.start()
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    tps = pgbench(url, script, args.notify_clients, args.duration, rate)
    gevent.sleep(1)  # the last of them on their way
    used = resource.getrusage(resource.RUSAGE_SELF)
    for listener in listeners:
        listener.stop()
    heard = sum(listener.heard for listener in listeners)
    listener_s = used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime
    return {
        "tps": tps,
        "heard_share": heard / max(1, tps * args.duration * args.listeners),
        "delay_p50_ms": percentile(delays, 50) if delays else 0.0,
        "delay_p99_ms": percentile(delays, 99) if delays else 0.0,
        "listener_us": listener_s / max(1, heard) * 1e6,
    }


def report_notify(runs: list[dict], args) -> None:
    print(
        f"NOTIFY: pgbench, {args.notify_clients} connections, each transaction an UPDATE of a"
        f" row of its own; {args.listeners} of Weir's listeners on the channel:"
    )
    for r in runs:
        full, paced = r["full"], r["paced"]
        print(
            f"  fsync={r['fsync']}: {r['plain_tps']:.0f} commits/s without NOTIFY,"
            f" {r['unheard_tps']:.0f}/s with one and no listener,"
            f" {full['tps']:.0f}/s with one and the listeners; heard"
            f" {full['heard_share']:.0%} of them, after p50 {full['delay_p50_ms']:.1f} ms,"
            f" p99 {full['delay_p99_ms']:.1f} ms; the listener's CPU"
            f" {full['listener_us']:.0f} µs a notification"
        )
        print(
            f"    paced at {args.notify_rate}/s: {paced['tps']:.0f}/s, heard"
            f" {paced['heard_share']:.0%} after p50 {paced['delay_p50_ms']:.1f} ms,"
            f" p99 {paced['delay_p99_ms']:.1f} ms"
        )


# --- 3. connections -----------------------------------------------------------------------


def connections(databases: Databases, directory: str) -> dict[str, int]:
    """One instance's connections to PostgreSQL once 50 concurrent syncs made its pool grow,
    by application name."""
    url = databases.create("connections")
    folder = os.path.join(directory, "connections")
    os.makedirs(folder)
    chosen = settings(folder, url, "a", 2, "WARNING")
    chosen["registration"] = {"enabled": True}
    instance = WeirProcess(folder, chosen).start()
    try:
        client = MatrixClient(instance.client_url)
        client.register("connections")
        syncs = [gevent.spawn(client.get, "/_matrix/client/v3/sync") for _ in range(50)]
        gevent.joinall(syncs, raise_error=True)
        with psycopg.connect(databases.admin_url) as conn:
            rows = conn.execute(
                "SELECT coalesce(nullif(application_name, ''), 'the pool'), count(*)"
                " FROM pg_stat_activity WHERE datname = %s GROUP BY 1 ORDER BY 1",
                (url.rsplit("/", 1)[1],),
            ).fetchall()
    finally:
        instance.stop()
    return dict(rows)


# --- the run ------------------------------------------------------------------------------


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--writers", default="1,2,4", help="writer processes, run by run")
    parser.add_argument("--rooms", type=int, default=8, help="rooms (greenlets) per writer")
    parser.add_argument("--duration", type=int, default=5, help="seconds per run")
    parser.add_argument("--listeners", type=int, default=10)
    parser.add_argument("--notify-clients", type=int, default=8)
    parser.add_argument("--notify-rate", type=int, default=1000)
    parser.add_argument("--postgres", help="a superuser URL of a PostgreSQL on this machine")
    parser.add_argument("--writes-only", action="store_true", help="part 1 alone")
    # One writer process (internal).
    parser.add_argument("--writer", help=argparse.SUPPRESS)
    parser.add_argument("--database", help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if args.writer:
        writer(argparse.Namespace(**{**vars(args), "writers": int(args.writers)}))
        return 0
    directory = tempfile.mkdtemp(prefix="weir-cluster-limits-")
    clusters = []
    try:
        if args.postgres:
            admins = [args.postgres]
        else:
            bindir = find_pg_bin() or ""
            clusters = [PostgresCluster(bindir).start()]
            if not args.writes_only:
                clusters.append(PostgresCluster(bindir, {"fsync": "on"}).start())
            admins = [c.url() for c in clusters]
        print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
        databases = Databases(admins[0])
        counts = [int(n) for n in args.writers.split(",")]
        # First the hold alone: one writer, one room, nothing else on its hub.
        shapes = list(dict.fromkeys([(1, 1)] + [(n, args.rooms) for n in counts]))
        report_writes([write_run(databases, directory, n, r, args) for n, r in shapes])
        if not args.writes_only:
            report_notify([notify_runs(Databases(a), directory, args) for a in admins], args)
            found = connections(databases, directory)
            print(
                "connections of one instance after a burst: "
                + ", ".join(f"{name} {n}" for name, n in found.items())
                + f"; {sum(found.values())} in all"
            )
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
    finally:
        for cluster in clusters:
            cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
