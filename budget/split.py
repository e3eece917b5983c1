"""Dividing a budget among federation worker shards (adr/key-resolution-shards.md)."""

from __future__ import annotations

import operator

__all__ = ["split_budget"]


def split_budget(max_in_flight: int, max_requests: int, shards: int) -> tuple[int, int]:
    """Each shard's share of an in-flight cap and a rate's ``max_requests``.

    Rounded down so the shards together never exceed the configured limit,
    but at least 1 each, or a shard could do nothing at all. (With more
    shards than the limit, the total is therefore the shard count.)
    """
    shards = operator.index(shards)
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    return max(1, max_in_flight // shards), max(1, max_requests // shards)
