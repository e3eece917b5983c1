"""The load test's scenario: local users at work while attackers aim Weir at silent peers.

`python -m loadtests.run` starts one locust process per side and phase; by hand:

    locust -f loadtests/locustfile.py --headless --host http://127.0.0.1:8008 \\
        --weir-plan plan.json --weir-samples samples.csv --weir-phase baseline \\
        --weir-local-users 20 --weir-element-users 5 -u 25 -r 10 -t 60s LocalUser ElementUser

The plan (JSON, written by the runner) names the users with their rooms, the local media
file, the honest peer with its images, and the attack targets. Every request is also
written to `--weir-samples`, one CSV row each (loadtests/scenario.py), from which the runner
computes exact percentiles per phase and per second; locust's own CSVs round them. Each
user is a client address of its own (X-Forwarded-For, Weir trusting loopback).

- `LocalUser` reads `/versions`, the local `/publicRooms`, downloads the local media file,
  sends messages into its room, and syncs if the server has `/sync` (probed at the start: a
  404 means not yet). It starts with the access token the runner's setup got, and logs in
  once, at a random moment of the phase: a login costs ~75 ms of scrypt by design, and fifty
  of them at once would measure a login storm, not the attack. Now and then it lists the
  honest peer's rooms: that answer comes from the 30 s cache or a fresh call, or is refused
  with 429 while the attack fills the budget, which ADR-0079 accepts ("remote", not judged).
- `ElementUser` views screens of the honest slow peer's images as Element does: each image
  and its thumbnail requested at once, three images at a time, over six connections. Each
  phase has images of its own, so first views miss the cache and are fetched (one fetch
  per file) on the media pool. A 429 is a broken image for Element, which does not retry
  it: counted apart ("element", not judged; ADR-0121 accepts it while the media budget is
  full).
- `Attacker` asks for remote room lists, aliases and remote media of many server names
  that all lead to silent peers: the TLS tarpit, the slow drip, and the well-known hang
  (whose SRV record then leads to the tarpit). Each attacker is a client address of its own
  and sends a few requests at once. A 429 is the defence working, so it is a success; so are
  a 504 at the deadline and a fast 502/504 from an address cooling down. Anything else is a
  failure. Attackers close their connection after each answer, so that refused ones do not
  sit in the main pool.
"""

import csv
import itertools
import random
import urllib.error
import urllib.parse
import urllib.request
import uuid

import gevent
from locust import between, events, task
from locust.contrib.fasthttp import FastHttpUser

from loadtests.scenario import (
    ATTACK,
    ATTACK_BURST,
    ELEMENT,
    LOCAL,
    MEDIA_ATTACK_BURST,
    MEDIA_ATTACKER_EVERY,
    REFUSED,
    REMOTE,
    SAMPLE_FIELDS,
    UNEXPECTED,
    attack_outcome,
    attacker_address,
    element_address,
    local_address,
    read_plan,
)

V3 = "/_matrix/client/v3"
CLIENT_MEDIA = "/_matrix/client/v1/media"
LEGACY_MEDIA = "/_matrix/media/v3"
IMAGES_PER_SCREEN = 3


class LoadPlan:
    """The runner's plan, plus what this process hands out from it."""

    def __init__(self, path: str, samples_path: str, phase: str):
        self.data = read_plan(path)
        self.phase = phase
        self.sync = False
        self._locals = itertools.count()
        self._elements = itertools.count()
        self._attackers = itertools.count()
        self._samples_file = open(samples_path, "w", newline="")
        self._samples = csv.writer(self._samples_file)
        self._samples.writerow(SAMPLE_FIELDS)

    def next_local(self) -> tuple[int, dict]:
        i = next(self._locals)
        users = self.data["users"]
        return i, users[i % len(users)]

    def next_element(self) -> tuple[int, dict]:
        i = next(self._elements)
        users = self.data["users"]
        return i, users[i % len(users)]

    def next_attacker(self) -> int:
        return next(self._attackers)

    def record(self, *row) -> None:
        self._samples.writerow(row)

    def close(self) -> None:
        self._samples_file.close()


@events.init_command_line_parser.add_listener
def _options(parser):
    parser.add_argument("--weir-plan", default="", help="the runner's plan (JSON)")
    parser.add_argument("--weir-samples", default="", help="CSV file, one row per request")
    parser.add_argument("--weir-phase", default="baseline", help="whose images to view")
    parser.add_argument(
        "--weir-local-users",
        type=int,
        default=0,
        help="how many of the users are LocalUser (the rest: ElementUser)",
    )
    parser.add_argument("--weir-element-users", type=int, default=0)


@events.init.add_listener
def _load_plan(environment, **_):
    options = environment.parsed_options
    if options is not None and options.weir_plan:
        environment.weir = LoadPlan(
            options.weir_plan, options.weir_samples or "samples.csv", options.weir_phase
        )
        # Exact numbers of each, rather than locust's split by weight.
        if options.weir_local_users or options.weir_element_users:
            LocalUser.fixed_count = options.weir_local_users
            ElementUser.fixed_count = options.weir_element_users


@events.test_start.add_listener
def _probe_sync(environment, **_):
    plan = getattr(environment, "weir", None)
    if plan is None:
        return
    # Without a token an existing /sync answers 401; a server without it answers 404.
    try:
        urllib.request.urlopen(environment.host + f"{V3}/sync", timeout=30)
        plan.sync = True
    except urllib.error.HTTPError as e:
        plan.sync = e.code != 404


@events.request.add_listener
def _record(
    request_type,
    name,
    response_time,
    response_length,
    response=None,
    context=None,
    exception=None,
    start_time=None,
    **_,
):
    plan = (context or {}).get("plan")
    if plan is None:  # not one of ours
        return
    status = getattr(response, "status_code", 0) or 0
    category = context.get("category", LOCAL)
    kind = ""
    if category == ATTACK:
        kind = attack_outcome(status, _text(response))
    elif category in (REMOTE, ELEMENT) and status == 429:
        kind = REFUSED
    plan.record(
        f"{start_time:.4f}",
        category,
        name,
        status,
        f"{response_time:.2f}",
        int(exception is not None),
        kind,
    )


@events.quitting.add_listener
def _close(environment, **_):
    plan = getattr(environment, "weir", None)
    if plan is not None:
        plan.close()


def _text(response) -> str:
    try:
        return response.text or ""
    except Exception:  # no body, or not text: not a cooling-down message either
        return ""


class LocalUser(FastHttpUser):
    wait_time = between(0.5, 1.5)

    def context(self):
        return {"plan": self.environment.weir, "category": LOCAL}

    def on_start(self):
        plan = self.environment.weir
        index, self.account = plan.next_local()
        self.client_headers = {"X-Forwarded-For": local_address(index)}
        self._use_token(self.account["access_token"])
        self.room_path = f"{V3}/rooms/{urllib.parse.quote(self.account['room_id'])}"
        self.since = None
        self._login_later = gevent.spawn_later(
            random.uniform(0, plan.data["login_within_s"]), self._login
        )
        if plan.sync:
            self._sync()

    def on_stop(self):
        self._login_later.kill(block=False)

    def _use_token(self, token: str) -> None:
        self.headers = {**self.client_headers, "Authorization": f"Bearer {token}"}

    def _login(self):
        r = self.client.post(
            f"{V3}/login",
            name="POST /login",
            headers=self.client_headers,
            json={
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": self.account["localpart"]},
                "password": self.account["password"],
            },
        )
        if r.status_code == 200:
            self._use_token(r.json()["access_token"])

    @task(2)
    def versions(self):
        self.client.get(
            "/_matrix/client/versions", name="GET /versions", headers=self.client_headers
        )

    @task(2)
    def public_rooms(self):
        self.client.get(
            f"{V3}/publicRooms?limit=20", name="GET /publicRooms", headers=self.client_headers
        )

    @task(2)
    def media_download(self):
        self.client.get(
            f"/_matrix/client/v1/media/download/{self.environment.weir.data['media']}",
            name="GET media download",
            headers=self.headers,
        )

    @task(2)
    def send(self):
        self.client.put(
            f"{self.room_path}/send/m.room.message/{uuid.uuid4().hex}",
            name="PUT send",
            headers=self.headers,
            json={"msgtype": "m.text", "body": "hello from the load test"},
        )

    @task(2)
    def sync(self):
        if self.environment.weir.sync:
            self._sync()

    def _sync(self):
        query = {"timeout": "0", "filter": '{"room":{"timeline":{"limit":10}}}'}
        if self.since:
            query["since"] = self.since
        r = self.client.get(
            f"{V3}/sync?{urllib.parse.urlencode(query)}", name="GET /sync", headers=self.headers
        )
        if r.status_code == 200:
            self.since = r.json().get("next_batch", self.since)

    @task(1)
    def remote_public_rooms(self):
        server = self.environment.weir.data["honest"]
        with self.client.get(
            f"{V3}/publicRooms?server={urllib.parse.quote(server)}&limit=10",
            name="GET remote publicRooms (honest peer)",
            headers=self.headers,
            context={"category": REMOTE},
            catch_response=True,
        ) as r:
            if r.status_code in (200, 429):
                r.success()
            else:
                r.failure(f"HTTP {r.status_code}")


class ElementUser(FastHttpUser):
    wait_time = between(2, 5)
    concurrency = 6  # a browser's connections to one host

    def context(self):
        return {"plan": self.environment.weir, "category": ELEMENT}

    def on_start(self):
        plan = self.environment.weir
        index, account = plan.next_element()
        self.headers = {
            "X-Forwarded-For": element_address(index),
            "Authorization": f"Bearer {account['access_token']}",
        }
        self.origin = plan.data["honest"]
        self.images = plan.data["honest_images"][plan.phase]

    @task
    def view_screen(self):
        loads = []
        for media_id in random.sample(self.images, IMAGES_PER_SCREEN):
            location = f"{self.origin}/{media_id}"
            loads.append(
                gevent.spawn(self._load, f"{CLIENT_MEDIA}/download/{location}", "GET remote image")
            )
            loads.append(
                gevent.spawn(
                    self._load,
                    f"{CLIENT_MEDIA}/thumbnail/{location}?width=320&height=240&method=scale",
                    "GET remote thumbnail",
                )
            )
        try:
            gevent.joinall(loads)
        finally:  # the user stopped: its requests stop too
            gevent.killall(loads, block=False)

    def _load(self, path: str, name: str):
        with self.client.get(path, name=name, headers=self.headers, catch_response=True) as r:
            if r.status_code in (200, 429):  # a 429 is recorded as refused
                r.success()
            else:
                r.failure(f"HTTP {r.status_code}")


class Attacker(FastHttpUser):
    """One client address. Every MEDIA_ATTACKER_EVERY-th attacker asks for remote media (its
    requests wait up to 30 s each); the others for remote room lists and aliases (10 s), so
    that neither attack waits on the other's deadline."""

    # Enough to take every slot as soon as it frees; a flood of refused requests would be
    # another attack, on CPU, which the load balancer's rate limits answer, not ADR-0079.
    wait_time = between(1, 3)

    def context(self):
        return {"plan": self.environment.weir, "category": ATTACK}

    def on_start(self):
        self.targets = self.environment.weir.data["attack"]
        index = self.environment.weir.next_attacker()
        self.client_headers = {"X-Forwarded-For": attacker_address(index), "Connection": "close"}
        self.media = index % MEDIA_ATTACKER_EVERY == MEDIA_ATTACKER_EVERY - 1

    @task
    def burst(self):
        one, size = (
            (self._media, MEDIA_ATTACK_BURST) if self.media else (self._directory, ATTACK_BURST)
        )
        requests = [gevent.spawn(one) for _ in range(size)]
        try:
            gevent.joinall(requests)
        finally:  # the user stopped: its requests stop too
            gevent.killall(requests, block=False)

    def _directory(self):
        kind = random.choices(("tarpit", "alias", "drip", "hang"), weights=(4, 2, 2, 1))[0]
        if kind == "alias":
            server = random.choice(self.targets["tarpit"])
            alias = urllib.parse.quote(f"#room{random.randrange(1000)}:{server}")
            self._attack(f"{V3}/directory/room/{alias}", "attack: alias at tarpit")
        else:
            server = random.choice(self.targets[kind])
            self._attack(
                f"{V3}/publicRooms?server={urllib.parse.quote(server)}",
                f"attack: publicRooms at {kind}",
            )

    def _media(self):
        # The legacy endpoint needs no account, and fetches remote media unless told not to.
        server = random.choice(self.targets["tarpit"])
        self._attack(
            f"{LEGACY_MEDIA}/download/{server}/m{random.randrange(10**9)}",
            "attack: remote media at tarpit",
        )

    def _attack(self, path: str, name: str):
        with self.client.get(
            path, name=name, headers=self.client_headers, catch_response=True
        ) as r:
            if attack_outcome(r.status_code, r.text or "") == UNEXPECTED:
                r.failure(f"HTTP {r.status_code}")
            else:
                r.success()
