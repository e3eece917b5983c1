"""Registrations kept from a long-poll's answer for its client's next request
(homeserver/sync/held_registrations.py): taken once, by the same request, woken since or
not."""

from homeserver.sync import held_registrations as held_module
from homeserver.sync.held_registrations import HeldRegistrations
from homeserver.sync.notifier import Notifier
from homeserver.sync.sliding_request import Extensions, SlidingRequest


def test_a_held_registration_is_taken_by_its_request_alone_woken_or_not(monkeypatch):
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
    notifier.notify_users(["@a:x"], recompute=False)
    # Woken since: taken with its wake, which the request goes on from.
    assert held.take("p2", plain) == (woken, None) and woken.woken.is_set()
    assert not woken.recompute and held.taken == 0 and notifier.parked() == 1
    woken.__exit__(None, None, None)
    kept = notifier.registered("@a:x", presence=False).__enter__()
    held.keep("p3", plain, kept, None)
    assert held.take("p3", plain) == (kept, None) and notifier.parked() == 1
    assert held.taken == 1  # parked with no computation
    assert held.take("p3", plain) is None  # taken once
    kept.__exit__(None, None, None)
    # One whose client never came back is dropped as others are kept, or taken.
    monkeypatch.setattr(held_module, "HELD_SECONDS", -1.0)
    held.keep("p4", plain, notifier.registered("@a:x", presence=False).__enter__(), None)
    assert notifier.waiting() == 0 and held.take("p4", plain) is None
