"""Registrations kept from a long-poll's answer for its client's next request
(homeserver/sync/held_registrations.py): taken once, by the same request, only while
nothing woke them."""

from homeserver.sync import held_registrations as held_module
from homeserver.sync.held_registrations import HeldRegistrations
from homeserver.sync.notifier import Notifier
from homeserver.sync.sliding_request import Extensions, SlidingRequest


def test_a_held_registration_is_dropped_when_woken_or_asked_otherwise(monkeypatch):
    notifier = Notifier(lambda room_id: [])
    held: HeldRegistrations[SlidingRequest, None] = HeldRegistrations(notifier)
    plain = SlidingRequest("c")
    keep_one = notifier.registered("@a:x", presence=False).__enter__()
    held.keep("p1", plain, keep_one, None)
    assert notifier.waiting() == 1 and notifier.parked() == 0
    assert held.take("p1", SlidingRequest("c", extensions=Extensions(typing=True))) is None
    assert notifier.waiting() == 0  # unregistered
    woken = notifier.registered("@a:x", presence=False).__enter__()
    held.keep("p2", plain, woken, None)
    notifier.notify_users(["@a:x"])
    assert held.take("p2", plain) is None and notifier.waiting() == 0
    kept = notifier.registered("@a:x", presence=False).__enter__()
    held.keep("p3", plain, kept, None)
    assert held.take("p3", plain) == (kept, None) and notifier.parked() == 1
    assert held.take("p3", plain) is None  # taken once
    kept.__exit__(None, None, None)
    # One whose client never came back is dropped as others are kept, or taken.
    monkeypatch.setattr(held_module, "HELD_SECONDS", -1.0)
    held.keep("p4", plain, notifier.registered("@a:x", presence=False).__enter__(), None)
    assert notifier.waiting() == 0 and held.take("p4", plain) is None
