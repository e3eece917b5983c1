"""Remote typing ends on its own: the m.typing EDU carries no timeout, so a remote user shows
typing for REMOTE_TYPING_TIMEOUT_MS unless its server says it again, whatever the EDU adds.
In process, with the timeout shortened; the end is waited on as the change it causes."""

import gevent
from gevent.event import Event

import homeserver.sync.typing as typing_module
from homeserver.sync.edus import InboundEdus
from homeserver.sync.typing import TypingNotifications

ROOM = "!room:weir.test"
BOB = "@bob:o1.test"


class _Server:
    """What typing reads of the rooms service: our server name."""

    server_name = "weir.test"


def test_remote_typing_times_out_whatever_the_edu_says(monkeypatch):
    monkeypatch.setattr(typing_module, "REMOTE_TYPING_TIMEOUT_MS", 100)
    changes: list[Event] = [Event(), Event()]
    typing = TypingNotifications(_Server(), lambda room_id: changes.pop(0).set())
    first, second = changes
    edus = InboundEdus(
        lambda room_id: [BOB],
        typing,
        receipts=None,  # type: ignore[arg-type]
        acl_allows=lambda room_id, server: True,
    )
    try:
        content = {"room_id": ROOM, "user_id": BOB, "typing": True, "timeout": 10**9}
        edus.receive("o1.test", [{"edu_type": "m.typing", "content": content}])
        assert first.wait(1) and typing.changes([ROOM], 0) == {ROOM: [BOB]}
        at = typing.position
        with gevent.Timeout(5):
            second.wait()  # the expiry, after 100 ms and not 10**9
        assert typing.changes([ROOM], at) == {ROOM: []}
    finally:
        typing.close()
