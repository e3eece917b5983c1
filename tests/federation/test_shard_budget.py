"""shard_key_resolution_budget: each worker shard's share of the key-resolution budget."""

import dataclasses

import pytest

from homeserver.config import TrustedKeyServer, parse_config
from homeserver.federation.keyring import shard_key_resolution_budget
from homeserver.runtime import HomeserverRuntime


def config(in_flight=16, max_requests=30, **extra):
    return parse_config(
        {
            "security": {
                "federation": {
                    "key_resolution_max_in_flight": in_flight,
                    "key_resolution_per_ip_rate": {"max_requests": max_requests, "per_seconds": 60},
                    **extra,
                }
            }
        }
    )


@pytest.mark.parametrize(
    "shards, in_flight, max_requests",
    [
        (1, 16, 30),
        (3, 5, 10),
        (4, 4, 7),
        (16, 1, 1),
        (40, 1, 1),  # more shards than the limit: each still gets 1
    ],
)
def test_split(shards, in_flight, max_requests):
    original = config(trusted_key_servers=[{"server_name": "notary.test"}])
    sec = shard_key_resolution_budget(original, shards)
    assert sec.key_resolution_max_in_flight == in_flight
    assert sec.key_resolution_per_ip_rate.max_requests == max_requests
    # Every other field is unchanged.
    assert sec.key_resolution_per_ip_rate.per_seconds == 60
    assert sec.trusted_key_servers == (TrustedKeyServer("notary.test", None),)
    assert (
        dataclasses.replace(
            sec,
            key_resolution_max_in_flight=16,
            key_resolution_per_ip_rate=original.security.federation.key_resolution_per_ip_rate,
        )
        == original.security.federation
    )


def test_shards_must_be_positive():
    with pytest.raises(ValueError):
        shard_key_resolution_budget(config(), 0)


def test_runtime_applies_its_share(tmp_path):
    base = config()
    base = dataclasses.replace(
        base,
        data_dir=str(tmp_path),
        database=dataclasses.replace(base.database, url=f"sqlite:///{tmp_path}/h.db"),
    )
    shard = HomeserverRuntime(base, key_resolution_shards=4)
    main = HomeserverRuntime(base)
    try:
        assert shard.key_resolution_budget.global_cap == 4
        assert shard.key_resolution_rate.max_requests == 7
        assert main.key_resolution_budget.global_cap == 16
        assert main.key_resolution_rate.max_requests == 30
        assert shard.keyring.budget is shard.key_resolution_budget
    finally:
        shard.close()
        main.close()


@pytest.mark.parametrize(
    "instances, shards, keys, events",
    [
        (2, 1, (8, 15), (8, 15)),  # main of each of two instances
        (3, 1, (5, 10), (5, 10)),
        (2, 4, (2, 3), (2, 3)),  # a shard of one of two instances with four each
        (40, 1, (1, 1), (1, 1)),  # more processes than the limit: each still gets 1
    ],
)
def test_instances_times_shards_share_the_budgets(tmp_path, instances, shards, keys, events):
    """With `cluster.instances`, each process's key and event-resolution budgets are the
    configured ones divided by the instances times its instance's shards (main: by the
    instances alone)."""
    base = config(
        event_resolution_max_in_flight=16,
        event_resolution_per_origin_rate={"max_requests": 30, "per_seconds": 60},
    )
    base = dataclasses.replace(
        base,
        data_dir=str(tmp_path),
        cluster=dataclasses.replace(base.cluster, instances=instances),
    )
    runtime = HomeserverRuntime(base, key_resolution_shards=shards)
    try:
        assert runtime.key_resolution_budget.global_cap == keys[0]
        assert runtime.key_resolution_rate.max_requests == keys[1]
        assert runtime.event_resolution.budget.global_cap == events[0]
        assert runtime.event_resolution.rate.max_requests == events[1]
    finally:
        runtime.close()
