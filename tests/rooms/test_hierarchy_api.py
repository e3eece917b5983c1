"""Spaces over the client-server API on the real server (SQLite and PostgreSQL):
`GET /_matrix/client/v1/rooms/{roomId}/hierarchy` walks m.space.child links breadth first,
with suggested_only, max_depth, limit and from, walks a loop once, leaves out what the user
may not see, and refuses a hidden or unknown root (403)."""

from urllib.parse import quote

from tests.rooms.conftest import V3, create_room
from tests.support.spec import assert_matches_spec

HIERARCHY = "/_matrix/client/v1/rooms/{roomId}/hierarchy"


def hierarchy(client, room_id: str, status: int = 200, **params) -> dict:
    r = client.get(f"/_matrix/client/v1/rooms/{quote(room_id, safe='')}/hierarchy", params=params)
    assert r.status_code == status, r.text
    assert_matches_spec(r, "GET", HIERARCHY)
    return r.json()


def space(client, name: str, **body) -> str:
    return create_room(
        client, name=name, creation_content={"type": "m.space"}, preset="public_chat", **body
    )


def link(client, parent: str, child: str, suggested: bool = False, **content) -> None:
    content = {"via": ["weir.test"], "suggested": suggested, **content}
    r = client.put(f"{V3}/rooms/{quote(parent, safe='')}/state/m.space.child/{child}", json=content)
    assert r.status_code == 200, r.text


def ids(body: dict) -> list[str]:
    return [room["room_id"] for room in body["rooms"]]


def test_a_nested_space_is_walked_breadth_first(user):
    alice = user("alice")
    root, sub = space(alice, "Root"), space(alice, "Sub")
    lobby = create_room(alice, name="Lobby", topic="hello", preset="public_chat")
    deep = create_room(alice, name="Deep", preset="public_chat")
    link(alice, root, sub, order="b")
    link(alice, root, lobby, suggested=True, order="a")
    link(alice, sub, deep)
    body = hierarchy(alice, root)
    assert ids(body) == [root, lobby, sub, deep]
    assert "next_batch" not in body
    first = body["rooms"][0]
    assert first["room_type"] == "m.space" and first["name"] == "Root"
    assert first["num_joined_members"] == 1 and first["join_rule"] == "public"
    assert [c["state_key"] for c in first["children_state"]] == [lobby, sub]
    assert first["children_state"][0]["content"]["suggested"] is True
    assert body["rooms"][1]["topic"] == "hello" and "room_type" not in body["rooms"][1]
    assert ids(hierarchy(alice, root, suggested_only="true")) == [root, lobby]
    assert ids(hierarchy(alice, root, max_depth=1)) == [root, lobby, sub]
    assert ids(hierarchy(alice, root, max_depth=0)) == [root]


def test_pages_follow_from_tokens(user):
    alice = user("alice")
    root = space(alice, "Paged")
    children = [create_room(alice, name=f"c{i}", preset="public_chat") for i in range(5)]
    for i, child in enumerate(children):
        link(alice, root, child, order=f"{i}")
    seen, token = [], None
    while True:
        params = {"limit": 2, **({"from": token} if token else {})}
        body = hierarchy(alice, root, **params)
        assert len(body["rooms"]) <= 2
        seen += ids(body)
        token = body.get("next_batch")
        if token is None:
            break
    assert seen == [root, *children]
    hierarchy(alice, root, status=400, limit=2, suggested_only="true", **{"from": token or "x"})


def test_a_loop_is_walked_once(user):
    alice = user("alice")
    a, b = space(alice, "A"), space(alice, "B")
    link(alice, a, b)
    link(alice, b, a)
    assert ids(hierarchy(alice, a)) == [a, b]


def test_a_private_child_the_user_cannot_see_is_left_out(user):
    alice, bob = user("alice"), user("bob")
    root = space(alice, "Mixed")
    public = create_room(alice, name="Open", preset="public_chat")
    private = create_room(alice, name="Secret", preset="private_chat")
    link(alice, root, public)
    link(alice, root, private)
    assert set(ids(hierarchy(alice, root))) == {root, public, private}
    shown = hierarchy(bob, root)
    assert ids(shown) == [root, public]
    # The link itself is still part of the space's state, which bob may see.
    assert {c["state_key"] for c in shown["rooms"][0]["children_state"]} == {public, private}


def test_a_hidden_or_unknown_root_is_403(user, server):
    alice, bob = user("alice"), user("bob")
    hidden = create_room(
        alice, name="Hidden", preset="private_chat", creation_content={"type": "m.space"}
    )
    body = hierarchy(bob, hidden, status=403)
    assert body["errcode"] == "M_FORBIDDEN"
    # The spec names 403 only: an unknown room answers as a hidden one does.
    assert hierarchy(bob, "!nothere:weir.test", status=403)["errcode"] == "M_FORBIDDEN"
    assert hierarchy(alice, hidden)["rooms"][0]["room_id"] == hidden
