"""The load test: Weir under a peer that never answers, while local users work. Judged.

    python -m loadtests.run [--duration 60] [--users 20] [--element-users 4]
                            [--attackers 100] [--main-pool-size 144] [--results DIR]

Starts the peers (loadtests/peers.py), Weir in pool mode on SQLite trusting loopback as its
proxy (`trusted_proxies`, so each X-Forwarded-For address is a client), and locust
headless; then runs two phases of `--duration` seconds each:

1. baseline: the local users (and the Element users) alone;
2. attack: the attackers first (the run waits until all of them are spawned), then the same
   users for the same time; then the attackers stop.

Meanwhile it scrapes /metrics twice a second. At the end it waits (at most the directory
deadline and a margin) for every budget to be back to zero, and writes
`loadtests/results/<timestamp>/`: locust's CSVs per process, the per-request samples,
`summary.json`, `metrics.jsonl`, `report.html` with plots, and every process's log. It
prints one summary table and exits 0 if every judged figure passed (loadtests/judge.py), 1
if one failed, and 2 if the run itself could not be made.

Sizes. The client outbound budget is half the main pool. The default pool (144, a cap of
72) is smaller than the 80 attackers at the directory, so both of the budget's caps refuse
them; and it still holds the local users' keep-alive connections (one each, six for each
Element user), the 72 held lookups and the attackers' short-lived connections, so nobody
waits for a place in it (judged). Remote media has a budget and a pool of its own (ADR-0121),
at their defaults: the 20 media attackers' 80 requests overrun its 64.

Measurement on a small machine. Weir, the locust processes and the peers share its cores
(and on a shared machine, with whatever else runs there: the figures name the core count
and the load average). Hence the modest defaults. The local users run in a locust process
of their own, the same in both phases, so its overhead is the same in both. The attackers'
client costs CPU that the server then lacks, which a real attacker's would not, so the
attackers are paced (a burst of two lookups every one to three seconds each): enough to take
every slot as soon as it frees, not a flood of refusals, which would be an attack on CPU
that rate limits at the load balancer answer, not ADR-0079. Refusal times are judged as
Weir's access log has them; what the attackers' client saw is reported beside them.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime

import gevent
from gevent.event import Event
from gevent.pool import Pool

from homeserver.federation.admission import DIRECTORY_DEADLINE_SECONDS, MEDIA_DEADLINE_SECONDS
from loadtests import judge, report
from loadtests.scenario import MEDIA_ATTACKER_EVERY, read_samples, write_plan
from tests.support.metrics import read_metrics
from tests.support.server import REPO, MatrixClient, WeirProcess, terminate

LOCUSTFILE = os.path.join(REPO, "loadtests", "locustfile.py")
RESULTS = os.path.join(REPO, "loadtests", "results")
SCRAPE_INTERVAL = 0.5
USERS_PER_ROOM = 10
ELEMENT_CONNECTIONS = 6  # each Element user's keep-alive connections, as a browser's
MEDIA_BYTES = 32 * 1024
# Attackers still waiting on a silent peer are cut off when their process exits; their slots
# come back at once. This is how long the run waits for that before judging.
DRAIN_SECONDS = max(DIRECTORY_DEADLINE_SECONDS, MEDIA_DEADLINE_SECONDS) + 5


class RunFailed(Exception):
    """The run could not be made (a process did not start, or did not end): exit 2."""


class Child:
    """A child process; one of its output streams is read line by line (and kept in a log
    file), so the run can wait for a line instead of sleeping."""

    def __init__(self, name: str, args: list[str], log_path: str, read: str = "stdout"):
        self.name = name
        self.log = open(log_path, "w")
        streams = (
            {"stdout": subprocess.PIPE, "stderr": self.log}
            if read == "stdout"
            else {"stdout": self.log, "stderr": subprocess.PIPE}
        )
        self.proc = subprocess.Popen(args, cwd=REPO, text=True, **streams)
        self.lines: list[str] = []
        self._changed = Event()
        self._reader = gevent.spawn(self._read, getattr(self.proc, read))

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))
            if stream is self.proc.stderr:
                self.log.write(line)
            self._notify()
        self._notify()  # the end of the stream: waiters look at the exit code

    def _notify(self) -> None:
        changed, self._changed = self._changed, Event()
        changed.set()

    def wait_line(self, pattern: str, timeout: float, after: int = 0) -> str:
        """The first line matching `pattern` from line number `after` on."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = after
        while True:
            for line in self.lines[seen:]:
                if regex.search(line):
                    return line
            seen = len(self.lines)
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc.poll() is not None and self._reader.dead):
                raise RunFailed(
                    f"{self.name}: no line matching {pattern!r} "
                    f"(exit code {self.proc.poll()}); see {self.log.name}"
                )
            self._changed.wait(left)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise RunFailed(f"{self.name} did not end within {timeout:.0f}s") from None

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM (then SIGKILL); idempotent."""
        terminate(self.proc, timeout)
        self._reader.join(timeout=5)
        self.log.close()
        return self.proc.returncode


class Peers(Child):
    def __init__(self, directory: str, args):
        super().__init__(
            "peers",
            [
                sys.executable,
                "-m",
                "loadtests.peers",
                "--directory",
                directory,
                "--tarpit-addresses",
                str(args.tarpit_addresses),
                "--drip-interval",
                str(args.drip_interval),
                "--counters",
                os.path.join(directory, "counters.json"),
            ],
            os.path.join(directory, "peers.log"),
        )

    def wait_ready(self) -> dict:
        """Where everything is: the DNS server, the CA, the attack targets."""
        return json.loads(self.wait_line(r"^peers ready ", 60).split(" ", 2)[2])

    def counters(self) -> dict:
        """Asks the peers for their counters now (SIGUSR1) and waits for the answer."""
        after = len(self.lines)
        self.proc.send_signal(signal.SIGUSR1)
        return json.loads(self.wait_line(r"^counters ", 30, after).split(" ", 1)[1])


class Scraper:
    """Reads /metrics every SCRAPE_INTERVAL seconds, keeping what the report plots."""

    def __init__(self, client_url: str):
        self.client_url = client_url
        self.rows: list[dict] = []
        self._greenlet = gevent.spawn(self._loop)

    def read(self) -> dict:
        samples = read_metrics(self.client_url)
        row: dict = {
            "t": time.time(),
            "in_flight": {},
            "capacity": {},
            "refusals": {},
            "pool": {},
            "pool_size": {},
            "threadpool_queued": {},
            "deadline_expiries": 0.0,
        }
        families = {
            "weir_budget_in_flight": "in_flight",
            "weir_budget_capacity": "capacity",
            "weir_budget_refusals_total": "refusals",
            "weir_pool_greenlets": "pool",
            "weir_pool_size": "pool_size",
            "weir_threadpool_queued": "threadpool_queued",
        }
        for (name, labels), value in samples.items():
            labels = dict(labels)
            if name in families:
                row[families[name]][labels.get("budget") or labels.get("pool")] = value
            elif name == "weir_outbound_deadline_expiries_total":
                row["deadline_expiries"] += value
        return row

    def _loop(self) -> None:
        while True:
            try:
                self.rows.append(self.read())
            except Exception as e:  # a missed scrape is a gap in a plot, not a failed run
                print(f"metrics scrape failed: {e}", file=sys.stderr)
            gevent.sleep(SCRAPE_INTERVAL)

    def stop(self) -> None:
        self._greenlet.kill()


class LoadTest:
    def __init__(self, args, results: str):
        self.args = args
        self.results = results
        self.children: list[Child] = []
        self.peers: Peers | None = None
        self.peer_info: dict = {}
        self.weir: WeirProcess | None = None
        self.scraper: Scraper | None = None
        self.phases: dict[str, tuple[float, float]] = {}
        self.weir_cpu: dict[str, float] = {}

    # -- starting --------------------------------------------------------------------------

    def start(self) -> None:
        for folder in ("peers", "weir"):
            os.makedirs(self.path(folder), exist_ok=True)
        self.peers = Peers(self.path("peers"), self.args)
        self.children.append(self.peers)
        info = self.peer_info = self.peers.wait_ready()
        settings = {
            "server_name": "weir.load",
            "public_baseurl": "http://127.0.0.1/",
            "data_dir": self.path("weir", "data"),
            "server": {
                "http": {
                    "port": 0,
                    "main_pool_size": self.args.main_pool_size,
                    "trusted_proxies": ["127.0.0.0/8"],
                }
            },
            "federation": {
                "port": 0,
                "dns_nameservers": [info["dns"]],
                "ca_file": info["ca_file"],
                "ip_range_allowlist": [info["allow"]],
            },
            "registration": {"enabled": True},
            # The setup registers every user from this one address.
            "ratelimiting": {"registration": {"max_requests": 100000, "per_seconds": 1}},
            # The judge reads Weir's refusal times from its access log.
            "logging": {"format": "json"},
        }
        self.weir = WeirProcess(self.path("weir"), settings)
        self.weir.start()
        self.scraper = Scraper(self.weir.client_url)

    def path(self, *parts: str) -> str:
        return os.path.join(self.results, *parts)

    def setup(self) -> str:
        """Accounts, rooms of ten (public, so the local room list has them) and one media
        file; returns the plan file for locust."""
        url = self.weir.client_url
        users = [
            {"localpart": f"load{i}", "password": f"pw-{i}-{os.urandom(4).hex()}"}
            for i in range(self.args.users)
        ]
        clients = [MatrixClient(url) for _ in users]

        def register(i: int) -> None:
            user = users[i]
            user["access_token"] = clients[i].register(user["localpart"], user["password"])[
                "access_token"
            ]

        Pool(8).map(register, range(len(users)))
        for start in range(0, len(users), USERS_PER_ROOM):
            creator = clients[start]
            r = creator.post(
                "/_matrix/client/v3/createRoom",
                json={
                    "preset": "public_chat",
                    "visibility": "public",
                    "name": f"Load room {start // USERS_PER_ROOM}",
                },
            )
            r.raise_for_status()
            room_id = r.json()["room_id"]
            for i in range(start, min(start + USERS_PER_ROOM, len(users))):
                if i != start:
                    clients[i].post(f"/_matrix/client/v3/join/{room_id}").raise_for_status()
                users[i]["room_id"] = room_id
        r = clients[0].post(
            "/_matrix/media/v3/upload?filename=load.bin",
            data=os.urandom(MEDIA_BYTES),
            headers={"Content-Type": "application/octet-stream"},
        )
        r.raise_for_status()
        plan = {
            "users": users,
            "media": r.json()["content_uri"][len("mxc://") :],
            "honest": self.peer_info["honest"],
            "honest_images": self.peer_info["honest_images"],
            "attack": self.peer_info["targets"],
            # Each user logs in once per phase, at a random moment within this.
            "login_within_s": self.args.duration * 0.9,
        }
        path = self.path("plan.json")
        write_plan(path, plan)
        return path

    # -- phases ----------------------------------------------------------------------------

    def locust(
        self,
        name: str,
        user_classes: dict[str, int],
        spawn_rate: float,
        plan: str,
        phase: str,
        run_time: float | None = None,
    ) -> Child:
        """A headless locust process running `user_classes` ({class name: how many})."""
        users = sum(user_classes.values())
        args = [
            sys.executable,
            "-m",
            "locust",
            "-f",
            LOCUSTFILE,
            "--headless",
            "--host",
            self.weir.client_url,
            "-u",
            str(users),
            "-r",
            f"{spawn_rate:g}",
            "--csv",
            self.path(name),
            "--only-summary",
            "--stop-timeout",
            "0",
            "--weir-plan",
            plan,
            "--weir-samples",
            self.path(f"{name}-samples.csv"),
            "--weir-phase",
            phase,
        ]
        if "ElementUser" in user_classes:
            args += [
                "--weir-local-users",
                str(user_classes["LocalUser"]),
                "--weir-element-users",
                str(user_classes["ElementUser"]),
            ]
        if run_time is not None:
            args += ["-t", f"{run_time:g}s"]
        child = Child(
            f"locust {name}", args + list(user_classes), self.path(f"{name}.log"), read="stderr"
        )
        self.children.append(child)
        return child

    def run_local_users(self, name: str, plan: str, phase: str) -> None:
        """The local users and the Element users, in a locust process of their own."""
        duration = self.args.duration
        users = {"LocalUser": self.args.users, "ElementUser": self.args.element_users}
        local = self.locust(
            name, users, max(1.0, sum(users.values()) / 2), plan, phase, run_time=duration
        )
        local.wait(duration + 120)
        local.stop()

    def baseline(self, plan: str) -> None:
        with self.phase("baseline"):
            self.run_local_users("baseline", plan, "baseline")

    def attack(self, plan: str) -> None:
        with self.phase("attack"):
            attackers = self.locust(
                "attack",
                {"Attacker": self.args.attackers},
                max(1.0, self.args.attackers / 2),
                plan,
                "attack",
            )
            attackers.wait_line(r"All users spawned", 120)
            started = time.time()
            self.run_local_users("attack-local", plan, "attack")
            self.phases["attack: local users"] = (started, time.time())
            attackers.stop()

    @contextlib.contextmanager
    def phase(self, name: str):
        started, cpu = time.time(), self.weir.cpu_seconds()
        yield
        self.phases[name] = (started, time.time())
        self.weir_cpu[name] = round(self.weir.cpu_seconds() - cpu, 2)

    def drain(self) -> tuple[dict, float]:
        """Budgets in flight once they are all back to zero, or after DRAIN_SECONDS. (Weir
        offers no event across processes: this re-reads /metrics.)"""
        started = time.monotonic()
        while True:
            row = self.scraper.read()
            waited = time.monotonic() - started
            if not any(row["in_flight"].values()) or waited > DRAIN_SECONDS:
                return row, waited
            gevent.sleep(0.1)

    # -- stopping --------------------------------------------------------------------------

    def close(self) -> dict:
        """Stops everything; returns the exit codes."""
        if self.scraper is not None:
            self.scraper.stop()
        codes = {child.name: child.stop() for child in reversed(self.children)}
        if self.weir is not None:
            codes["weir"] = self.weir.stop()
            if not self.args.keep_data:
                shutil.rmtree(self.path("weir", "data"), ignore_errors=True)
        return codes


def machine() -> dict:
    return {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]}


def run(args) -> int:
    results = args.results or os.path.join(RESULTS, datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(results, exist_ok=True)
    test = LoadTest(args, results)
    machine_before = machine()
    try:
        test.start()
        plan = test.setup()
        test.baseline(plan)
        # Nothing should have reached the silent peers yet: kept to show it.
        peers_after_baseline = test.peers.counters()
        test.attack(plan)
        after, drained_in = test.drain()
        peers = test.peers.counters()
    except Exception as e:
        print(f"load test: the run failed: {e!r}", file=sys.stderr)
        test.close()
        return 2
    exit_codes = test.close()

    samples = {
        "baseline": read_samples(test.path("baseline-samples.csv")),
        "attack_local": read_samples(test.path("attack-local-samples.csv")),
        "attack": read_samples(test.path("attack-samples.csv")),
    }
    caps = {name: int(v) for name, v in after["capacity"].items()}
    budgets_after = {name: int(v) for name, v in after["in_flight"].items()}
    main_pool = {
        "size": args.main_pool_size,
        "max_greenlets": int(
            max(row["pool"].get("main", 0) for row in test.scraper.rows + [after])
        ),
    }
    with open(test.weir.stderr_path) as f:
        weir_log = f.readlines()
    summary = judge.summarize(
        samples,
        weir_log,
        peers,
        caps,
        budgets_after,
        main_pool,
        config={
            "duration_s": args.duration,
            "users": args.users,
            "element_users": args.element_users,
            "attackers": args.attackers,
            "main_pool_size": args.main_pool_size,
            "tarpit_addresses": args.tarpit_addresses,
        },
        machine={"before": machine_before, "after": machine()},
        peers_after_baseline=peers_after_baseline,
        drained_in_s=round(drained_in, 2),
        exit_codes=exit_codes,
        phase_times=test.phases,
        weir_cpu_s=test.weir_cpu,
    )
    with open(os.path.join(results, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(results, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in test.scraper.rows)
    report.write_html(
        os.path.join(results, "report.html"), summary, samples, test.phases, test.scraper.rows
    )
    print(report.summary_table(summary))
    print(f"results: {results}")
    return 0 if summary["verdict"]["passed"] else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration", type=float, default=60, help="seconds per phase")
    parser.add_argument("--users", type=int, default=20, help="local users")
    parser.add_argument(
        "--element-users",
        type=int,
        default=4,
        help="users viewing the honest peer's images as Element does",
    )
    parser.add_argument("--attackers", type=int, default=100, help="attacking users")
    parser.add_argument(
        "--main-pool-size",
        type=int,
        default=144,
        help="Weir's server.http.main_pool_size; the client outbound budget "
        "is half of it (see the module's doc)",
    )
    parser.add_argument(
        "--tarpit-addresses",
        type=int,
        default=64,
        help="ports the tarpit listens on (the cool-down is per address)",
    )
    parser.add_argument(
        "--drip-interval",
        type=float,
        default=2.0,
        help="seconds between two bytes of the slow drip",
    )
    parser.add_argument(
        "--results", default=None, help="output folder (default loadtests/results/<timestamp>)"
    )
    parser.add_argument(
        "--keep-data",
        action="store_true",
        help="keep Weir's data folder (database, media) in the results",
    )
    args = parser.parse_args(argv)
    cap = args.main_pool_size // 2
    directory_attackers = args.attackers - args.attackers // MEDIA_ATTACKER_EVERY
    if directory_attackers <= cap:
        print(
            f"note: {directory_attackers} directory attackers never fill the client outbound "
            f"budget ({cap}); only its per-client cap will refuse them",
            file=sys.stderr,
        )
    local = args.users + ELEMENT_CONNECTIONS * args.element_users
    if local + cap > args.main_pool_size:
        print(
            f"note: {local} local connections and {cap} held lookups do not fit in a "
            f"main pool of {args.main_pool_size}: connections will wait for a place",
            file=sys.stderr,
        )
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
