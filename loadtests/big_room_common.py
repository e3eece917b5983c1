"""What the big-room bench's parts share: a figure, the /versions probe process, the
database's sizes read from outside, and a free loopback block. loadtests/big_room_bench.py
runs the parts; loadtests/big_room_join.py is part (a)."""

import json
import math
import os
import random
import socket
import sqlite3
import subprocess
import sys
from dataclasses import dataclass

import psycopg

from tests.support.metrics import read_metrics
from tests.support.server import REPO

V3 = "/_matrix/client/v3"
VERSIONS = "/_matrix/client/versions"
STATE_TABLES = ("state_groups", "state_group_entries", "event_state_groups", "room_state_positions")
MB = 1024 * 1024


@dataclass
class Figure:
    section: str
    label: str
    value: str
    target: str = ""
    met: bool | None = None  # None: no target


def percentile(samples: list[float], q: float) -> float:
    """Nearest rank."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(len(ordered) * q) - 1)] if ordered else float("nan")


def pick_block(block: str) -> str:
    """A free `block`.X: nobody holds port 8448 on `block`.X.1, Weir's federation address."""
    for _ in range(100):
        prefix = f"{block}.{random.randint(1, 254)}"
        probe = socket.socket()
        try:
            probe.bind((f"{prefix}.1", 8448))
            return prefix
        except OSError:
            continue
        finally:
            probe.close()
    raise RuntimeError(f"no free address with port 8448 in {block}.0.0/16")


class Probe:
    """loadtests/stall_probe.py on /versions, in a process of its own, during a `with`."""

    def __init__(self, url: str, interval_ms: int):
        self.command = [sys.executable, "-m", "loadtests.stall_probe", url, VERSIONS]
        self.command.append(str(interval_ms))
        self.samples: list[tuple[float, float]] = []

    def __enter__(self) -> "Probe":
        self.proc = subprocess.Popen(
            self.command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        if self.proc.stdout.readline() != "started\n":
            raise RuntimeError("the probe did not start")
        return self

    def __exit__(self, *exc) -> None:
        out, _ = self.proc.communicate("stop\n", timeout=120)
        if self.proc.returncode != 0:
            raise RuntimeError(f"the probe exited with {self.proc.returncode}")
        self.samples = [(began, ms) for began, ms in json.loads(out.strip().splitlines()[-1])]

    def during(self, start: float, end: float) -> list[float]:
        """Milliseconds of the requests that overlapped [start, end] (time.monotonic())."""
        return [ms for began, ms in self.samples if began <= end and began + ms / 1000 >= start]


class Sizes:
    """The database's size and its state storage's, read from outside Weir."""

    def __init__(self, url: str):
        self.url = url
        self.path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None

    def kind(self) -> str:
        return "SQLite" if self.path else "PostgreSQL"

    def on_disk(self) -> int:
        """SQLite: the file and its -wal; PostgreSQL: pg_database_size."""
        if self.path is None:
            return self._pg("SELECT pg_database_size(current_database())")[0][0]
        files = (self.path, self.path + "-wal")
        return sum(os.path.getsize(p) for p in files if os.path.exists(p))

    def pages(self) -> int | None:
        """SQLite: page_count x page_size as a reader sees it, the WAL's pages included: the
        file's size once checkpointed. The WAL file is reused, so on_disk() moves in steps."""
        if self.path is None:
            return None
        count = self._lite("PRAGMA page_count")[0][0]
        return count * self._lite("PRAGMA page_size")[0][0]

    def state_tables(self) -> dict[str, int] | None:
        """Bytes per state table, its indexes included; None if SQLite has no dbstat."""
        if self.path is None:
            rows = self._pg(
                "SELECT relname, pg_total_relation_size(oid) FROM pg_class"
                " WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace"
            )
        else:
            try:
                pages = dict(self._lite("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"))
            except sqlite3.OperationalError:
                return None
            rows = []
            for name, table in self._lite("SELECT name, tbl_name FROM sqlite_master"):
                rows.append((table, pages.get(name, 0)))
        found: dict[str, int] = {}
        for table, size in rows:
            if table in STATE_TABLES or table.startswith("state_"):
                found[table] = found.get(table, 0) + size
        return found

    def _lite(self, sql: str) -> list:
        # A fresh read-only connection each time: a kept one would hold back checkpoints.
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()

    def _pg(self, sql: str) -> list:
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(sql).fetchall()


class HubLateness:
    """Weir's own measure of how long its hub was held (weir_hub_lateness_seconds, from
    /metrics): what changed between `__enter__` and `__exit__`."""

    NAME = "weir_hub_lateness_seconds_bucket"

    def __init__(self, client_url: str):
        self.client_url = client_url
        self.buckets: dict[float, float] = {}

    def _read(self) -> dict[float, float]:
        samples = read_metrics(self.client_url)
        return {
            float(dict(labels)["le"]): value
            for (name, labels), value in samples.items()
            if name == self.NAME
        }

    def __enter__(self) -> "HubLateness":
        self._before = self._read()
        return self

    def __exit__(self, *exc) -> None:
        after = self._read()
        self.buckets = {le: after[le] - self._before.get(le, 0.0) for le in after}

    def over(self, seconds: float) -> int:
        """Wakes later than `seconds` (a bucket bound)."""
        return int(self.buckets[math.inf] - self.buckets[seconds])

    def line(self) -> str:
        """The count, and the bucket bound under which the longest stall fell."""
        total = int(self.buckets.get(math.inf, 0))
        longest = min((le for le, n in self.buckets.items() if n == total), default=math.inf)
        return f"{total} wakes, longest <= {longest * 1000:.0f} ms, over 50 ms: {self.over(0.05)}"


def probe_line(samples: list[float]) -> str:
    if not samples:
        return "no request"
    return f"{percentile(samples, 0.5):.1f} ms / {max(samples):.1f} ms, n={len(samples)}"


def print_figures(figures: list[Figure]) -> None:
    for f in figures:
        print(f"  {f.label:<40} {f.value}", flush=True)
