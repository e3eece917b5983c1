"""`POST /search` on the real server (SQLite and PostgreSQL): room events found by their
words in the user's joined rooms only, as history visibility lets them see each; best match
or newest first; pages through next_batch; filters, keys, event context, state and groups;
hostile terms and bad bodies."""

import pytest

from tests.rooms.conftest import V3, create_room, send
from tests.rooms.test_redactions_api import redact
from tests.rooms.test_relations_api import bundled, edit, q, send_event
from tests.support.spec import assert_matches_spec

SEARCH = "/_matrix/client/v3/search"


def search(client, term: str, status: int = 200, next_batch=None, **room_events) -> dict:
    body = {"search_categories": {"room_events": {"search_term": term, **room_events}}}
    params = {"next_batch": next_batch} if next_batch is not None else {}
    r = client.post(SEARCH, json=body, params=params)
    assert r.status_code == status, r.text
    if status == 200:
        assert_matches_spec(r, "POST", SEARCH)
        return r.json()["search_categories"]["room_events"]
    return r.json()


def ids(found: dict) -> list[str]:
    return [r["result"]["event_id"] for r in found["results"]]


def join(client, room_id: str) -> None:
    r = client.post(f"{V3}/join/{q(room_id)}", json={})
    assert r.status_code == 200, r.text


def test_finds_messages_newest_or_best_first_with_aggregations(user):
    alice = user("alice")
    room = create_room(alice, name="Gardening", topic="all about tulips")
    long_one = send(alice, room, "tulips are a spring flower and this sentence goes on and on")
    short_one = send(alice, room, "tulips tulips")
    send(alice, room, "roses only")
    edited = edit(alice, room, short_one, "tulips tulips, edited")

    recent = search(alice, "tulips", order_by="recent")
    assert ids(recent)[:3] == [edited, short_one, long_one]
    assert recent["results"][3]["result"]["type"] == "m.room.topic"
    assert recent["highlights"] == ["tulips"]
    assert recent["count"] == len(recent["results"])
    orders = [r["result"]["origin_server_ts"] for r in recent["results"]]
    assert orders == sorted(orders, reverse=True)

    ranked = search(alice, "tulips", order_by="rank")
    ranks = [r["rank"] for r in ranked["results"]]
    assert ranks == sorted(ranks, reverse=True)
    assert ids(ranked).index(short_one) < ids(ranked).index(long_one)
    first = next(r["result"] for r in ranked["results"] if r["result"]["event_id"] == short_one)
    assert bundled(first)["m.replace"]["event_id"]  # the edit is bundled

    topic = search(alice, "tulips", keys=["content.topic"])
    assert [r["result"]["type"] for r in topic["results"]] == ["m.room.topic"]
    assert ids(search(alice, "gardening", keys=["content.name"]))
    assert search(alice, "gardening", keys=["content.body"])["results"] == []


def test_pages_through_next_batch(user):
    alice = user("alice")
    room = create_room(alice)
    sent = [send(alice, room, f"marigold number {i}") for i in range(7)]
    seen: list[str] = []
    token = None
    for _ in range(10):
        page = search(alice, "marigold", order_by="recent", filter={"limit": 3}, next_batch=token)
        assert len(page["results"]) <= 3
        seen += ids(page)
        token = page.get("next_batch")
        if token is None:
            break
    assert seen == list(reversed(sent))
    assert len(search(alice, "marigold", filter={"limit": 500})["results"]) == 7  # capped, not 0
    search(alice, "marigold", status=400, filter={"limit": -1})
    search(alice, "marigold", status=400, next_batch="nonsense")


def test_filters_by_room_sender_and_type(user):
    alice, bob = user("alice"), user("bob")
    first, second = create_room(alice, preset="public_chat"), create_room(alice)
    join(bob, first)
    from_alice = send(alice, first, "daffodil from alice")
    from_bob = send(bob, first, "daffodil from bob")
    elsewhere = send(alice, second, "daffodil elsewhere")
    assert set(ids(search(alice, "daffodil"))) == {from_alice, from_bob, elsewhere}
    assert set(ids(search(alice, "daffodil", filter={"rooms": [first]}))) == {
        from_alice,
        from_bob,
    }
    assert ids(search(alice, "daffodil", filter={"not_rooms": [first]})) == [elsewhere]
    assert ids(search(alice, "daffodil", filter={"senders": [bob.user_id]})) == [from_bob]
    not_alice = search(alice, "daffodil", filter={"not_senders": [alice.user_id]})
    assert ids(not_alice) == [from_bob]
    assert search(alice, "daffodil", filter={"types": ["m.room.topic"]})["results"] == []


def test_event_context_state_and_groups(user):
    alice, bob = user("alice"), user("bob")
    room = create_room(alice, name="Context room", preset="public_chat")
    join(bob, room)
    r = alice.put(f"{V3}/profile/{q(alice.user_id)}/displayname", json={"displayname": "Alice A"})
    assert r.status_code == 200, r.text
    before = [send(alice, room, f"filler before {i}") for i in range(3)]
    hit = send(bob, room, "the lilac blooms")
    after = [send(alice, room, f"filler after {i}") for i in range(3)]

    found = search(
        alice,
        "lilac",
        event_context={"before_limit": 2, "after_limit": 1, "include_profile": True},
        include_state=True,
        groupings={"group_by": [{"key": "room_id"}, {"key": "sender"}]},
    )
    assert ids(found) == [hit]
    context = found["results"][0]["context"]
    assert [e["event_id"] for e in context["events_before"]] == [before[2], before[1]]
    assert [e["event_id"] for e in context["events_after"]] == [after[0]]
    assert context["start"] and context["end"]
    assert context["profile_info"][alice.user_id]["displayname"] == "Alice A"
    assert bob.user_id in context["profile_info"]
    state_types = {e["type"] for e in found["state"][room]}
    assert {"m.room.create", "m.room.name", "m.room.member"} <= state_types
    assert found["groups"]["room_id"][room] == {"order": 1, "results": [hit]}
    assert found["groups"]["sender"][bob.user_id]["results"] == [hit]

    # The context's tokens page on through /messages.
    r = alice.get(f"{V3}/rooms/{q(room)}/messages", params={"from": context["start"], "dir": "b"})
    assert r.status_code == 200, r.text
    assert r.json()["chunk"][0]["event_id"] == before[0]


def test_only_rooms_the_user_is_in_and_may_see(user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room = create_room(alice, preset="public_chat")
    hidden = create_room(alice, preset="public_chat")
    r = alice.put(
        f"{V3}/rooms/{q(hidden)}/state/m.room.history_visibility/",
        json={"history_visibility": "joined"},
    )
    assert r.status_code == 200, r.text
    early = send(alice, hidden, "peony before carol")
    join(bob, room)
    seen_by_bob = send(alice, room, "peony for everyone")
    assert ids(search(bob, "peony")) == [seen_by_bob]
    assert search(carol, "peony")["results"] == []  # never joined either

    r = bob.post(f"{V3}/rooms/{q(room)}/leave", json={})
    assert r.status_code == 200, r.text
    assert search(bob, "peony")["results"] == []  # left

    join(carol, hidden)
    later = send(alice, hidden, "peony after carol")
    assert ids(search(carol, "peony")) == [later]
    assert early in ids(search(alice, "peony"))


def test_a_redacted_message_is_not_found(user):
    alice = user("alice")
    room = create_room(alice)
    gone = send(alice, room, "camellia secret")
    kept = send(alice, room, "camellia public")
    assert redact(alice, room, gone, "r1").status_code == 200
    assert ids(search(alice, "camellia")) == [kept]


@pytest.mark.parametrize("term", ['"', "*", "OR", "'", "NOT", 'zinnia" OR "x', "zinnia*", ""])
def test_hostile_terms_are_searched_as_words(user, term):
    alice = user("alice")
    room = create_room(alice)
    send_event(alice, room, {"msgtype": "m.text", "body": "zinnia OR * ' \" NOT"})
    found = search(alice, term)
    assert found["count"] == len(found["results"]) <= 1


def test_bad_requests_are_refused(user):
    alice = user("alice")
    r = alice.post(SEARCH, json={"search_categories": {"room_events": {}}})
    assert r.status_code == 400 and r.json()["errcode"] == "M_MISSING_PARAM", r.text
    r = alice.post(SEARCH, json={"search_categories": {"groups": {}}})
    assert r.status_code == 400 and r.json()["errcode"] == "M_INVALID_PARAM", r.text
    for bad in (
        {"order_by": "oldest"},
        {"keys": ["content.url"]},
        {"groupings": {"group_by": [{"key": "type"}]}},
        {"event_context": {"before_limit": -1}},
        {"filter": {"limit": "ten"}},
        {"search_term": 7},
    ):
        body = {"search_categories": {"room_events": {"search_term": "x", **bad}}}
        r = alice.post(SEARCH, json=body)
        assert r.status_code == 400 and r.json()["errcode"] == "M_BAD_JSON", (bad, r.text)
    r = alice.post(SEARCH, json={})
    assert r.status_code == 400, r.text
    r = alice.post(SEARCH, json={"search_categories": {}})
    assert r.status_code == 200 and r.json() == {"search_categories": {}}, r.text
    r = alice.post(
        SEARCH, json={"search_categories": {"room_events": {"search_term": "x"}}}, auth=False
    )
    assert r.status_code == 401, r.text
