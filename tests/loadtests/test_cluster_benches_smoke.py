"""The cluster bench and the cluster limits at tiny sizes (seconds), on the suite's
PostgreSQL, so that neither rots: each runs to its end and prints every figure. The
figures themselves are the machine's (docs/operations.md, "Several instances")."""

import re
import subprocess
import sys

from tests.support.server import REPO


def run_module(module: str, *args: str) -> str:
    run = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(run.stdout)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_the_cluster_bench_prints_every_figure_beside_its_target(pg_cluster):
    out = run_module(
        "loadtests.cluster_bench",
        *("--parked", "12", "--rooms", "2", "--members", "2", "--connections", "4"),
        *("--duration", "1", "--rounds", "1", "--wake-rounds", "2"),
        *("--postgres", pg_cluster.url()),
    )
    assert re.search(r"^/versions: 1 instance [1-9]\d*/s, 2 instances [1-9]\d*/s", out, re.M)
    assert re.search(r"^mixed traffic: 1 instance [1-9]\d*/s, 2 instances [1-9]\d*/s", out, re.M)
    # Every send reached every member's sync, or the run said how many did.
    assert len(re.findall(r"messages delivered within the run \d+%", out)) == 2
    assert re.search(r"^12 parked on 2 instances: .* \(24 wake-ups\)", out, re.M)
    verdicts = out.split("against issue 39's targets")[1]
    assert len(re.findall(r"target", verdicts)) == 3


def test_the_cluster_limits_print_writes_notify_and_connections(pg_cluster):
    out = run_module(
        "loadtests.cluster_limits",
        *("--writers", "1", "--rooms", "1", "--duration", "1", "--listeners", "2"),
        *("--notify-clients", "2", "--notify-rate", "100", "--postgres", pg_cluster.url()),
    )
    assert re.search(r"1 writer\(s\) x 1 room\(s\): [1-9]\d* events/s", out)
    assert re.search(r"held p50 [\d.]+ ms, mean [\d.]+ ms, p99 [\d.]+ ms, over \d+ round", out)
    assert re.search(r"fsync=off: [1-9]\d* commits/s without NOTIFY", out)
    assert re.search(r"paced at 100/s: [1-9]\d*/s, heard", out)
    # The pool, the listener and the instance lock.
    assert re.search(r"weir-instance-a 1, weir-listen-a 1; \d+ in all", out)
