"""A short run of the load test (3 s per phase), so that it keeps working: the runner
starts Weir, the peers and locust, writes its results and judges them.

Its latency figures depend on the machine (they are judged by the runner, and printed
here); this test asserts what does not: the run completes, the summary has the shape other
tools read, nothing failed locally, the silent peers never held more connections than the
budget allows, every slot came back, and the report holds its plots."""

import json
import subprocess
import sys
import time

from tests.support.server import REPO

SUMMARY_SHAPE = {
    "phases": {
        "baseline": {"local": {"requests", "failures", "p50_ms", "p99_ms"}},
        "attack": {
            "local": {"requests", "failures", "p50_ms", "p99_ms"},
            "refusals": {"count", "p99_ms"},
        },
    },
    "tarpit": {"accepted", "max_concurrent"},
    "budgets_after": {"client_outbound", "media_fetch", "key_resolution"},
    "verdict": {"passed", "rules"},
}


def assert_shape(document: dict, shape: dict) -> None:
    for key, inner in shape.items():
        assert key in document, key
        if isinstance(inner, dict):
            assert_shape(document[key], inner)
        else:
            assert inner <= set(document[key]), (key, inner, set(document[key]))


def test_a_short_run_completes_and_judges(tmp_path):
    started = time.monotonic()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtests.run",
            "--duration",
            # Shorter runs see too few refusals (2 to 6 at 2 s) to count on one.
            "3",
            "--users",
            "4",
            "--element-users",
            "1",
            "--attackers",
            "40",
            "--main-pool-size",
            "56",
            "--tarpit-addresses",
            "8",
            "--results",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    print(f"\n{run.stdout}load test smoke run: {time.monotonic() - started:.1f}s")
    assert run.returncode in (0, 1), run.stderr[-3000:]  # 2: the run itself failed

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert_shape(summary, SUMMARY_SHAPE)
    verdict = summary["verdict"]
    assert run.returncode == (0 if verdict["passed"] else 1)
    ok = {r["rule"].split(":")[0].split(" (")[0]: r["ok"] for r in verdict["rules"]}
    assert ok["local requests failed, both phases"]
    assert ok["tarpit"] and ok["silent peers together"]
    assert ok["slots in flight after the run"]
    assert ok["main pool"]
    assert summary["budgets_after"]["client_outbound"] == 0
    assert summary["phases"]["attack"]["refusals"]["count"] > 0
    assert summary["tarpit"]["accepted"] > 0
    assert summary["phases"]["baseline"]["local"]["requests"] > 0

    report = (tmp_path / "report.html").read_text()
    assert report.count('src="data:image/png;base64,') == 3
    for name in (
        "baseline_stats.csv",
        "attack-local_stats.csv",
        "attack_stats.csv",
        "metrics.jsonl",
    ):
        assert (tmp_path / name).stat().st_size > 0, name
