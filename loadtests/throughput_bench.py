"""Prints Weir's throughput and latency beside bare Flask's, measured in the same run.

    .venv/bin/python -m loadtests.throughput_bench [--connections 50] [--duration 5]
                                                   [--rounds 3] [--log-level INFO]

Starts the real server (`app.py`, SQLite, its access log at `--log-level`, INFO being the
default) pinned to core 0 with taskset, and beside it a bare Flask app answering the same
`/versions` body on the same server stack (WeirWSGIServer, loadtests' `--bare-server`;
without Weir's access log, which bare Flask does not have), also pinned to core 0 and idle
while the other is measured. wrk (`make bench` installs it) runs from core 1:
`-t1 -c<connections>`, one run per target per round, the targets taking turns so that a
disturbance on a shared machine falls on all of them alike. For each target: req/s, p50
and p99 (wrk's latency distribution), best and median over the rounds, and the server's CPU
time per request (from /proc, its user and system time over the run): on a shared machine,
where another process may take the server's core, req/s falls with the share the server
got; CPU per request does not, and its ratio is the one to trust.

Targets: bare Flask `/versions`; Weir's `/versions`; an authenticated `/account/whoami`
(one access-token lookup in the database); the local `/publicRooms` (20 public rooms).
"""

from gevent import monkey

monkey.patch_all()

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

import requests

from tests.support.server import REPO, write_config

READY = re.compile(r"^weir ready client=(http://\S+)")
BARE_READY = re.compile(r"^bare ready (http://\S+)")
VERSIONS = "/_matrix/client/versions"
WHOAMI = "/_matrix/client/v3/account/whoami"
PUBLIC_ROOMS = "/_matrix/client/v3/publicRooms"
SERVER_CORE, CLIENT_CORE = "0", "1"


def bare_server() -> None:
    """Bare Flask on Weir's server stack: the baseline the ratio is measured against."""
    from flask import Flask, Response

    from homeserver.api.client.versions import SUPPORTED_VERSIONS
    from homeserver.http.places import WorkPool
    from homeserver.http.responses import json_response
    from homeserver.http.server import WeirWSGIServer

    app = Flask("bare")
    body = json_response({"versions": SUPPORTED_VERSIONS, "unstable_features": {}}).data

    @app.get(VERSIONS)
    def versions():
        return Response(body, mimetype="application/json")

    server = WeirWSGIServer(("127.0.0.1", 0), app, pool=WorkPool(1000), keepalive_timeout=75)
    server.start()
    print(f"bare ready http://127.0.0.1:{server.server_port}", flush=True)
    server.serve_forever()


def start(args: list[str], ready: re.Pattern, log_path: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        ["taskset", "-c", SERVER_CORE, *args],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=open(log_path, "w"),
    )
    for line in proc.stdout:
        match = ready.match(line)
        if match:
            return proc, match.group(1)
    raise RuntimeError(f"{args} did not start; see {log_path}")


def cpu_seconds(pid: int) -> float:
    """The process's user and system time so far (/proc/<pid>/stat, fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk_command(
    url: str,
    connections: int,
    duration: int,
    token: str | None = None,
    cores: str = CLIENT_CORE,
    script: tuple[str, ...] = (),
) -> list[str]:
    """wrk on `cores`, one thread; `script`: a Lua file and the arguments it is given."""
    command = ["taskset", "-c", cores, "wrk", "-t1", f"-c{connections}", f"-d{duration}s"]
    command += ["--latency", "--timeout", "30s"]  # a slower answer than wrk's 2 s is counted
    if token:
        command += ["-H", f"Authorization: Bearer {token}"]
    if script:
        command += ["-s", script[0], url, "--", *script[1:]]
    else:
        command.append(url)
    return command


def parse_wrk(out: str, url: str) -> dict:
    """Requests done, req/s, p50 and p99 in ms, from wrk's report; error answers raise."""
    latency = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)\s*$", out, re.M))
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non_2xx:
        raise RuntimeError(f"{url}: {non_2xx.group(1)} error responses")
    socket_errors = re.search(r"Socket errors: (.*)$", out, re.M)
    if socket_errors:
        raise RuntimeError(f"{url}: socket errors: {socket_errors.group(1)}")
    return {
        "requests": int(re.search(r"(\d+) requests in", out).group(1)),
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p50": _ms(latency["50"]),
        "p99": _ms(latency["99"]),
    }


def wrk(url: str, connections: int, duration: int, token: str | None, pid: int) -> dict:
    cpu_before = cpu_seconds(pid)
    command = wrk_command(url, connections, duration, token)
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    cpu = cpu_seconds(pid) - cpu_before
    result = parse_wrk(out, url)
    return {**result, "cpu_us": cpu / result["requests"] * 1e6}


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(\w+)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--bare-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_server:
        return bare_server()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: `make bench` installs it (apt-get, as root)")

    directory = tempfile.mkdtemp(prefix="weir-throughput-")
    config_path = os.path.join(directory, "config.toml")
    write_config(
        config_path,
        {
            "server_name": "bench.test",
            "data_dir": os.path.join(directory, "data"),
            "server": {"http": {"port": 0}},
            "federation": {"port": 0},
            "registration": {"enabled": True},
            "logging": {"level": args.log_level},
        },
    )
    procs = []
    try:
        weir, weir_url = start(
            [sys.executable, "app.py", "--config", config_path],
            READY,
            os.path.join(directory, "weir.log"),
        )
        procs.append(weir)
        bare, bare_url = start(
            [sys.executable, "-m", "loadtests.throughput_bench", "--bare-server"],
            BARE_READY,
            os.path.join(directory, "bare.log"),
        )
        procs.append(bare)
        token = setup(weir_url)
        targets = [
            ("bare Flask /versions", bare_url + VERSIONS, None, bare.pid),
            ("Weir /versions", weir_url + VERSIONS, None, weir.pid),
            ("Weir /account/whoami", weir_url + WHOAMI, token, weir.pid),
            ("Weir /publicRooms (local)", weir_url + PUBLIC_ROOMS, token, weir.pid),
        ]
        for _, url, tok, pid in targets:  # warm up: caches, the allocator, the CPU's clock
            wrk(url, args.connections, 1, tok, pid)
        results: dict[str, list[dict]] = {name: [] for name, _, _, _ in targets}
        for _ in range(args.rounds):
            for name, url, tok, pid in targets:
                results[name].append(wrk(url, args.connections, args.duration, tok, pid))
        report(results, args)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=20)
        shutil.rmtree(directory, ignore_errors=True)


def setup(url: str) -> str:
    """A user, and 20 public rooms for the directory; returns the user's access token."""
    r = requests.post(
        url + "/_matrix/client/v3/register",
        json={"username": "bench", "password": "bench-password", "auth": {"type": "m.login.dummy"}},
    )
    r.raise_for_status()
    token = r.json()["access_token"]
    for i in range(20):
        requests.post(
            url + "/_matrix/client/v3/createRoom",
            json={"visibility": "public", "name": f"room {i}"},
            headers={"Authorization": f"Bearer {token}"},
        ).raise_for_status()
    return token


def report(results: dict[str, list[dict]], args) -> None:
    cpus = os.cpu_count()
    print(
        f"wrk -t1 -c{args.connections} -d{args.duration}s, {args.rounds} rounds; server on "
        f"core {SERVER_CORE}, wrk on core {CLIENT_CORE} ({cpus} cores, load average "
        f"{os.getloadavg()[0]:.1f}); access log at {args.log_level}"
    )
    print(
        f"{'target':<28}{'req/s best':>11}{'median':>8}{'p50 ms':>8}{'p99 ms':>8}"
        f"{'p99/p50':>8}{'cpu µs/req min':>16}{'median':>8}"
    )
    medians, cpu = {}, {}
    for name, runs in results.items():
        rps = [r["rps"] for r in runs]
        p50 = statistics.median(r["p50"] for r in runs)
        p99 = statistics.median(r["p99"] for r in runs)
        medians[name] = statistics.median(rps)
        cpu[name] = statistics.median(r["cpu_us"] for r in runs)
        print(
            f"{name:<28}{max(rps):>11.0f}{medians[name]:>8.0f}{p50:>8.1f}{p99:>8.1f}"
            f"{p99 / p50:>8.1f}{min(r['cpu_us'] for r in runs):>16.1f}{cpu[name]:>8.1f}"
        )
    bare, versions, whoami = "bare Flask /versions", "Weir /versions", "Weir /account/whoami"
    print(
        f"Weir /versions / bare Flask: {medians[versions] / medians[bare]:.0%} (median req/s), "
        f"{cpu[bare] / cpu[versions]:.0%} (median CPU per request); whoami / versions: "
        f"{medians[whoami] / medians[versions]:.0%} (req/s), "
        f"{cpu[versions] / cpu[whoami]:.0%} (CPU)"
    )
    # A slow spell on a shared machine lasts longer than one run: the runs of one round,
    # back to back, are compared with each other, and the ratios' median reported.
    print(
        f"by round: Weir /versions / bare Flask {paired(results[versions], results[bare])}; "
        f"whoami / versions {paired(results[whoami], results[versions])} (req/s)"
    )


def paired(runs: list[dict], baseline: list[dict]) -> str:
    ratios = sorted(run["rps"] / base["rps"] for run, base in zip(runs, baseline))
    return f"median {statistics.median(ratios):.0%}, {ratios[0]:.0%}–{ratios[-1]:.0%}"


if __name__ == "__main__":
    main()
