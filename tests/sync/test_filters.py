"""Inline /sync filters (homeserver/sync/filters.py), parsed once per text."""

import json

import pytest

from homeserver.core.errors import MatrixError
from homeserver.sync import filters
from homeserver.sync.filters import Filters


def test_an_inline_filter_is_parsed_once_and_shared_within_a_bound():
    resolver = Filters(store=None)  # inline filters are never stored
    element = json.dumps({"room": {"state": {"lazy_load_members": True}}})
    first = resolver.resolve("@a:t", element)
    assert first.room.state.lazy_load_members
    # Another user's sync with the same text shares the parsed filter.
    assert resolver.resolve("@b:t", element) is first
    for limit in range(1, filters._INLINE_FILTERS + 1):
        resolver.resolve("@a:t", json.dumps({"room": {"timeline": {"limit": limit}}}))
    assert len(resolver._inline) == filters._INLINE_FILTERS
    again = resolver.resolve("@a:t", element)  # the oldest went first
    assert again is not first and again == first
    with pytest.raises(MatrixError):
        resolver.resolve("@a:t", "{not json")
    assert "{not json" not in resolver._inline
