"""Several Weir instances of one server on one PostgreSQL, behind real HAProxy with
deploy/haproxy.cfg (tests/support/haproxy.py), as deploy/docker-compose.yml runs them: one
config for all, each instance named by WEIR_INSTANCE_NAME, one data folder (the signing key
and media are the server's).

The balancer hashes a client's requests by its access token, so where a client's requests
land is chosen by its token: `login_on` logs in until a token lands on the instance asked
for, found from HAProxy's own count of requests per server.

    cluster = Cluster(directory, test_ca, pg_cluster.new_database(), settings=...).start()
    alice = cluster.login_on("alice", "weir-2")        # her requests reach weir-2
    cluster.instance("weir-2").client_url              # weir-2 itself, not the balancer
"""

from __future__ import annotations

import os
import time
from typing import Callable

import gevent
import requests

from tests.support.haproxy import HAProxy
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge

PASSWORD = "correct horse battery"
# Where HAProxy's connections to the instances come from: the instances trust only it.
LB_SOURCE = "127.0.0.1"


class Cluster:
    def __init__(
        self,
        directory: str,
        test_ca,
        database_url: str,
        *,
        instances: int = 3,
        settings: dict | None = None,
        host: str = "127.0.0.1",
        federation_port: int = 0,
        check_inter: str = "200ms",
        binary: str | None = None,
    ):
        """``settings`` are merged over every instance's (the same for all, as one config
        file); ``host``/``federation_port``: the balancer's frontends (see HAProxy)."""
        self.directory = directory
        self.test_ca = test_ca
        self.database_url = database_url
        self.names = [f"weir-{n}" for n in range(1, instances + 1)]
        shared = merge(
            base_settings(os.path.join(directory, "shared-data"), database_url),
            {
                "cluster": {"instances": instances},
                "server": {"http": {"trusted_proxies": [f"{LB_SOURCE}/32"]}},
            },
        )
        self.settings = merge(shared, settings or {})
        self.instances = [
            WeirProcess(_folder(directory, name), self.settings, env={"WEIR_INSTANCE_NAME": name})
            for name in self.names
        ]
        self._lb_args = dict(
            host=host, federation_port=federation_port, check_inter=check_inter, binary=binary
        )
        self.lb: HAProxy | None = None

    def start(self) -> Cluster:
        first, *others = self.instances
        try:
            first.start()  # alone: it makes the signing key and the tables
            gevent.joinall([gevent.spawn(proc.start) for proc in others], raise_error=True)
            self.lb = HAProxy(
                os.path.join(self.directory, "lb"),
                self.test_ca,
                client=[proc.client_url for proc in self.instances],
                federation=[proc.federation_url for proc in self.instances],
                **self._lb_args,
            ).start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.lb is not None:
            self.lb.stop()
        for proc in self.instances:
            proc.stop()

    def instance(self, name: str) -> WeirProcess:
        return self.instances[self.names.index(name)]

    # -- clients through the balancer --------------------------------------------------------

    def client(self, token: str | None = None) -> MatrixClient:
        """A client of the balancer's client frontend, trusting the test CA."""
        assert self.lb is not None
        client = MatrixClient(self.lb.client_url, token)
        client.session.verify = self.test_ca.ca_path
        client.session.trust_env = False  # not the environment's CA bundle or proxies
        return client

    def served_by(self, request: Callable[[], requests.Response]) -> str:
        """The instance that served ``request()``, from HAProxy's count of requests per
        server (nothing else may be sent through the balancer meanwhile)."""
        assert self.lb is not None
        before = self.lb.requests_served("client")
        response = request()
        assert response.status_code == 200, response.text
        after = self.lb.requests_served("client")
        moved = [name for name in after if after[name] != before.get(name)]
        assert len(moved) == 1, (before, after)
        return moved[0]

    def register(self, user: str) -> None:
        client = self.client()
        client.register(user, PASSWORD)
        client.post("/_matrix/client/v3/logout")

    def login_on(self, user: str, name: str, tries: int = 40) -> MatrixClient:
        """A new login of ``user`` (registered) whose requests the balancer sends to
        instance ``name``. Logins whose token hashes elsewhere are logged out."""
        for _ in range(tries):
            client = self.client()
            client.login(user, PASSWORD)
            if self.served_by(lambda: client.get("/_matrix/client/v3/account/whoami")) == name:
                return client
            assert client.post("/_matrix/client/v3/logout").status_code == 200
        raise AssertionError(f"no token of {user} hashed to {name} in {tries} logins")


def _folder(directory: str, name: str) -> str:
    path = os.path.join(directory, name)
    os.makedirs(path, exist_ok=True)
    return path


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, every: float = 0.02):
    """Seconds until ``predicate()`` held, for state only readable by asking (another
    process's metrics, a database row); fails after ``timeout``."""
    started = time.monotonic()
    with gevent.Timeout(timeout, AssertionError(f"{what}: not within {timeout} s")):
        while not predicate():
            gevent.sleep(every)
    return time.monotonic() - started
