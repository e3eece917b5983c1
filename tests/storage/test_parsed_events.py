"""Decoded events kept in memory (storage/parsed_events.py): read twice, decoded once;
never served after the stored text changed, by a redaction here or a write elsewhere; and
bounded by the text it holds."""

from canonicaljson import encode_canonical_json

from homeserver.config import parse_config
from homeserver.core.requester import Requester
from homeserver.rooms.creation import CreateRoomRequest
from homeserver.runtime import HomeserverRuntime
from homeserver.storage.parsed_events import PARSED, ParsedEvents
from homeserver.storage.rooms import TxnKey


def test_an_event_is_decoded_once_and_never_served_stale(tmp_path):
    url = f"sqlite:///{tmp_path}/homeserver.db"
    rt = HomeserverRuntime(
        parse_config(
            {"server_name": "weir.test", "data_dir": str(tmp_path), "database": {"url": url}}
        )
    )
    try:
        user = rt.accounts.register("alice", "pw")
        alice = Requester(user.user_id, user.device_id, False, "")
        room = rt.room_creator.create(user.user_id, CreateRoomRequest())
        first = rt.rooms.send_message(alice, room, "m.room.message", {"body": "one"}, "t1")
        store = rt.room_store
        misses = PARSED.misses
        read = store.get_event(first).event
        assert store.get_event(first).event is read  # the second read decodes nothing
        assert store.events_in_room(room, [first])[first].event is read
        assert PARSED.misses <= misses + 1

        txn = TxnKey(user.user_id, user.device_id, room, "m.room.redaction", "r1")
        rt.rooms.redact(alice, room, first, {}, txn)
        assert store.get_event(first).event.content == {}

        # Another process rewrites the row: the text differs, so it is decoded afresh.
        second = rt.rooms.send_message(alice, room, "m.room.message", {"body": "two"}, "t2")
        assert store.get_event(second).event.content["body"] == "two"
        pdu = dict(store.get_event(second).event.pdu, content={"body": "changed"})
        text = encode_canonical_json(pdu).decode()
        rt.db.write(
            lambda tx: tx.execute("UPDATE events SET json = ? WHERE event_id = ?", (text, second))
        )
        assert store.get_event(second).event.content["body"] == "changed"
    finally:
        rt.close()


def test_the_cache_holds_at_most_its_text_and_not_one_huge_event():
    cache = ParsedEvents(max_text=1600)
    texts = {f"$e{n}": '{"n": %d, "pad": "%s"}' % (n, "x" * 80) for n in range(40)}
    for event_id, text in texts.items():
        assert cache.event(event_id, text).pdu["n"] == int(event_id[2:])
    held = sum(len(texts[e]) for e in cache._entries)
    assert 0 < held <= 1600 and len(cache) < 40
    assert "$e39" in cache._entries and "$e0" not in cache._entries  # oldest use went first

    huge = '{"pad": "%s"}' % ("y" * 500)
    assert cache.event("$huge", huge).pdu["pad"].startswith("y")
    assert "$huge" not in cache._entries and "$e39" in cache._entries
    cache.drop("$e39")
    assert "$e39" not in cache._entries
    assert cache._text == sum(len(texts[e]) for e in cache._entries)
