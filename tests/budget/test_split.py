"""split_budget: each federation worker shard's share of the key-resolution budget."""

import pytest

from budget import split_budget


@pytest.mark.parametrize(
    "max_in_flight, max_requests, shards, expected",
    [
        (16, 30, 1, (16, 30)),
        (16, 30, 4, (4, 7)),  # rounded down: the shards never exceed the total
        (16, 30, 3, (5, 10)),
        (16, 30, 16, (1, 1)),
        (16, 30, 40, (1, 1)),  # at least 1 each, or a shard could do nothing
        (1, 1, 2, (1, 1)),
    ],
)
def test_split_budget(max_in_flight, max_requests, shards, expected):
    assert split_budget(max_in_flight, max_requests, shards) == expected


@pytest.mark.parametrize("shards", [0, -1])
def test_shards_must_be_at_least_one(shards):
    with pytest.raises(ValueError):
        split_budget(16, 30, shards)
