"""deploy/'s files agree with each other: the balancer's address, the drain, the stop grace.

No container runs here (tests/deploy/test_haproxy.py runs HAProxy itself); these read the
files an operator edits, so that changing one without the other fails here.
"""

import os
import re

import pytest

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
    servers = re.findall(r"^\s*server weir \S+ (.*)$", read("haproxy.cfg"), re.MULTILINE)
    assert len(servers) == 2
    for params in servers:
        words = params.split()
        value = {k: words[i + 1] for i, k in enumerate(words[:-1])}
        inter = seconds(value.get("inter", "2s"))
        fastinter = seconds(value.get("fastinter", value.get("inter", "2s")))
        fall = int(value.get("fall", 3))
        marked_down_within = inter + (fall - 1) * fastinter
        assert marked_down_within < drain, (params, drain)


@pytest.mark.parametrize("config", [os.path.join(DEPLOY, "weir.toml"), CONTAINER_CONFIG])
def test_compose_gives_the_drain_and_in_flight_requests_time_to_finish(config):
    drain = load_config(config).server.http.shutdown_drain_delay
    grace = re.search(r"stop_grace_period: (\S+)", read("docker-compose.yml")).group(1)
    assert seconds(grace) > drain + SHUTDOWN_GRACE_SECONDS
