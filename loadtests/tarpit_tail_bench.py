"""The tarpit attack's tail: local `/versions` and `/publicRooms` p99 while attackers aim Weir
at one tarpit server, for this build and an earlier one in the same run. Judged.

    .venv/bin/python -m loadtests.tarpit_tail_bench [--previous 759e62d] [--attackers 100]
        [--users 10] [--seconds 30] [--rounds 2] [--one-address]

The attack: `--attackers` clients, all from one address, each sending at most one request a
second, each request a unique alias, media ID or `limit` at the tarpit's server name (so no
cache or coalescing answers it), and each abandoned by its client after 15 s. The tarpit
accepts and never answers, not even TLS (tests/peers/tarpit.py). Meanwhile `--users` local
users, each from an address of its own, call `/versions`, the local `/publicRooms` and login,
with a 1 s pause after each.

Both builds run at once, each a server process of its own on core 0 (the `--previous`
commit is exported from git into a temporary directory), and take turns: in each of
`--rounds` rounds, each build has a baseline phase (the users alone) and an attack phase
(users and attackers) of `--seconds` each, and the next turn starts once the tarpit holds no
connection. The users and the attackers are processes of their own on core 1.

It prints each build's p50/p99 per phase and endpoint, and exits 1 unless this build's
attack p99 of `/versions` and of `/publicRooms` is within 1.5 x its baseline + 20 ms (the
issue's bound). Logins are printed, not judged: scrypt costs ~75 ms by design.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import http.client
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid

import gevent

from loadtests.peers import pick_ip
from tests.peers.tarpit import Tarpit
from tests.support.server import REPO, MatrixClient, WeirProcess, base_settings, merge

V3 = "/_matrix/client/v3"
PATHS = {
    "/versions": "/_matrix/client/versions",
    "/publicRooms": V3 + "/publicRooms",
}
ABANDON_SECONDS = 15.0
ATTACKER_ADDRESS = "10.66.0.1"
SERVER_CORE, LOAD_CORE = "0", "1"
PASSWORD = "tarpit tail bench"
LOOPBACK = ["127.0.0.0/8"]


def within_bound(baseline_p99: float, attack_p99: float) -> bool:
    return attack_p99 <= 1.5 * baseline_p99 + 20.0


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


# -- the two load processes ------------------------------------------------------------------


def local_users(host: str, port: int, users: int, seconds: float) -> dict:
    """Milliseconds per request by endpoint, from `users` users of their own addresses."""
    samples: dict[str, list[float]] = {name: [] for name in (*PATHS, "login")}
    end = time.monotonic() + seconds

    def user(i: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=60)
        headers = {"X-Forwarded-For": f"10.77.0.{i + 1}"}
        login = json.dumps(
            {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": f"user{i}"},
                "password": PASSWORD,
            }
        )
        gevent.sleep(random.uniform(0, 1))
        while time.monotonic() < end:
            for name, method, path, body in (
                ("/versions", "GET", PATHS["/versions"], None),
                ("/publicRooms", "GET", PATHS["/publicRooms"], None),
                ("login", "POST", V3 + "/login", login),
            ):
                started = time.perf_counter()
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    raise RuntimeError(f"{path}: {response.status}")
                samples[name].append((time.perf_counter() - started) * 1000)
                gevent.sleep(1)
        conn.close()

    gevent.joinall([gevent.spawn(user, i) for i in range(users)], raise_error=True)
    return samples


def attackers(host: str, port: int, count: int, seconds: float, target: str) -> dict:
    """Statuses of the attack's requests ("abandoned" when the client gave up)."""
    outcomes: dict[str, int] = {}
    end = time.monotonic() + seconds
    quoted = urllib.parse.quote(target)

    def unique_path(n: int) -> str:
        kind = n % 3
        if kind == 0:
            return f"{V3}/directory/room/{urllib.parse.quote(f'#a{uuid.uuid4().hex}:{target}')}"
        if kind == 1:
            return f"/_matrix/media/v3/download/{quoted}/m{uuid.uuid4().hex}"
        return f"{V3}/publicRooms?server={quoted}&limit={random.randrange(1, 10**9)}"

    def attacker(i: int) -> None:
        gevent.sleep(random.uniform(0, 1))
        n = i
        while time.monotonic() < end:
            started = time.monotonic()
            conn = http.client.HTTPConnection(host, port, timeout=ABANDON_SECONDS)
            try:
                conn.request("GET", unique_path(n), headers={"X-Forwarded-For": ATTACKER_ADDRESS})
                response = conn.getresponse()
                response.read()
                outcome = str(response.status)
            except TimeoutError:
                outcome = "abandoned"
            finally:
                conn.close()
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            n += 1
            gevent.sleep(max(0.0, 1.0 - (time.monotonic() - started)))

    gevent.joinall([gevent.spawn(attacker, i) for i in range(count)], raise_error=True)
    return outcomes


def load_process(args) -> int:
    host, _, port = args.url.removeprefix("http://").rpartition(":")
    if args.role == "users":
        found = local_users(host, int(port), args.users, args.seconds)
    else:
        found = attackers(host, int(port), args.attackers, args.seconds, args.target)
    json.dump(found, sys.stdout)
    return 0


# -- the run ---------------------------------------------------------------------------------


class Build:
    def __init__(self, label: str, repo: str, directory: str, tarpit: Tarpit, args):
        self.label = label
        data = os.path.join(directory, label)
        os.makedirs(data)
        settings = merge(
            base_settings(os.path.join(data, "data")),
            {
                # Trusting loopback makes each X-Forwarded-For address a client of its own.
                "server": {"http": {"trusted_proxies": [] if args.one_address else LOOPBACK}},
                "federation": {"ip_range_allowlist": [f"{tarpit.host}/32"]},
                "logging": {"level": "WARNING"},
            },
        )
        launcher = ("taskset", "-c", SERVER_CORE) if (os.cpu_count() or 1) > 1 else ()
        self.weir = WeirProcess(data, settings, repo=repo, launcher=launcher).start()
        self.samples: dict[str, dict[str, list[float]]] = {"baseline": {}, "attack": {}}
        self.outcomes: dict[str, int] = {}
        self.cpu: dict[str, float] = {"baseline": 0.0, "attack": 0.0}
        for i in range(args.users):
            MatrixClient(self.weir.client_url).register(f"user{i}", PASSWORD)
        creator = MatrixClient(self.weir.client_url)
        creator.register("creator", PASSWORD)
        for n in range(5):  # a local room list of a few entries
            creator.post(
                V3 + "/createRoom",
                json={"preset": "public_chat", "visibility": "public", "name": f"Room {n}"},
            ).raise_for_status()

    def phase(self, name: str, args, target: str) -> None:
        cpu = self.weir.cpu_seconds()
        started = time.monotonic()
        users = spawn_load(args, "users", self.weir.client_url, target)
        attack = None
        if name == "attack":
            attack = spawn_load(args, "attackers", self.weir.client_url, target)
        for endpoint, samples in collect(users).items():
            self.samples[name].setdefault(endpoint, []).extend(samples)
        if attack is not None:
            for outcome, n in collect(attack).items():
                self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n
        self.cpu[name] += (self.weir.cpu_seconds() - cpu) / (time.monotonic() - started)


def spawn_load(args, role: str, url: str, target: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "loadtests.tarpit_tail_bench", "--role", role]
    command += ["--url", url, "--seconds", str(args.seconds), "--target", target]
    command += ["--users", str(args.users), "--attackers", str(args.attackers)]
    if (os.cpu_count() or 1) > 1:
        command = ["taskset", "-c", LOAD_CORE, *command]
    return subprocess.Popen(command, stdout=subprocess.PIPE, cwd=REPO)


def collect(process: subprocess.Popen) -> dict:
    out, _ = process.communicate(timeout=600)
    if process.returncode != 0:
        raise RuntimeError(f"a load process exited with {process.returncode}")
    return json.loads(out)


def export(ref: str, directory: str) -> str:
    """The tree of `ref`, written out of git into `directory`."""
    target = os.path.join(directory, f"build-{ref}")
    os.makedirs(target)
    archive = subprocess.run(["git", "-C", REPO, "archive", ref], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", target], input=archive.stdout, check=True)
    return target


def report(builds: list[Build]) -> bool:
    print(f"\ncores: {os.cpu_count()}; load average {os.getloadavg()[0]:.2f}")
    print(f"{'build':<16} {'endpoint':<13} {'baseline p50/p99 ms':>20} {'attack p50/p99 ms':>20}")
    passed = True
    for build in builds:
        base, attack = build.samples["baseline"], build.samples["attack"]
        for endpoint in (*PATHS, "login"):
            b, a = base.get(endpoint, []), attack.get(endpoint, [])
            verdict = ""
            if endpoint in PATHS:
                ok = within_bound(percentile(b, 0.99), percentile(a, 0.99))
                verdict = "within 1.5x + 20 ms" if ok else "OVER 1.5x + 20 ms"
                if build is builds[-1]:
                    passed = passed and ok
            print(
                f"{build.label:<16} {endpoint:<13} "
                f"{percentile(b, 0.5):>9.1f}/{percentile(b, 0.99):<9.1f} "
                f"{percentile(a, 0.5):>9.1f}/{percentile(a, 0.99):<9.1f} "
                f"n={len(b)}/{len(a)} {verdict}"
            )
        cpu = build.cpu
        print(
            f"{build.label:<16} server CPU {cpu['baseline']:.0%} -> {cpu['attack']:.0%} of a core;"
            f" attack outcomes {dict(sorted(build.outcomes.items()))}"
        )
    return passed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--previous", default="759e62d")
    parser.add_argument("--attackers", type=int, default=100)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--one-address", action="store_true", help="trust no proxy: every client is 127.0.0.1"
    )
    parser.add_argument("--role", choices=("users", "attackers"))
    parser.add_argument("--url")
    parser.add_argument("--target")
    args = parser.parse_args()
    if args.role:
        return load_process(args)
    directory = tempfile.mkdtemp(prefix="weir-tarpit-tail-")
    builds: list[Build] = []
    try:
        with Tarpit(pick_ip()) as tarpit:
            target = f"{tarpit.host}:{tarpit.port}"
            previous = export(args.previous, directory)
            builds = [
                Build(args.previous, previous, directory, tarpit, args),
                Build("this build", REPO, directory, tarpit, args),
            ]
            for round_number in range(args.rounds):
                for build in builds:
                    for phase in ("baseline", "attack"):
                        print(f"round {round_number + 1}: {build.label}, {phase}", flush=True)
                        build.phase(phase, args, target)
                        if not tarpit.wait_current(0, timeout=120):
                            raise RuntimeError("the tarpit still holds connections after 120 s")
            passed = report(builds)
    finally:
        for build in builds:
            build.weir.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
