"""deploy/'s files agree with each other: the balancer's address, the drain, the stop grace.

No container runs here (tests/deploy/test_haproxy.py runs HAProxy itself); these read the
files an operator edits, so that changing one without the other fails here.
"""

import os
import re

import pytest
import yaml  # type: ignore[import-untyped]

from homeserver.config import load_config
from homeserver.processes.listeners import SHUTDOWN_GRACE_SECONDS
from tests.support.server import REPO

DEPLOY = os.path.join(REPO, "deploy")
# What the image runs with unless the operator changes it (Dockerfile, docker/entrypoint.sh).
CONTAINER_CONFIG = os.path.join(REPO, "docker", "config.toml")


def read(name: str) -> str:
    with open(os.path.join(DEPLOY, name)) as f:
        return f.read()


def seconds(value: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(ms|s|m)?", value).groups()
    return float(number) * {"ms": 0.001, "s": 1, "m": 60, None: 0.001}[unit]


def test_weir_toml_is_valid_and_trusts_the_balancer_only():
    config = load_config(os.path.join(DEPLOY, "weir.toml"))
    lb_address = re.search(r"ipv4_address: (\S+)", read("docker-compose.yml")).group(1)
    assert config.server.http.trusted_proxies == (f"{lb_address}/32",)


@pytest.mark.parametrize("config", [os.path.join(DEPLOY, "weir.toml"), CONTAINER_CONFIG])
def test_haproxy_marks_weir_down_before_its_listeners_close(config):
    """After SIGTERM the next check comes within `inter`, and `fall - 1` more follow at
    `fastinter`: the balancer must have stopped sending before shutdown_drain_delay ends,
    with deploy/'s config and with the image's own."""
    drain = load_config(config).server.http.shutdown_drain_delay
    haproxy = read("haproxy.cfg")
    # The checks are each backend's default-server's: no server line sets its own.
    assert re.findall(r"^\s*server \S+ \S+[ \t]+(\S.*)$", haproxy, re.MULTILINE) == []
    defaults = re.findall(r"^\s*default-server (.*)$", haproxy, re.MULTILINE)
    assert len(defaults) == len(re.findall(r"^backend ", haproxy, re.MULTILINE)) == 3
    for params in defaults:
        words = params.split()
        value = {k: words[i + 1] for i, k in enumerate(words[:-1])}
        inter = seconds(value.get("inter", "2s"))
        fastinter = seconds(value.get("fastinter", value.get("inter", "2s")))
        fall = int(value.get("fall", 3))
        marked_down_within = inter + (fall - 1) * fastinter
        assert marked_down_within < drain, (params, drain)


def test_the_instances_agree_across_compose_haproxy_and_weir_toml():
    """Each compose instance has its own name, a server line in both backends, and
    weir.toml's cluster.instances counts them."""
    services = yaml.safe_load(read("docker-compose.yml"))["services"]
    instances = sorted(name for name in services if name.startswith("weir-"))
    names = [services[name]["environment"]["WEIR_INSTANCE_NAME"] for name in instances]
    assert names == instances == ["weir-1", "weir-2", "weir-3"]
    assert load_config(os.path.join(DEPLOY, "weir.toml")).cluster.instances == len(instances)
    # Both client backends (requests, and long-polls) and the federation one.
    for port, backends in ((8008, 2), (8448, 1)):
        lines = re.findall(rf"^\s*server (\S+) (\S+):{port}\s*$", read("haproxy.cfg"), re.M)
        assert lines == [(name, name) for name in instances] * backends, port
    assert sorted(services["lb"]["depends_on"]) == instances
    for name in instances:
        service = services[name]
        assert service["environment"]["WEIR_CONFIG"] == "/etc/weir/config.toml"
        assert "./weir.toml:/etc/weir/config.toml:ro" in service["volumes"]
        # One signing key and one media store for the server, whichever instance serves.
        assert {"weir-data:/data", "weir-media:/data/media"} <= set(service["volumes"])


@pytest.mark.parametrize("config", [os.path.join(DEPLOY, "weir.toml"), CONTAINER_CONFIG])
def test_compose_gives_the_drain_and_in_flight_requests_time_to_finish(config):
    drain = load_config(config).server.http.shutdown_drain_delay
    services = yaml.safe_load(read("docker-compose.yml"))["services"]
    graces = {name: s["stop_grace_period"] for name, s in services.items() if "weir" in name}
    assert len(graces) == 3
    for grace in graces.values():
        assert seconds(grace) > drain + SHUTDOWN_GRACE_SECONDS


def test_long_polls_have_their_own_limit_within_max_connections():
    """A parked /sync holds a connection to Weir but no place in its main pool: the `sync`
    backend's per-server limit is far above `client`'s (under main_pool_size), and both
    together stay under each instance's max_connections."""
    http = load_config(os.path.join(DEPLOY, "weir.toml")).server.http
    haproxy = read("haproxy.cfg")
    limits = {}
    for backend, body in re.findall(r"^backend (\S+)\n((?:[ \t].*\n|\n)*)", haproxy, re.M):
        limits[backend] = int(re.search(r"^\s*default-server .*\bmaxconn (\d+)", body, re.M)[1])
    assert limits["client"] < http.main_pool_size
    assert limits["sync"] > 5 * limits["client"]
    assert limits["client"] + limits["sync"] < http.max_connections
