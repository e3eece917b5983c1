"""RequesterCache: bounded, expiring, and never keeps what a logout removed, a read that
raced the logout included."""

from __future__ import annotations

from homeserver.accounts.tokens import RequesterCache
from homeserver.core.requester import Requester


class Clock:
    """Time that moves only when the test moves it."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def requester(n: int, user: str = "@a:t", device: str | None = None) -> Requester:
    return Requester(user, device or f"D{n}", False, f"hash{n}")


def test_the_least_recently_used_goes_first():
    cache = RequesterCache(size=2, ttl=60, clock=Clock())
    for n in (1, 2):
        cache.put(requester(n), cache.generation)
    assert cache.get("hash1") == requester(1)  # 2 is now the least recently used
    cache.put(requester(3), cache.generation)
    assert [cache.get(f"hash{n}") for n in (1, 2, 3)] == [requester(1), None, requester(3)]
    assert len(cache) == 2


def test_an_entry_expires():
    clock = Clock()
    cache = RequesterCache(size=10, ttl=30, clock=clock)
    cache.put(requester(1), cache.generation)
    clock.now += 29.9
    assert cache.get("hash1") == requester(1)
    clock.now += 0.1
    assert cache.get("hash1") is None and len(cache) == 0


def test_forgetting_devices_and_users():
    cache = RequesterCache(size=10, ttl=60, clock=Clock())
    for r in (requester(1), requester(2), requester(3, user="@b:t")):
        cache.put(r, cache.generation)
    cache.forget_devices("@a:t", ["D1", "NOSUCH"])
    assert [cache.get(f"hash{n}") for n in (1, 2, 3)] == [None, requester(2), requester(3, "@b:t")]
    cache.forget_user("@a:t")
    assert [cache.get(f"hash{n}") for n in (1, 2, 3)] == [None, None, requester(3, "@b:t")]


def test_a_new_token_for_a_device_replaces_its_old_one():
    cache = RequesterCache(size=10, ttl=60, clock=Clock())
    cache.put(Requester("@a:t", "PHONE", False, "old"), cache.generation)
    cache.put(Requester("@a:t", "PHONE", False, "new"), cache.generation)
    assert cache.get("old") is None and len(cache) == 1
    cache.forget_devices("@a:t", ["PHONE"])
    assert cache.get("new") is None and len(cache) == 0


def test_a_read_that_raced_a_logout_is_not_kept():
    cache = RequesterCache(size=10, ttl=60, clock=Clock())
    before_read = cache.generation
    cache.forget_devices("@a:t", ["D1"])  # the logout lands while the read is in flight
    cache.put(requester(1), before_read)
    assert cache.get("hash1") is None
    cache.put(requester(1), cache.generation)  # a read that started after it is kept
    assert cache.get("hash1") == requester(1)
