"""The load test's report: one printed table, and a self-contained HTML page with plots."""

from __future__ import annotations

import base64
import html
import io
import json

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt

from loadtests.judge import per_second
from loadtests.scenario import ATTACK, LOCAL, REFUSED

PHASE_COLOURS = {"baseline": "tab:blue", "attack": "tab:red"}


def _ms(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _login_line(phases: dict) -> str:
    """Login p50 per phase: scrypt on its own thread pool should not feel the attack."""
    figures = [phases[p].get("by_endpoint", {}).get("POST /login") for p in ("baseline", "attack")]
    if not all(f and f["p50_ms"] for f in figures):
        return "login: no logins in a phase"
    base, attack = figures
    change = attack["p50_ms"] / base["p50_ms"] - 1
    return (
        f"login p50: baseline {_ms(base['p50_ms'])} ms ({base['requests']} logins), "
        f"attack {_ms(attack['p50_ms'])} ms ({attack['requests']}), {change:+.0%}"
    )


def summary_table(summary: dict) -> str:
    phases = summary["phases"]
    lines = [f"{'':<18}{'requests':>10}{'failures':>10}{'p50 ms':>9}{'p99 ms':>9}"]
    for phase in ("baseline", "attack"):
        local = phases[phase]["local"]
        lines.append(
            f"{phase + ' local':<18}{local['requests']:>10}{local['failures']:>10}"
            f"{_ms(local['p50_ms']):>9}{_ms(local['p99_ms']):>9}"
        )
    lines.append(_login_line(phases))
    refusals = phases["attack"]["refusals"]
    seen = refusals["seen_by_attackers"]
    lines.append(
        f"{'refusals (Weir)':<18}{refusals['count']:>10}{'':>10}"
        f"{_ms(refusals['p50_ms']):>9}{_ms(refusals['p99_ms']):>9}"
    )
    lines.append(
        f"{'refusals (client)':<18}{seen['count']:>10}{'':>10}"
        f"{_ms(seen['p50_ms']):>9}{_ms(seen['p99_ms']):>9}"
    )
    for phase in ("baseline", "attack"):
        element = phases[phase]["element"]
        lines.append(
            f"{phase} Element: {element['requests']} image loads, "
            f"{element['refused']} refused, {element['failures']} failed, "
            f"p50 {_ms(element['p50_ms'])} ms, p99 {_ms(element['p99_ms'])} ms"
        )
    outcomes = phases["attack"]["attack"]["outcomes"]
    lines.append("attack outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    peers = summary["peers"]
    caps = summary["budget_caps"]
    lines.append(
        f"tarpit: accepted {peers['tarpit']['accepted']}, most at once "
        f"{peers['tarpit']['max_concurrent']}; silent peers together most at once "
        f"{peers['silent_combined']['max_concurrent']} (budget caps: "
        + ", ".join(f"{k} {v}" for k, v in sorted(caps.items()))
        + ")"
    )
    lines.append(
        "budgets in flight after: "
        + ", ".join(f"{k} {'n/a' if v is None else v}" for k, v in summary["budgets_after"].items())
    )
    machine = summary["machine"]
    lines.append(
        "Weir CPU seconds: "
        + ", ".join(f"{phase} {seconds:g}" for phase, seconds in summary["weir_cpu_s"].items())
        + f"; {machine['before']['cpus']} CPUs, load average {machine['before']['loadavg'][0]}"
        f" before, {machine['after']['loadavg'][0]} after"
    )
    verdict = summary["verdict"]
    lines.append(f"verdict: {'PASSED' if verdict['passed'] else 'FAILED'}")
    for rule in verdict["rules"]:
        lines.append(
            f"  {'ok  ' if rule['ok'] else 'FAIL'} {rule['rule']}: {rule['value']}"
            f" (limit {rule['limit']})"
        )
    return "\n".join(lines)


# -- plots ---------------------------------------------------------------------------------


def _png(fig) -> str:
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(out.getvalue()).decode("ascii")


def local_latency_plot(samples: dict) -> str:
    fig, ax = plt.subplots(figsize=(10, 4))
    for phase, key in (("baseline", "baseline"), ("attack", "attack_local")):
        local = [s for s in samples[key] if s.category == LOCAL]
        if not local:
            continue
        rows = per_second(local, min(s.t for s in local))
        seconds = [r["second"] for r in rows]
        colour = PHASE_COLOURS[phase]
        ax.plot(seconds, [r["p50_ms"] for r in rows], color=colour, label=f"{phase} p50")
        ax.plot(
            seconds, [r["p99_ms"] for r in rows], color=colour, linestyle="--", label=f"{phase} p99"
        )
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the local users started")
    ax.set_ylabel("ms (log scale)")
    ax.set_title("Local requests: p50 and p99 per second, baseline and under attack")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _png(fig)


def _shade_phases(ax, phases: dict, t0: float) -> None:
    for phase, (start, end) in phases.items():
        if phase in PHASE_COLOURS:
            ax.axvspan(start - t0, end - t0, color=PHASE_COLOURS[phase], alpha=0.08)
            ax.text(
                start - t0,
                1.0,
                f" {phase}",
                transform=ax.get_xaxis_transform(),
                va="top",
                color=PHASE_COLOURS[phase],
            )
    if "attack: local users" in phases:
        # The judged part of the attack phase: the local users at work, every attacker up.
        for edge in phases["attack: local users"]:
            ax.axvline(edge - t0, color=PHASE_COLOURS["attack"], linestyle=":", linewidth=1)


def budgets_plot(scrapes: list[dict], phases: dict, t0: float) -> str:
    fig, (budgets, pools) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    times = [row["t"] - t0 for row in scrapes]
    names = sorted({name for row in scrapes for name in row["in_flight"]})
    for i, name in enumerate(names):
        colour = f"C{i}"
        budgets.plot(
            times,
            [row["in_flight"].get(name, 0) for row in scrapes],
            color=colour,
            label=f"{name} in flight",
        )
        cap = max((row["capacity"].get(name, 0) for row in scrapes), default=0)
        budgets.axhline(cap, color=colour, linestyle=":", label=f"{name} cap ({cap:g})")
    budgets.set_ylabel("slots")
    budgets.set_title("Budgets: slots in flight (from /metrics)")
    budgets.legend(loc="center left", fontsize="small")
    _shade_phases(budgets, phases, t0)
    for name in sorted({name for row in scrapes for name in row["pool"]}):
        pools.plot(
            times, [row["pool"].get(name, 0) for row in scrapes], label=f"{name} pool greenlets"
        )
    size = max((row["pool_size"].get("main", 0) for row in scrapes), default=0)
    pools.axhline(size, color="grey", linestyle=":", label=f"main pool size ({size:g})")
    pools.set_ylabel("greenlets")
    pools.set_xlabel("seconds since the run started")
    pools.set_title("Pools: greenlets running (connections held)")
    pools.legend(loc="center left", fontsize="small")
    _shade_phases(pools, phases, t0)
    return _png(fig)


def refusals_plot(attack_samples: list, scrapes: list[dict], phases: dict, t0: float) -> str:
    fig, ax = plt.subplots(figsize=(10, 3.5))
    per_sec: dict[int, int] = {}
    for s in attack_samples:
        if s.category == ATTACK and s.kind == REFUSED:
            per_sec[int(s.t - t0)] = per_sec.get(int(s.t - t0), 0) + 1
    if per_sec:
        span = range(min(per_sec), max(per_sec) + 1)
        ax.plot(
            list(span),
            [per_sec.get(sec, 0) for sec in span],
            color="tab:red",
            label="429s seen by attackers",
        )
    server_t, server_rate = [], []
    for before, row in zip(scrapes, scrapes[1:]):
        dt = row["t"] - before["t"]
        if dt > 0:
            delta = sum(row["refusals"].values()) - sum(before["refusals"].values())
            server_t.append(row["t"] - t0)
            server_rate.append(delta / dt)
    ax.plot(
        server_t,
        server_rate,
        color="tab:purple",
        linestyle="--",
        label="budget refusals (from /metrics)",
    )
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("refusals per second")
    ax.set_title("Refusals per second")
    ax.legend()
    _shade_phases(ax, phases, t0)
    return _png(fig)


# -- the page --------------------------------------------------------------------------------


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _endpoint_rows(figures: dict) -> list[list]:
    return [
        [name, f["requests"], f["failures"], _ms(f["p50_ms"]), _ms(f["p99_ms"])]
        for name, f in figures["by_endpoint"].items()
    ]


def write_html(path: str, summary: dict, samples: dict, phases: dict, scrapes: list[dict]) -> None:
    t0 = min([start for start, _ in phases.values()] + [r["t"] for r in scrapes[:1]])
    verdict = summary["verdict"]
    rules = [
        ["ok" if r["ok"] else "FAIL", r["rule"], r["value"], r["limit"]] for r in verdict["rules"]
    ]
    phase_rows = []
    for phase in ("baseline", "attack"):
        local = summary["phases"][phase]["local"]
        phase_rows.append(
            [
                f"{phase}: local",
                local["requests"],
                local["failures"],
                _ms(local["p50_ms"]),
                _ms(local["p99_ms"]),
            ]
        )
        for key, label in (
            ("remote_honest", "remote rooms, honest peer"),
            ("element", "Element: remote images"),
        ):
            f = summary["phases"][phase][key]
            phase_rows.append(
                [
                    f"{phase}: {label} (not judged; {f['refused']} refused)",
                    f["requests"],
                    f["failures"],
                    _ms(f["p50_ms"]),
                    _ms(f["p99_ms"]),
                ]
            )
    refusals = summary["phases"]["attack"]["refusals"]
    seen = refusals["seen_by_attackers"]
    phase_rows.append(
        [
            "attack: refusals (429), time in Weir (judged)",
            refusals["count"],
            "",
            _ms(refusals["p50_ms"]),
            _ms(refusals["p99_ms"]),
        ]
    )
    phase_rows.append(
        [
            "attack: refusals (429), as the attackers saw them",
            seen["count"],
            "",
            _ms(seen["p50_ms"]),
            _ms(seen["p99_ms"]),
        ]
    )
    peer_rows = [
        [name, c["accepted"], c["max_concurrent"], c["bytes_received"], c["bytes_sent"]]
        for name, c in summary["peers"].items()
        if isinstance(c, dict) and "accepted" in c
    ]
    outcomes = summary["phases"]["attack"]["attack"]["outcomes"]
    status = "PASSED" if verdict["passed"] else "FAILED"
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Weir load test: {status}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 1100px; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; }}
td, th {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }}
td:first-child, th:first-child,
.rules td:nth-child(2), .rules th:nth-child(2) {{ text-align: left; }}
.PASSED {{ color: #1a7f37; }} .FAILED {{ color: #cf222e; }}
img {{ max-width: 100%; }}
pre {{ background: #f6f8fa; padding: 1em; overflow-x: auto; }}
</style></head><body>
<h1>Weir load test: <span class="{status}">{status}</span></h1>
<p>{summary["config"]["users"]} local users, {summary["config"]["element_users"]} Element
users, {summary["config"]["attackers"]} attackers,
{summary["config"]["duration_s"]:g} s per phase, main pool {summary["config"]["main_pool_size"]};
machine: {summary["machine"]["before"]["cpus"]} CPUs, load average
{summary["machine"]["before"]["loadavg"]} before and {summary["machine"]["after"]["loadavg"]}
after. Weir, locust and the peers share these CPUs. Weir used
{html.escape(", ".join(f"{k} {v:g} s" for k, v in summary["weir_cpu_s"].items()))} of CPU.</p>
<h2>Verdict</h2>
<div class="rules">{_table(["", "rule", "value", "limit"], rules)}</div>
<h2>Figures</h2>
{_table(["", "requests", "failures", "p50 ms", "p99 ms"], phase_rows)}
<p>Attack outcomes: {html.escape(", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))}.
Budgets in flight after the run: {html.escape(json.dumps(summary["budgets_after"]))}
(back to zero {summary["drained_in_s"]} s after the attackers stopped).</p>
<h2>Local latency</h2>
<img alt="local latency per second" src="data:image/png;base64,{local_latency_plot(samples)}">
<h2>Budgets and pools</h2>
<img alt="budgets in flight" src="data:image/png;base64,{budgets_plot(scrapes, phases, t0)}">
<h2>Refusals</h2>
<img alt="refusals per second"
 src="data:image/png;base64,{refusals_plot(samples["attack"], scrapes, phases, t0)}">
<h2>Peers</h2>
{_table(["peer", "accepted", "most at once", "bytes in", "bytes out"], peer_rows)}
<p>Silent peers together, most at once: {summary["peers"]["silent_combined"]["max_concurrent"]}.
Honest peer: {summary["peers"]["honest"]["requests"]} requests.</p>
<h2>Per endpoint</h2>
<h3>Baseline</h3>
{
        _table(
            ["name", "requests", "failures", "p50 ms", "p99 ms"],
            _endpoint_rows(summary["phases"]["baseline"]),
        )
    }
<h3>Under attack</h3>
{
        _table(
            ["name", "requests", "failures", "p50 ms", "p99 ms"],
            _endpoint_rows(summary["phases"]["attack"]),
        )
    }
<h2>summary.json</h2>
<pre>{html.escape(json.dumps(summary, indent=2))}</pre>
</body></html>
"""
    with open(path, "w") as f:
        f.write(page)
