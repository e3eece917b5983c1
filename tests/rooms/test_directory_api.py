"""Aliases, directory visibility and the public room list over HTTP, against a real server."""

import gevent

from tests.rooms.conftest import V3, alias_path, create_room
from tests.support.server import MatrixClient
from tests.support.spec import assert_matches_spec

PUBLIC_ROOMS = "/_matrix/client/v3/publicRooms"


def local_name(client) -> str:
    return client.user_id[1:].split(":")[0]


def public_rooms(client, **params) -> dict:
    r = client.get(f"{V3}/publicRooms", params=params, auth=False)
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "get", PUBLIC_ROOMS)
    return r.json()


def search(client, body) -> dict:
    r = client.post(f"{V3}/publicRooms", json=body)
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "post", PUBLIC_ROOMS)
    return r.json()


def listed(client, room_id) -> dict | None:
    """The room's entry in the public list, paging through all of it."""
    since = None
    while True:
        page = public_rooms(client, limit=50, **({"since": since} if since else {}))
        for entry in page["chunk"]:
            if entry["room_id"] == room_id:
                return entry
        since = page.get("next_batch")
        if since is None:
            return None


def test_alias_crud_and_permissions(server, user):
    alice, bob, mod = user("alice"), user("bob"), user("mod")
    room_id = create_room(alice, preset="public_chat")
    alias = f"#crud-{local_name(alice)}:weir.test"

    put = bob.put(alias_path(alias), json={"room_id": room_id})
    assert (put.status_code, put.json()["errcode"]) == (403, "M_FORBIDDEN")  # not in the room
    bob.post(f"{V3}/join/{room_id}", json={})
    put = bob.put(alias_path(alias), json={"room_id": room_id})
    assert put.status_code == 200
    assert_matches_spec(put, "put", "/_matrix/client/v3/directory/room/{roomAlias}")
    again = alice.put(alias_path(alias), json={"room_id": room_id})
    assert (again.status_code, again.json()["errcode"]) == (409, "M_UNKNOWN")
    assert_matches_spec(again, "put", "/_matrix/client/v3/directory/room/{roomAlias}")

    for bad in ("crud", "#:weir.test", "#nohost", "#a:bad host", "#" + "x" * 300 + ":weir.test"):
        r = alice.put(alias_path(bad), json={"room_id": room_id})
        assert (r.status_code, r.json()["errcode"]) == (400, "M_INVALID_PARAM"), bad
    elsewhere = alice.put(alias_path("#x:elsewhere.example"), json={"room_id": room_id})
    assert (elsewhere.status_code, elsewhere.json()["errcode"]) == (400, "M_INVALID_PARAM")
    no_room = alice.put(
        alias_path(f"#ghost-{local_name(alice)}:weir.test"), json={"room_id": "!ghost:weir.test"}
    )
    assert (no_room.status_code, no_room.json()["errcode"]) == (404, "M_NOT_FOUND")

    aliases = alice.get(f"{V3}/rooms/{room_id}/aliases")
    assert aliases.json() == {"aliases": [alias]}
    assert_matches_spec(aliases, "get", "/_matrix/client/v3/rooms/{roomId}/aliases")
    outsider = mod.get(f"{V3}/rooms/{room_id}/aliases")
    assert (outsider.status_code, outsider.json()["errcode"]) == (403, "M_FORBIDDEN")
    # A room that does not exist looks the same to a non-member: which rooms exist is not
    # theirs to learn (the spec names 403 for this endpoint, not 404).
    ghost = mod.get(f"{V3}/rooms/!ghost:weir.test/aliases")
    assert (ghost.status_code, ghost.json()) == (outsider.status_code, outsider.json())

    # Deleting: not by a member without power, yes by the alias's creator...
    mod.post(f"{V3}/join/{room_id}", json={})
    denied = mod.delete(alias_path(alias))
    assert (denied.status_code, denied.json()["errcode"]) == (403, "M_FORBIDDEN")
    assert bob.delete(alias_path(alias)).status_code == 200
    gone = alice.get(alias_path(alias))
    assert (gone.status_code, gone.json()["errcode"]) == (404, "M_NOT_FOUND")
    assert_matches_spec(gone, "get", "/_matrix/client/v3/directory/room/{roomAlias}")
    missing = alice.delete(alias_path(alias))
    assert (missing.status_code, missing.json()["errcode"]) == (404, "M_NOT_FOUND")

    # ...and by a user with power in the room, who did not create it.
    bob.put(alias_path(alias), json={"room_id": room_id})
    deleted = alice.delete(alias_path(alias))
    assert deleted.status_code == 200
    assert_matches_spec(deleted, "delete", "/_matrix/client/v3/directory/room/{roomAlias}")


def test_canonical_alias_must_point_to_the_room(server, user):
    alice = user("alice")
    room_id = create_room(alice, room_alias_name=f"canon-{local_name(alice)}")
    other_room = create_room(alice, room_alias_name=f"other-{local_name(alice)}")
    own, other = f"#canon-{local_name(alice)}:weir.test", f"#other-{local_name(alice)}:weir.test"
    path = f"{V3}/rooms/{room_id}/state/m.room.canonical_alias"
    assert alice.put(path, json={"alias": own, "alt_aliases": []}).status_code == 200
    wrong = alice.put(path, json={"alias": own, "alt_aliases": [other]})
    assert (wrong.status_code, wrong.json()["errcode"]) == (400, "M_BAD_ALIAS")
    bad = alice.put(path, json={"alias": "not an alias"})
    assert (bad.status_code, bad.json()["errcode"]) == (400, "M_INVALID_PARAM")
    # Another server's alias is not checked: that would be an outbound call while sending.
    remote = alice.put(path, json={"alias": "#x:elsewhere.example"})
    assert remote.status_code == 200
    assert other_room != room_id


def test_visibility_toggle(server, user):
    alice, bob = user("alice"), user("bob")
    room_id = create_room(alice, name=f"Toggle {local_name(alice)}")
    path = f"{V3}/directory/list/room/{room_id}"
    r = MatrixClient(server.client_url).get(path)
    assert r.json() == {"visibility": "private"}
    assert_matches_spec(r, "get", "/_matrix/client/v3/directory/list/room/{roomId}")
    assert listed(alice, room_id) is None

    put = alice.put(path, json={"visibility": "public"})
    assert put.status_code == 200
    assert_matches_spec(put, "put", "/_matrix/client/v3/directory/list/room/{roomId}")
    assert alice.get(path).json() == {"visibility": "public"}
    assert listed(alice, room_id)["name"] == f"Toggle {local_name(alice)}"

    denied = bob.put(path, json={"visibility": "private"})
    assert (denied.status_code, denied.json()["errcode"]) == (403, "M_FORBIDDEN")
    assert alice.put(path, json={"visibility": "private"}).status_code == 200
    assert listed(alice, room_id) is None
    assert alice.put(path, json={"visibility": "hidden"}).status_code == 400
    unknown = alice.get(f"{V3}/directory/list/room/!nope:weir.test")
    assert (unknown.status_code, unknown.json()["errcode"]) == (404, "M_NOT_FOUND")
    assert alice.put(f"{V3}/directory/list/room/!nope:weir.test", json={}).status_code == 404


def test_member_counts_follow_join_and_leave(server, user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room_id = create_room(alice, visibility="public", topic="counting")
    assert listed(alice, room_id)["num_joined_members"] == 1
    bob.post(f"{V3}/join/{room_id}", json={})
    carol.post(f"{V3}/rooms/{room_id}/join", json={})
    entry = listed(alice, room_id)
    assert entry["num_joined_members"] == 3
    assert entry["join_rule"] == "public" and entry["topic"] == "counting"
    bob.post(f"{V3}/rooms/{room_id}/leave", json={})
    assert listed(alice, room_id)["num_joined_members"] == 2
    alice.post(f"{V3}/rooms/{room_id}/kick", json={"user_id": carol.user_id})
    assert listed(alice, room_id)["num_joined_members"] == 1


def test_public_rooms_parameter_errors(server, user):
    alice = user("alice")
    ours = public_rooms(alice, server="weir.test")
    assert "chunk" in ours
    bad = alice.get(f"{V3}/publicRooms", params={"server": "not a server"})
    assert (bad.status_code, bad.json()["errcode"]) == (400, "M_INVALID_PARAM")
    bad_since = alice.get(f"{V3}/publicRooms", params={"since": "garbage"})
    assert (bad_since.status_code, bad_since.json()["errcode"]) == (400, "M_INVALID_PARAM")
    assert alice.post(f"{V3}/publicRooms", json={}, auth=False).status_code == 401


def test_public_rooms_filter_ignores_unknown_keys(server, user):
    # The spec's Filter object does not forbid other keys (clients sent the unstable
    # "org.matrix.msc3827.room_types" beside room_types): they are ignored, not refused.
    alice = user("alice")
    room_id = create_room(alice, visibility="public", name=f"Extra {local_name(alice)}")
    found = search(
        alice,
        {
            "filter": {
                "generic_search_term": f"Extra {local_name(alice)}",
                "org.matrix.msc3827.room_types": [None],
            }
        },
    )
    assert [entry["room_id"] for entry in found["chunk"]] == [room_id]


def test_public_list_pages_every_room_exactly_once(start_weir, database_url):
    """25 rooms, pages of 10, while rooms are added and member counts change mid-way."""
    weir = start_weir({"database": {"url": database_url}})
    owner = MatrixClient(weir.client_url)
    owner.register("owner")
    joiners = []
    for i in range(6):
        joiner = MatrixClient(weir.client_url)
        joiner.register(f"joiner{i}")
        joiners.append(joiner)

    rooms = []
    for i in range(25):
        kind = ["Gardening", "Chess", "Jazz"][i % 3]
        rooms.append(
            create_room(
                owner,
                visibility="public",
                name=f"{kind} club {i}",
                topic=f"All about {kind.lower()}",
                room_alias_name=f"club{i}",
            )
        )
    # Distinct sizes for some, ties for the rest: room i gets i % 4 extra members.
    jobs = [
        gevent.spawn(joiners[j].post, f"{V3}/join/{room_id}", json={})
        for i, room_id in enumerate(rooms)
        for j in range(i % 4)
    ]
    gevent.joinall(jobs, raise_error=True)
    assert all(j.value.status_code == 200 for j in jobs)

    first = search(owner, {"limit": 10})
    assert first["total_room_count_estimate"] == 25
    assert "prev_batch" not in first
    pages = [first]
    # Between pages: new rooms appear, and small rooms grow past the cursor.
    create_room(owner, visibility="public", name="Late arrival")
    for joiner in joiners[4:]:
        for room_id in rooms[:8]:
            assert joiner.post(f"{V3}/join/{room_id}", json={}).status_code == 200
    while "next_batch" in pages[-1]:
        pages.append(search(owner, {"limit": 10, "since": pages[-1]["next_batch"]}))
        create_room(owner, visibility="public", name=f"Later still {len(pages)}")

    ids = [entry["room_id"] for page in pages for entry in page["chunk"]]
    assert [len(page["chunk"]) for page in pages] == [10, 10, 5]
    assert sorted(ids) == sorted(rooms)  # every room once; none added mid-way
    # Largest first by the counts when paging began, room ID breaking ties.
    sizes = {room_id: 1 + i % 4 for i, room_id in enumerate(rooms)}
    assert ids == sorted(rooms, key=lambda r: (-sizes[r], r))

    # Going back from the second page gives the first again.
    back = search(owner, {"limit": 10, "since": pages[1]["prev_batch"]})
    assert [e["room_id"] for e in back["chunk"]] == [e["room_id"] for e in first["chunk"]]
    assert "prev_batch" not in back and back["next_batch"]

    # A fresh listing sees the late rooms and the new counts.
    fresh = search(owner, {"limit": 100})
    assert fresh["total_room_count_estimate"] == 25 + len(pages)
    assert {e["room_id"]: e["num_joined_members"] for e in fresh["chunk"]}[rooms[0]] == 3

    # Search: only matches, over name, topic and alias, case-insensitively.
    chess = search(owner, {"filter": {"generic_search_term": "CHESS"}})
    assert {e["room_id"] for e in chess["chunk"]} == set(rooms[1::3])
    assert chess["total_room_count_estimate"] == len(rooms[1::3])
    by_topic = search(owner, {"filter": {"generic_search_term": "about jazz"}, "limit": 3})
    assert len(by_topic["chunk"]) == 3 and "next_batch" in by_topic
    assert all("Jazz" in e["name"] for e in by_topic["chunk"])
    by_alias = search(owner, {"filter": {"generic_search_term": "club12:"}})
    assert [e["room_id"] for e in by_alias["chunk"]] == [rooms[12]]
    assert search(owner, {"filter": {"generic_search_term": "100%_"}})["chunk"] == []

    # Room types: spaces only, or rooms without a type.
    space = create_room(
        owner, visibility="public", name="A space", creation_content={"type": "m.space"}
    )
    spaces = search(owner, {"filter": {"room_types": ["m.space"]}})
    assert [e["room_id"] for e in spaces["chunk"]] == [space]
    assert spaces["chunk"][0]["room_type"] == "m.space"
    untyped = search(owner, {"filter": {"room_types": [None]}, "limit": 500})
    assert space not in {e["room_id"] for e in untyped["chunk"]}
    assert len(untyped["chunk"]) == 25 + len(pages)
    # No bridged networks here.
    assert search(owner, {"third_party_instance_id": "irc"})["chunk"] == []


def test_search_finds_a_name_with_capital_letters_beyond_ascii(server, user):
    # The term and the room's fields are folded by the same function: a name written with
    # "É" is found by that very name, whatever case folding the database's locale knows.
    alice = user("alice")
    marker = local_name(alice)
    room_id = create_room(
        alice, visibility="public", name=f"Élan Ünion {marker}", topic=f"ÇA {marker}"
    )
    for term in (f"Élan Ünion {marker}", "ÉLAN ÜNION", f"ÇA {marker}"):
        found = search(alice, {"filter": {"generic_search_term": term}})
        assert room_id in {e["room_id"] for e in found["chunk"]}, term
