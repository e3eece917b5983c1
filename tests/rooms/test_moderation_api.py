"""Ban, unban, forget and joined_members over HTTP against a real server, with their
refusals."""

from tests.rooms.conftest import V3, create_room, send
from tests.support.spec import assert_matches_spec
from tests.sync.conftest import sync

LEAVE_TOO = {"room": {"include_leave": True}}


def joined_pair(user):
    alice, bob = user("alice"), user("bob")
    room_id = create_room(alice, preset="public_chat")
    assert bob.post(f"{V3}/rooms/{room_id}/join", json={}).status_code == 200
    return alice, bob, room_id


def member(client, room_id: str, user_id: str) -> dict:
    r = client.get(f"{V3}/rooms/{room_id}/state/m.room.member/{user_id}")
    assert r.status_code == 200, r.text
    return r.json()


def refused(response, status: int, errcode: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["errcode"] == errcode


def test_ban_and_unban_with_reasons(server, user):
    alice, bob, room_id = joined_pair(user)
    carol = user("carol")

    # bob has the default level 0: the auth rules refuse his ban.
    r = bob.post(f"{V3}/rooms/{room_id}/ban", json={"user_id": alice.user_id})
    refused(r, 403, "M_FORBIDDEN")

    r = alice.post(f"{V3}/rooms/{room_id}/ban", json={"user_id": bob.user_id, "reason": "spam"})
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "post", "/_matrix/client/v3/rooms/{roomId}/ban")
    assert member(alice, room_id, bob.user_id) == {"membership": "ban", "reason": "spam"}
    refused(bob.post(f"{V3}/rooms/{room_id}/join", json={}), 403, "M_FORBIDDEN")

    # Someone who was never in the room, and another server's user, can be banned too.
    for target in (carol.user_id, "@mallory:elsewhere.example"):
        r = alice.post(f"{V3}/rooms/{room_id}/ban", json={"user_id": target})
        assert r.status_code == 200, r.text
        assert member(alice, room_id, target) == {"membership": "ban"}

    # Unban is leave from ban: only for the banned, and it is no kick.
    refused(
        alice.post(f"{V3}/rooms/{room_id}/unban", json={"user_id": alice.user_id}),
        403,
        "M_BAD_STATE",
    )
    refused(
        bob.post(f"{V3}/rooms/{room_id}/unban", json={"user_id": carol.user_id}), 403, "M_FORBIDDEN"
    )
    r = alice.post(f"{V3}/rooms/{room_id}/unban", json={"user_id": bob.user_id, "reason": "ok"})
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "post", "/_matrix/client/v3/rooms/{roomId}/unban")
    unbanned = alice.get(f"{V3}/rooms/{room_id}/state/m.room.member/{bob.user_id}?format=event")
    assert unbanned.json()["content"] == {"membership": "leave", "reason": "ok"}
    assert unbanned.json()["sender"] == alice.user_id
    assert bob.post(f"{V3}/rooms/{room_id}/join", json={}).status_code == 200


def test_ban_and_unban_refusals(server, user):
    alice, bob, room_id = joined_pair(user)
    refused(alice.post(f"{V3}/rooms/{room_id}/ban", json={}), 400, "M_MISSING_PARAM")
    refused(
        alice.post(f"{V3}/rooms/{room_id}/ban", json={"user_id": "nobody"}), 400, "M_INVALID_PARAM"
    )
    refused(
        alice.post(f"{V3}/rooms/!nowhere:weir.test/ban", json={"user_id": bob.user_id}),
        404,
        "M_NOT_FOUND",
    )
    refused(
        alice.post(f"{V3}/rooms/!nowhere:weir.test/unban", json={"user_id": bob.user_id}),
        404,
        "M_NOT_FOUND",
    )


def test_forget_hides_the_room_from_sync_until_the_next_membership(server, user):
    alice, bob, room_id = joined_pair(user)
    before_leave = sync(bob)["next_batch"]

    # Joined, or invited: not forgettable, as Synapse answers.
    r = bob.post(f"{V3}/rooms/{room_id}/forget", json={})
    refused(r, 400, "M_UNKNOWN")
    invited_room = create_room(alice, invite=[bob.user_id])
    refused(bob.post(f"{V3}/rooms/{invited_room}/forget"), 400, "M_UNKNOWN")

    assert bob.post(f"{V3}/rooms/{room_id}/leave", json={}).status_code == 200
    assert room_id in sync(bob, sync_filter=LEAVE_TOO)["rooms"]["leave"]
    r = bob.post(f"{V3}/rooms/{room_id}/forget", json={})
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "post", "/_matrix/client/v3/rooms/{roomId}/forget")

    # Gone from initial syncs (include_leave too) and from an incremental one that spans
    # the leave.
    assert room_id not in sync(bob, sync_filter=LEAVE_TOO)["rooms"]["leave"]
    assert room_id not in sync(bob)["rooms"]["leave"]
    assert room_id not in sync(bob, before_leave)["rooms"]["leave"]
    # Forgetting again, or a room never joined, is no error.
    assert bob.post(f"{V3}/rooms/{room_id}/forget", json={}).status_code == 200
    assert bob.post(f"{V3}/rooms/!never:weir.test/forget", json={}).status_code == 200

    # Joining again clears the flag: the next leave is shown again.
    since = sync(bob)["next_batch"]
    assert bob.post(f"{V3}/rooms/{room_id}/join", json={}).status_code == 200
    assert room_id in sync(bob, since)["rooms"]["join"]
    assert bob.post(f"{V3}/rooms/{room_id}/leave", json={}).status_code == 200
    assert room_id in sync(bob, sync_filter=LEAVE_TOO)["rooms"]["leave"]


def test_a_banned_user_forgets_the_room(server, user):
    alice, bob, room_id = joined_pair(user)
    assert alice.post(f"{V3}/rooms/{room_id}/ban", json={"user_id": bob.user_id}).status_code == 200
    assert room_id in sync(bob, sync_filter=LEAVE_TOO)["rooms"]["leave"]
    assert bob.post(f"{V3}/rooms/{room_id}/forget", json={}).status_code == 200
    assert room_id not in sync(bob, sync_filter=LEAVE_TOO)["rooms"]["leave"]


def test_joined_members(server, user):
    alice, bob, room_id = joined_pair(user)
    carol = user("carol")
    assert (
        alice.put(
            f"{V3}/profile/{alice.user_id}/avatar_url", json={"avatar_url": "mxc://weir.test/a"}
        ).status_code
        == 200
    )
    send(alice, room_id, "hello")

    r = bob.get(f"{V3}/rooms/{room_id}/joined_members")
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "get", "/_matrix/client/v3/rooms/{roomId}/joined_members")
    joined = r.json()["joined"]
    assert set(joined) == {alice.user_id, bob.user_id}
    alice_event = member(alice, room_id, alice.user_id)
    assert joined[alice.user_id]["avatar_url"] == "mxc://weir.test/a"
    if "displayname" in alice_event:
        assert joined[alice.user_id]["display_name"] == alice_event["displayname"]

    # Members only: not someone outside, not a member who left, not of an unknown room.
    refused(carol.get(f"{V3}/rooms/{room_id}/joined_members"), 403, "M_FORBIDDEN")
    assert bob.post(f"{V3}/rooms/{room_id}/leave", json={}).status_code == 200
    refused(bob.get(f"{V3}/rooms/{room_id}/joined_members"), 403, "M_FORBIDDEN")
    refused(alice.get(f"{V3}/rooms/!nowhere:weir.test/joined_members"), 403, "M_FORBIDDEN")
    assert set(alice.get(f"{V3}/rooms/{room_id}/joined_members").json()["joined"]) == {
        alice.user_id
    }
