"""Prints what a big room's everyday reads cost: /search, /threads, /context, and an initial
/sync with and without bundled aggregations.

    .venv/bin/python -m loadtests.everyday_bench [--messages 100000] [--threads 500]
        [--replies 10000] [--edits 2000] [--users 20] [--samples 200] [--dir DIR]
        [--baseline-commit REV | --baseline-repo DIR | --no-baseline]

The room (SQLite) is built first, in a process of its own, through the server's own
services (`RoomService.send_message`, as `PUT /send` calls it): real events, signed and
stored as the server stores them, with their relations and search rows, about 10 times
faster than over HTTP. `--messages` m.room.message events from `--users` users: `--threads`
thread roots spread over the room, `--replies` thread replies (each after its root),
`--edits` edits, each of one of the 50 messages before it by its sender, and plain messages. Each
body holds one of 20 common words (in 1 message of 20) and one of 2,000 rare ones. With
`--dir`, the room is kept there and reused by the next run with the same shape.

Then a Weir process serves that database on loopback, and one client, on one keep-alive
connection, times `--samples` requests of each kind (after 10 unrecorded): /search for a
common and for a rare word (rank order, the default 10 results), the first page of
/threads, /context of a random message (limit 10). An initial /sync (default filter) is
timed on this build and on a build without bundled aggregations: by default HEAD, extracted
with `git archive`, with the one call by which /sync bundles taken out (or any commit:
`--baseline-commit 540b344^` is the one before bundles were added, without later fixes
either), run with this venv on a copy of the database, the two servers asked in turn so
that both see the same machine. The figures are
printed beside the targets; nothing is judged.
"""

from gevent import monkey

monkey.patch_all()

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from urllib.parse import quote

from loadtests.big_room_common import V3, percentile
from tests.support.server import REPO, MatrixClient, WeirProcess, base_settings

V1 = "/_matrix/client/v1"
COMMON_WORDS = [f"common{n:02d}" for n in range(20)]
RARE_WORDS = [f"rare{n:04d}" for n in range(2000)]
WARMUP = 10
CONTEXT_SAMPLE = 1000  # message IDs kept for /context
RECENT = 50  # an edit is of one of the room's last RECENT messages
MANIFEST = "everyday.json"
BUNDLING_FILE = "homeserver/sync/room_entries.py"
BUNDLING_CALL = "self.history.aggregations.add_to(requester, view, events, out, now)"


def shape(args) -> dict:
    return {
        "messages": args.messages,
        "threads": args.threads,
        "replies": args.replies,
        "edits": args.edits,
        "users": args.users,
    }


# --- the room, built in a process of its own ------------------------------------------------


def plan(room: dict, rng: random.Random) -> list[tuple[str, int]]:
    """The room's messages in order: ("root", thread), ("reply", thread), ("edit", 0) and
    ("plain", 0), placed at random with every reply after its root."""
    placed = []
    for thread in range(room["threads"]):
        at = rng.uniform(0.01, 0.98)
        placed.append((at, "root", thread))
        per = room["replies"] // room["threads"] + (thread < room["replies"] % room["threads"])
        placed += [(rng.uniform(at, 1.0), "reply", thread) for _ in range(per)]
    placed += [(rng.uniform(0.02, 1.0), "edit", 0) for _ in range(room["edits"])]
    plain = room["messages"] - len(placed)
    placed += [(rng.uniform(0.0, 1.0), "plain", 0) for _ in range(plain)]
    placed.sort()
    return [(kind, n) for _, kind, n in placed]


def build(directory: str, room: dict) -> None:
    """Writes the room into `directory`'s database and its manifest beside it."""
    from homeserver.config import parse_config
    from homeserver.core.requester import Requester
    from homeserver.rooms.creation import CreateRoomRequest
    from homeserver.runtime import HomeserverRuntime

    rt = HomeserverRuntime(parse_config(base_settings(f"{directory}/data"), directory))
    users = [rt.accounts.register(f"eater{n}", "bench password") for n in range(room["users"])]
    requesters = [Requester(u.user_id, u.device_id, False, "") for u in users]
    room_id = rt.room_creator.create(users[0].user_id, CreateRoomRequest(preset="public_chat"))
    for user in users[1:]:
        rt.rooms.update_membership(user.user_id, room_id, user.user_id, "join")
    rng = random.Random(35)
    roots: dict[int, str] = {}
    sent: list[tuple[str, int]] = []  # (event ID, sender's index) of roots and plain messages
    started = time.monotonic()
    for n, (kind, thread) in enumerate(plan(room, rng)):
        who = rng.randrange(len(users))
        content = {"msgtype": "m.text", "body": _body(rng, n)}
        if kind == "reply":
            content["m.relates_to"] = {"rel_type": "m.thread", "event_id": roots[thread]}
        elif kind == "edit" and sent:
            target, who = sent[-rng.randrange(1, min(len(sent), RECENT) + 1)]
            content = _edit(target, content["body"])
        event_id = rt.rooms.send_message(
            requesters[who], room_id, "m.room.message", content, f"b{n}"
        )
        if kind == "root":
            roots[thread] = event_id
        if kind in ("root", "plain"):
            sent.append((event_id, who))
        if n % 10_000 == 9_999:
            rate = (n + 1) / (time.monotonic() - started)
            print(f"  built {n + 1:,} messages, {rate:,.0f}/s", flush=True)
    manifest = {
        "shape": room,
        "room_id": room_id,
        "tokens": [u.access_token for u in users],
        "context": [e for e, _ in rng.sample(sent, min(CONTEXT_SAMPLE, len(sent)))],
        "seconds": round(time.monotonic() - started),
    }
    with open(os.path.join(directory, MANIFEST), "w") as f:
        json.dump(manifest, f)


def _body(rng: random.Random, n: int) -> str:
    return f"{rng.choice(COMMON_WORDS)} {rng.choice(RARE_WORDS)} message {n}"


def _edit(target: str, body: str) -> dict:
    return {
        "msgtype": "m.text",
        "body": f"* {body}",
        "m.new_content": {"msgtype": "m.text", "body": body},
        "m.relates_to": {"rel_type": "m.replace", "event_id": target},
    }


def prepared(directory: str, room: dict) -> dict:
    """The manifest of `directory`'s room, built first unless it has this shape already."""
    path = os.path.join(directory, MANIFEST)
    if os.path.exists(path):
        with open(path) as f:
            manifest = json.load(f)
        if manifest["shape"] == room:
            print(f"Reusing the room in {directory}", flush=True)
            return manifest
        shutil.rmtree(directory)
    os.makedirs(directory, exist_ok=True)
    print(f"Building the room in {directory}", flush=True)
    command = [sys.executable, "-m", "loadtests.everyday_bench", "--build-into", directory]
    command += ["--room", json.dumps(room)]
    subprocess.run(command, check=True, cwd=REPO)
    with open(path) as f:
        return json.load(f)


# --- measuring --------------------------------------------------------------------------------


def timed(client: MatrixClient, method: str, path: str, **kw) -> float:
    """Milliseconds for one request, answered 200."""
    started = time.perf_counter()
    r = client.request(method, path, timeout=120, **kw)
    elapsed = (time.perf_counter() - started) * 1000
    if r.status_code != 200:
        raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:300]}")
    return elapsed


def sampled(count: int, once) -> list[float]:
    """`count` timings of `once(n)`, after WARMUP unrecorded."""
    for n in range(WARMUP):
        once(n)
    return [once(n) for n in range(count)]


def answers(client: MatrixClient, manifest: dict) -> str:
    """What one request of each kind answers, so that the timings are of real work."""
    room = quote(manifest["room_id"], safe="")
    found = []
    for word in (COMMON_WORDS[0], RARE_WORDS[0]):
        body = {"search_categories": {"room_events": {"search_term": word}}}
        hits = client.post(f"{V3}/search", json=body).json()["search_categories"]["room_events"]
        found.append(f"'{word}' {hits['count']:,} hits, {len(hits['results'])} given")
    chunk = client.get(f"{V1}/rooms/{room}/threads").json()["chunk"]
    counts = [e["unsigned"]["m.relations"]["m.thread"]["count"] for e in chunk]
    found.append(f"/threads {len(chunk)} roots of {min(counts)}-{max(counts)} replies")
    event_id = quote(manifest["context"][0], safe="")
    r = client.get(f"{V3}/rooms/{room}/context/{event_id}", params={"limit": 10}).json()
    found.append(f"/context {len(r['events_before'])}+1+{len(r['events_after'])} events")
    return "; ".join(found)


def measure_reads(client: MatrixClient, manifest: dict, samples: int) -> list[tuple]:
    """(label, timings, target) of /search, /threads and /context."""
    room = quote(manifest["room_id"], safe="")
    print(f"  answers: {answers(client, manifest)}", flush=True)
    rng = random.Random(7)

    def search(words: list[str]):
        def once(n: int) -> float:
            body = {"search_categories": {"room_events": {"search_term": rng.choice(words)}}}
            return timed(client, "POST", f"{V3}/search", json=body)

        return once

    def threads(n: int) -> float:
        return timed(client, "GET", f"{V1}/rooms/{room}/threads")

    def context(n: int) -> float:
        event_id = quote(rng.choice(manifest["context"]), safe="")
        return timed(client, "GET", f"{V3}/rooms/{room}/context/{event_id}", params={"limit": 10})

    return [
        ("/search, a word in 1 message of 20", sampled(samples, search(COMMON_WORDS)), 100),
        ("/search, a rare word (~50 messages)", sampled(samples, search(RARE_WORDS)), 100),
        ("/threads, first page", sampled(samples, threads), 50),
        ("/context, limit 10", sampled(samples, context), 30),
    ]


# The default filter (a timeline of 10), and one of 100 events, more of them with bundles.
SYNC_FILTERS = {"default": None, "timeline 100": '{"room": {"timeline": {"limit": 100}}}'}


def sync_params(name: str) -> dict:
    sync_filter = SYNC_FILTERS[name]
    return {"timeout": 0, **({"filter": sync_filter} if sync_filter else {})}


def initial_sync(client: MatrixClient, name: str) -> float:
    return timed(client, "GET", f"{V3}/sync", params=sync_params(name))


def sync_shape(client: MatrixClient, room_id: str, name: str) -> str:
    r = client.get(f"{V3}/sync", params=sync_params(name), timeout=120)
    events = r.json()["rooms"]["join"][room_id]["timeline"]["events"]
    bundled = sum("m.relations" in e.get("unsigned", {}) for e in events)
    return f"{len(r.content):,} bytes, {len(events)} timeline events, {bundled} with a bundle"


def extract(rev: str, tree: str) -> str:
    """`rev`'s files, written into `tree`; its short commit ID."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    os.makedirs(tree)
    archive = subprocess.Popen(["git", "archive", commit], cwd=REPO, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", tree], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {commit} failed")
    return commit


def baseline_tree(args, scratch: str) -> tuple[str, str]:
    """(checkout, its name) of the build whose /sync bundles nothing."""
    if args.baseline_repo:
        return args.baseline_repo, args.baseline_repo
    tree = os.path.join(scratch, "baseline")
    if args.baseline_commit:
        return tree, f"commit {extract(args.baseline_commit, tree)}"
    # HEAD with /sync's one call that bundles taken out: the builds differ by bundles alone.
    commit = extract("HEAD", tree)
    path = os.path.join(tree, BUNDLING_FILE)
    with open(path) as f:
        source = f.read()
    if source.count(BUNDLING_CALL) != 1:
        raise RuntimeError(f"{BUNDLING_FILE} no longer has one {BUNDLING_CALL!r}")
    with open(path, "w") as f:
        f.write(source.replace(BUNDLING_CALL, "pass  # " + BUNDLING_CALL))
    return tree, f"{commit} without bundles"


def serve(directory: str, repo: str = REPO) -> WeirProcess:
    settings = base_settings(os.path.join(directory, "data"))
    return WeirProcess(directory, settings, repo=repo).start(timeout=300)


def measure_syncs(args, manifest: dict, ours: MatrixClient, scratch: str, data: str) -> list:
    """Initial /sync on this build and on the baseline, asked in turn."""
    rounds = max(10, args.samples // 4)
    if args.no_baseline:
        return [
            (f"initial /sync ({f}), this build", sampled(rounds, lambda n: initial_sync(ours, f)))
            for f in SYNC_FILTERS
        ]
    tree, name = baseline_tree(args, scratch)
    copy = os.path.join(scratch, "baseline-run")
    shutil.copytree(data, os.path.join(copy, "data"))
    proc = serve(copy, tree)
    rows = []
    try:
        theirs = MatrixClient(proc.client_url, manifest["tokens"][0])
        for f in SYNC_FILTERS:
            sides = {"this build": ours, name: theirs}
            timings: dict[str, list[float]] = {side: [] for side in sides}
            for side, client in sides.items():
                print(f"  {f}, {side}: {sync_shape(client, manifest['room_id'], f)}", flush=True)
            for n in range(WARMUP + rounds):
                for side, client in sides.items():  # in turn: both see the same machine
                    elapsed = initial_sync(client, f)
                    if n >= WARMUP:
                        timings[side].append(elapsed)
            rows += [(f"initial /sync ({f}), {side}", t) for side, t in timings.items()]
    finally:
        proc.stop()
    return rows


def report(reads: list[tuple], syncs: list[tuple]) -> None:
    for label, timings, target in reads:
        p50, p99 = percentile(timings, 0.5), percentile(timings, 0.99)
        asked = f"(asked <= {target} ms)"
        print(f"  {label:<56} p50 {p50:7.1f} ms  p99 {p99:7.1f} ms  {asked}", flush=True)
    for label, timings in syncs:
        p50, p99 = percentile(timings, 0.5), percentile(timings, 0.99)
        print(f"  {label:<56} p50 {p50:7.1f} ms  p99 {p99:7.1f} ms", flush=True)
    for ours, theirs in zip(syncs[::2], syncs[1::2]):
        if not ours[0].endswith("this build") or theirs[0].endswith("this build"):
            continue
        added = percentile(ours[1], 0.5) / percentile(theirs[1], 0.5) * 100 - 100
        label = ours[0].split(",")[0].replace("initial /sync", "bundles add to /sync")
        print(f"  {label:<56} {added:+.1f} % at p50  (asked <= 10 %)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--threads", type=int, default=500)
    parser.add_argument("--replies", type=int, default=10_000, help="thread replies, in all")
    parser.add_argument("--edits", type=int, default=2_000)
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--samples", type=int, default=200, help="timed requests of each kind")
    parser.add_argument("--dir", default=None, help="keep the built room there, and reuse it")
    parser.add_argument("--baseline-commit", default=None, help="a commit to run instead")
    parser.add_argument("--baseline-repo", default=None, help="a checkout to run instead")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--build-into", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--room", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_into:
        build(args.build_into, json.loads(args.room))
        return 0
    scratch = tempfile.mkdtemp(prefix="everyday-bench-")
    try:
        directory = args.dir or os.path.join(scratch, "room")
        manifest = prepared(os.path.abspath(directory), shape(args))
        print(f"Room: {json.dumps(manifest['shape'])}, built in {manifest['seconds']} s")
        data = os.path.join(os.path.abspath(directory), "data")
        run = os.path.join(scratch, "run")
        shutil.copytree(data, os.path.join(run, "data"))  # the kept room stays as built
        proc = serve(run)
        try:
            client = MatrixClient(proc.client_url, manifest["tokens"][0])
            reads = measure_reads(client, manifest, args.samples)
            syncs = measure_syncs(args, manifest, client, scratch, data)
        finally:
            proc.stop()
        report(reads, syncs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
