"""Server-side key backups on the real server, SQLite and PostgreSQL: the version life cycle,
the spec's rule for replacing a stored key, writes to a version that is not current, the keys
at each level with their etag and count, and what deleting removes from the database."""

import json
import sqlite3

import pytest

from tests.rooms.conftest import V3
from tests.support.spec import assert_matches_spec

ALGORITHM = "m.megolm_backup.v1.curve25519-aes-sha2"
VERSION = f"{V3}/room_keys/version"
KEYS = f"{V3}/room_keys/keys"
SPEC_VERSION = "/_matrix/client/v3/room_keys/version"
SPEC_VERSION_N = "/_matrix/client/v3/room_keys/version/{version}"
SPEC_KEYS = "/_matrix/client/v3/room_keys/keys"
SPEC_ROOM = "/_matrix/client/v3/room_keys/keys/{roomId}"
SPEC_SESSION = "/_matrix/client/v3/room_keys/keys/{roomId}/{sessionId}"
ROOM_A = "!aaaa:example.org"
ROOM_B = "!bbbb:example.org"


def auth_data(public_key: str = "abcdefg") -> dict:
    return {"public_key": public_key, "signatures": {"@alice:example.org": {"ed25519:DEV": "sig"}}}


def key(index: int = 0, forwarded: int = 0, verified: bool = False, mark: str = "k") -> dict:
    """A KeyBackupData; `mark` stands in for the ciphertext, to tell keys apart."""
    return {
        "first_message_index": index,
        "forwarded_count": forwarded,
        "is_verified": verified,
        "session_data": {"ephemeral": "eph", "ciphertext": mark, "mac": "mac"},
    }


def create(client, data: dict | None = None) -> str:
    r = client.post(VERSION, json={"algorithm": ALGORITHM, "auth_data": data or auth_data()})
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "POST", SPEC_VERSION)
    return r.json()["version"]


def current(client) -> dict:
    r = client.get(VERSION)
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "GET", SPEC_VERSION)
    return r.json()


def put_session(client, version, room_id, session_id, body):
    return client.put(f"{KEYS}/{room_id}/{session_id}", params={"version": version}, json=body)


def get_all(client, version) -> dict:
    r = client.get(KEYS, params={"version": version})
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "GET", SPEC_KEYS)
    return r.json()


def stored_key_rows(server, user_id: str) -> int:
    """Rows of the user's backed-up keys in the database the server writes, every version."""
    sql = "SELECT COUNT(*) FROM key_backup_keys WHERE user_id = {}"
    url = server.database_url
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(f"file:{url[len('sqlite:///') :]}?mode=ro", uri=True)
        try:
            return conn.execute(sql.format("?"), (user_id,)).fetchone()[0]
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(sql.format("%s"), (user_id,)).fetchone()
        assert row is not None
        return row[0]


def error(r, status: int, errcode: str) -> dict:
    assert (r.status_code, r.json()["errcode"]) == (status, errcode), r.text
    return r.json()


# --- versions ------------------------------------------------------------------------------


def test_version_life_cycle(server, user):
    alice = user("alice")
    error(alice.get(VERSION), 404, "M_NOT_FOUND")
    v1 = create(alice)
    assert v1 == "1"
    assert current(alice) == {
        "version": "1",
        "algorithm": ALGORITHM,
        "auth_data": auth_data(),
        "etag": current(alice)["etag"],
        "count": 0,
    }
    r = alice.get(f"{VERSION}/{v1}")
    assert_matches_spec(r, "GET", SPEC_VERSION_N)
    assert r.json() == current(alice)

    # Only auth_data changes, and the keys' etag does not move with it.
    etag = current(alice)["etag"]
    r = alice.put(f"{VERSION}/{v1}", json={"algorithm": ALGORITHM, "auth_data": auth_data("new")})
    assert r.status_code == 200 and r.json() == {}, r.text
    assert_matches_spec(r, "PUT", SPEC_VERSION_N)
    assert current(alice)["auth_data"] == auth_data("new")
    assert current(alice)["etag"] == etag

    # A new version becomes current; the old one stays readable.
    v2 = create(alice)
    assert v2 == "2" and current(alice)["version"] == "2"
    assert alice.get(f"{VERSION}/{v1}").json()["version"] == "1"

    # Deleting the current version leaves the highest live one current; deleting it again
    # succeeds (spec); a number never handed out is 404.
    r = alice.delete(f"{VERSION}/{v2}")
    assert r.status_code == 200 and r.json() == {}
    assert_matches_spec(r, "DELETE", SPEC_VERSION_N)
    assert current(alice)["version"] == "1"
    assert alice.delete(f"{VERSION}/{v2}").status_code == 200
    error(alice.get(f"{VERSION}/{v2}"), 404, "M_NOT_FOUND")
    error(alice.delete(f"{VERSION}/9"), 404, "M_NOT_FOUND")
    for bogus in ("0", "abc", "01", "-1", "99999999999999999999"):
        error(alice.get(f"{VERSION}/{bogus}"), 404, "M_NOT_FOUND")

    # A deleted version's number is never handed out again.
    assert create(alice) == "3"
    assert alice.delete(f"{VERSION}/1").status_code == 200
    assert alice.delete(f"{VERSION}/3").status_code == 200
    error(alice.get(VERSION), 404, "M_NOT_FOUND")


def test_version_refusals(server, user):
    alice = user("alice")
    v = create(alice)
    path = f"{VERSION}/{v}"
    cases = [
        (alice.post(VERSION, json={"auth_data": {}}), 400, "M_MISSING_PARAM"),
        (alice.post(VERSION, json={"algorithm": ALGORITHM}), 400, "M_MISSING_PARAM"),
        (alice.post(VERSION, json={"algorithm": ALGORITHM, "auth_data": "x"}), 400, "M_BAD_JSON"),
        (alice.post(VERSION, json={"algorithm": 5, "auth_data": {}}), 400, "M_BAD_JSON"),
        (alice.post(VERSION, data=b"[]"), 400, "M_NOT_JSON"),
        # The algorithm of a version never changes, and a body's version must be the path's.
        (
            alice.put(path, json={"algorithm": "other.algo", "auth_data": {}}),
            400,
            "M_INVALID_PARAM",
        ),
        (
            alice.put(path, json={"algorithm": ALGORITHM, "auth_data": {}, "version": "7"}),
            400,
            "M_INVALID_PARAM",
        ),
        (
            alice.put(f"{VERSION}/8", json={"algorithm": ALGORITHM, "auth_data": {}}),
            404,
            "M_NOT_FOUND",
        ),
        (
            alice.post(VERSION, json={"algorithm": ALGORITHM, "auth_data": {"x": "y" * 70_000}}),
            413,
            "M_TOO_LARGE",
        ),
    ]
    for r, status, errcode in cases:
        error(r, status, errcode)
    # None of these changed anything.
    assert current(alice)["version"] == v and current(alice)["auth_data"] == auth_data()
    # The version in the body may be given when it is the path's.
    r = alice.put(path, json={"algorithm": ALGORITHM, "auth_data": {"a": 1}, "version": v})
    assert r.status_code == 200, r.text
    assert current(alice)["auth_data"] == {"a": 1}


def test_backups_are_per_user_and_need_a_token(server, user):
    alice, bob = user("alice"), user("bob")
    v = create(alice)
    assert put_session(alice, v, ROOM_A, "s1", key()).status_code == 200
    error(bob.get(VERSION), 404, "M_NOT_FOUND")
    error(bob.get(f"{VERSION}/{v}"), 404, "M_NOT_FOUND")
    error(bob.get(KEYS, params={"version": v}), 404, "M_NOT_FOUND")
    error(put_session(bob, v, ROOM_A, "s1", key()), 404, "M_NOT_FOUND")
    error(bob.delete(f"{VERSION}/{v}"), 404, "M_NOT_FOUND")
    assert current(alice)["count"] == 1
    error(alice.get(VERSION, auth=False), 401, "M_MISSING_TOKEN")
    error(
        alice.put(KEYS, params={"version": v}, json={"rooms": {}}, auth=False),
        401,
        "M_MISSING_TOKEN",
    )


# --- replacing a stored key ----------------------------------------------------------------

# (stored, uploaded, which is kept). The spec's order: is_verified true wins; then the lower
# first_message_index; then the lower forwarded_count; a tie keeps the stored key.
REPLACEMENTS = [
    ("verified beats a lower index", key(5, 3, False), key(9, 9, True), "uploaded"),
    ("verified is kept over a lower index", key(9, 9, True), key(0, 0, False), "stored"),
    ("lower index wins, forwarded aside", key(5, 0, False), key(2, 7, False), "uploaded"),
    ("higher index loses, forwarded aside", key(2, 7, False), key(5, 0, False), "stored"),
    ("both verified: lower index wins", key(5, 0, True), key(1, 4, True), "uploaded"),
    ("same index: lower forwarded wins", key(3, 4, True), key(3, 1, True), "uploaded"),
    ("same index: higher forwarded loses", key(3, 1, False), key(3, 4, False), "stored"),
    ("a tie keeps the stored key", key(3, 1, False), key(3, 1, False), "stored"),
]


@pytest.mark.parametrize(
    "stored, uploaded, kept",
    [case[1:] for case in REPLACEMENTS],
    ids=[case[0] for case in REPLACEMENTS],
)
def test_replacing_a_stored_key(server, user, stored, uploaded, kept):
    alice = user("alice")
    v = create(alice)
    stored = {**stored, "session_data": {"ciphertext": "stored"}}
    uploaded = {**uploaded, "session_data": {"ciphertext": "uploaded"}}
    first = put_session(alice, v, ROOM_A, "sess", stored)
    assert first.status_code == 200, first.text
    assert_matches_spec(first, "PUT", SPEC_SESSION)

    second = put_session(alice, v, ROOM_A, "sess", uploaded)
    assert second.status_code == 200, second.text
    assert second.json()["count"] == 1
    # The etag moves exactly when the stored key changed.
    assert (second.json()["etag"] != first.json()["etag"]) == (kept == "uploaded")

    r = alice.get(f"{KEYS}/{ROOM_A}/sess", params={"version": v})
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "GET", SPEC_SESSION)
    assert r.json() == (uploaded if kept == "uploaded" else stored)
    assert current(alice)["etag"] == second.json()["etag"]


def test_the_rule_applies_within_a_bulk_upload(server, user):
    alice = user("alice")
    v = create(alice)
    put = {"rooms": {ROOM_A: {"sessions": {"s1": key(5, mark="old1"), "s2": key(1, mark="old2")}}}}
    assert alice.put(KEYS, params={"version": v}, json=put).status_code == 200
    better_s1_worse_s2_new_s3 = {
        "rooms": {
            ROOM_A: {"sessions": {"s1": key(0, mark="new1"), "s2": key(4, mark="new2")}},
            ROOM_B: {"sessions": {"s3": key(0, mark="new3")}},
        }
    }
    r = alice.put(KEYS, params={"version": v}, json=better_s1_worse_s2_new_s3)
    assert r.status_code == 200 and r.json()["count"] == 3, r.text
    assert_matches_spec(r, "PUT", SPEC_KEYS)
    rooms = get_all(alice, v)["rooms"]
    marks = {
        s: data["session_data"]["ciphertext"]
        for room in rooms.values()
        for s, data in room["sessions"].items()
    }
    assert marks == {"s1": "new1", "s2": "old2", "s3": "new3"}


# --- the current version only --------------------------------------------------------------


def test_writing_to_a_version_that_is_not_current(server, user):
    alice = user("alice")
    v1, v2 = create(alice), create(alice)
    writes = [
        lambda v: alice.put(
            KEYS, params={"version": v}, json={"rooms": {ROOM_A: {"sessions": {"s": key()}}}}
        ),
        lambda v: alice.put(
            f"{KEYS}/{ROOM_A}", params={"version": v}, json={"sessions": {"s": key()}}
        ),
        lambda v: put_session(alice, v, ROOM_A, "s", key()),
    ]
    for write in writes:
        body = error(write(v1), 403, "M_WRONG_ROOM_KEYS_VERSION")
        assert body["current_version"] == v2
        assert write(v2).status_code == 200
        error(write("77"), 404, "M_NOT_FOUND")
        error(write(""), 400, "M_MISSING_PARAM")
    assert current(alice)["count"] == 1
    assert get_all(alice, v1) == {"rooms": {}}

    # v2 deleted: v1 is current again, and v2 (gone) is now the wrong version.
    assert alice.delete(f"{VERSION}/{v2}").status_code == 200
    assert writes[2](v1).status_code == 200
    assert error(writes[2](v2), 403, "M_WRONG_ROOM_KEYS_VERSION")["current_version"] == v1
    # With no version left there is no backup to write to.
    assert alice.delete(f"{VERSION}/{v1}").status_code == 200
    error(writes[2](v1), 404, "M_NOT_FOUND")
    error(alice.put(KEYS, json={"rooms": {}}), 400, "M_MISSING_PARAM")


# --- keys at each level --------------------------------------------------------------------


def test_keys_at_each_level(server, user):
    alice = user("alice")
    v = create(alice)
    body = {
        "rooms": {
            ROOM_A: {"sessions": {"a1": key(mark="a1"), "a2": key(mark="a2")}},
            ROOM_B: {"sessions": {"b1": key(mark="b1")}},
        }
    }
    r = alice.put(KEYS, params={"version": v}, json=body)
    assert r.status_code == 200 and r.json()["count"] == 3, r.text
    assert get_all(alice, v) == body

    r = alice.put(
        f"{KEYS}/{ROOM_B}", params={"version": v}, json={"sessions": {"b2": key(mark="b2")}}
    )
    assert r.status_code == 200 and r.json()["count"] == 4, r.text
    assert_matches_spec(r, "PUT", SPEC_ROOM)
    r = alice.get(f"{KEYS}/{ROOM_B}", params={"version": v})
    assert_matches_spec(r, "GET", SPEC_ROOM)
    assert r.json() == {"sessions": {"b1": key(mark="b1"), "b2": key(mark="b2")}}

    # A room with no keys is an empty room; a session with none is 404; so is an unknown
    # version at every level.
    assert alice.get(f"{KEYS}/!none:example.org", params={"version": v}).json() == {"sessions": {}}
    error(alice.get(f"{KEYS}/{ROOM_A}/nope", params={"version": v}), 404, "M_NOT_FOUND")
    for path in (KEYS, f"{KEYS}/{ROOM_A}", f"{KEYS}/{ROOM_A}/a1"):
        error(alice.get(path, params={"version": "5"}), 404, "M_NOT_FOUND")
        error(alice.delete(path, params={"version": "5"}), 404, "M_NOT_FOUND")
        error(alice.get(path), 400, "M_MISSING_PARAM")

    # A key in an older version stays readable after a new version is made.
    create(alice)
    assert alice.get(f"{KEYS}/{ROOM_A}/a1", params={"version": v}).json() == key(mark="a1")


def test_deleting_keys_at_each_level_and_the_version(server, user):
    alice = user("alice")
    v = create(alice)
    body = {
        "rooms": {
            ROOM_A: {"sessions": {"a1": key(), "a2": key()}},
            ROOM_B: {"sessions": {"b1": key(), "b2": key(), "b3": key()}},
        }
    }
    etag = alice.put(KEYS, params={"version": v}, json=body).json()["etag"]

    r = alice.delete(f"{KEYS}/{ROOM_A}/a1", params={"version": v})
    assert_matches_spec(r, "DELETE", SPEC_SESSION)
    assert r.json()["count"] == 4 and r.json()["etag"] != etag
    etag = r.json()["etag"]
    # Deleting what is not there changes nothing.
    r = alice.delete(f"{KEYS}/{ROOM_A}/a1", params={"version": v})
    assert r.json() == {"count": 4, "etag": etag}

    r = alice.delete(f"{KEYS}/{ROOM_B}", params={"version": v})
    assert_matches_spec(r, "DELETE", SPEC_ROOM)
    assert r.json()["count"] == 1
    assert get_all(alice, v) == {"rooms": {ROOM_A: {"sessions": {"a2": key()}}}}

    r = alice.delete(KEYS, params={"version": v})
    assert_matches_spec(r, "DELETE", SPEC_KEYS)
    assert r.json()["count"] == 0
    assert get_all(alice, v) == {"rooms": {}} and current(alice)["count"] == 0

    # Deleting a version takes its keys with it, in the database too.
    assert alice.put(KEYS, params={"version": v}, json=body).json()["count"] == 5
    v2 = create(alice)
    assert put_session(alice, v2, ROOM_A, "x", key()).status_code == 200
    assert stored_key_rows(server, alice.user_id) == 6
    assert alice.delete(f"{VERSION}/{v}").status_code == 200
    assert stored_key_rows(server, alice.user_id) == 1
    error(alice.get(KEYS, params={"version": v}), 404, "M_NOT_FOUND")
    assert current(alice)["count"] == 1


# --- bad input and bounds ------------------------------------------------------------------


def test_bad_keys_are_refused_and_nothing_is_stored(server, user):
    alice = user("alice")
    v = create(alice)
    bad_keys = [
        ({**key(), "is_verified": "true"}, "M_BAD_JSON"),
        ({**key(), "is_verified": 1}, "M_BAD_JSON"),
        ({**key(), "first_message_index": -1}, "M_BAD_JSON"),
        ({**key(), "first_message_index": 1.5}, "M_BAD_JSON"),
        ({**key(), "forwarded_count": True}, "M_BAD_JSON"),
        ({**key(), "forwarded_count": 2**60}, "M_BAD_JSON"),
        ({**key(), "session_data": "c2Vzc2lvbg"}, "M_BAD_JSON"),
        ({k: val for k, val in key().items() if k != "forwarded_count"}, "M_MISSING_PARAM"),
    ]
    for bad, errcode in bad_keys:
        error(put_session(alice, v, ROOM_A, "s", bad), 400, errcode)
        good_and_bad = {"rooms": {ROOM_A: {"sessions": {"good": key(), "bad": bad}}}}
        error(alice.put(KEYS, params={"version": v}, json=good_and_bad), 400, errcode)
    bad_bodies = [
        ({}, "M_MISSING_PARAM"),
        ({"rooms": []}, "M_BAD_JSON"),
        ({"rooms": {"not-a-room": {"sessions": {}}}}, "M_INVALID_PARAM"),
        ({"rooms": {ROOM_A: {}}}, "M_MISSING_PARAM"),
        ({"rooms": {ROOM_A: {"sessions": {"": key()}}}}, "M_INVALID_PARAM"),
        ({"rooms": {ROOM_A: {"sessions": {"s" * 256: key()}}}}, "M_INVALID_PARAM"),
    ]
    for bad, errcode in bad_bodies:
        error(alice.put(KEYS, params={"version": v}, json=bad), 400, errcode)
    error(put_session(alice, v, "not-a-room", "s", key()), 400, "M_INVALID_PARAM")
    assert current(alice)["count"] == 0


def test_request_size_bounds(server, user):
    alice = user("alice")
    v = create(alice)
    too_many = {"rooms": {ROOM_A: {"sessions": {f"s{i}": key() for i in range(1001)}}}}
    error(alice.put(KEYS, params={"version": v}, json=too_many), 413, "M_TOO_LARGE")
    huge = {"rooms": {ROOM_A: {"sessions": {"s": key(mark="x" * (2 * 1024 * 1024))}}}}
    error(alice.put(KEYS, params={"version": v}, json=huge), 413, "M_TOO_LARGE")
    big = key(mark="x" * (64 * 1024))
    error(put_session(alice, v, ROOM_A, "s", big), 413, "M_TOO_LARGE")
    assert current(alice)["count"] == 0
    just_enough = {"rooms": {ROOM_A: {"sessions": {f"s{i}": key() for i in range(1000)}}}}
    r = alice.put(KEYS, params={"version": v}, json=just_enough)
    assert r.status_code == 200 and r.json()["count"] == 1000, r.text


def test_a_large_backup_is_read_back_whole(server, user):
    """More keys than one page of the store, over several rooms: the streamed answer is one
    JSON object holding every key once."""
    alice = user("alice")
    v = create(alice)
    sent: dict[str, dict] = {}
    for batch in range(3):
        rooms = {
            f"!room{r}:example.org": {
                "sessions": {f"b{batch}s{i}": key(i, mark=f"{batch}.{r}.{i}") for i in range(250)}
            }
            for r in range(batch, batch + 3)
        }
        r = alice.put(KEYS, params={"version": v}, json={"rooms": rooms})
        assert r.status_code == 200, r.text
        for room_id, room in rooms.items():
            sent.setdefault(room_id, {"sessions": {}})["sessions"].update(room["sessions"])
    assert current(alice)["count"] == 2250
    r = alice.get(KEYS, params={"version": v})
    assert r.headers["Content-Type"] == "application/json"
    assert json.loads(r.content) == {"rooms": sent}
    assert_matches_spec(r, "GET", SPEC_KEYS)
    room = alice.get(f"{KEYS}/!room2:example.org", params={"version": v}).json()
    assert room == sent["!room2:example.org"] and len(room["sessions"]) == 750
