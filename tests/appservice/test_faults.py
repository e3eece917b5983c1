"""Application services under faults, with fake appservices (tests/peers/appservice.py):
one that stops answering holds one connection at most, delays neither clients nor another
appservice, and gets every message sent meanwhile, in order, under the same txnId, once it
is back, across a restart of Weir; a bad registration file stops Weir with exit 2."""

import time
from urllib.parse import quote

import pytest

from tests.appservice.conftest import (
    SERVER_NAME,
    V3,
    as_client,
    create_room,
    registration_yaml,
    send,
    user,
)
from tests.peers.appservice import FakeAppservice
from tests.support.server import MatrixClient, run_app, write_config
from tests.support.spec import assert_matches_spec

PING = "/_matrix/client/v1/appservice/{appserviceId}/ping"

DEADLINE = 2.0  # appservice.deadline for these tests: a hung call ends within it
# The hung bridge's test waits out several deadlines: a shorter one, but not below the
# second within which clients must be answered, so that a send that waited on it fails.
HUNG_DEADLINE = 1.0


def bodies(transactions) -> list[str]:
    return [
        e["content"]["body"]
        for t in transactions
        for e in t.body["events"]
        if e["type"] == "m.room.message"
    ]


def puppet_in(weir, as_id: str, localpart: str, room_id: str):
    """Registers a puppet through the appservice's token, and joins it to the room."""
    bot = as_client(weir, as_id)
    r = bot.post(
        f"{V3}/register",
        json={"type": "m.login.application_service", "username": localpart, "inhibit_login": True},
    )
    assert r.status_code == 200, r.text
    assert "access_token" not in r.json()  # inhibit_login
    user_id = f"@{localpart}:{SERVER_NAME}"
    r = bot.post(f"{V3}/join/{quote(room_id)}", params={"user_id": user_id}, json={})
    assert r.status_code == 200, r.text
    return user_id


def unanswered(fake: FakeAppservice) -> list:
    return [t for t in fake.transactions(answered=False) if all(t is not a for a in fake.answered)]


def timed(call):
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def test_a_hung_appservice_holds_one_connection_delays_nobody_and_catches_up_in_order(
    start_with_appservices, database_url
):
    with FakeAppservice() as bridge, FakeAppservice() as other:
        registrations = {
            "bridge": registration_yaml("bridge", bridge.url),
            # Another appservice watching every room by its ID.
            "other": registration_yaml(
                "other", other.url, users="@other_.*:weir\\.test", aliases="#other_.*", rooms=".*"
            ),
        }
        weir = start_with_appservices(registrations, database_url, deadline=HUNG_DEADLINE)
        alice = user(weir, "alice")
        room = create_room(alice, preset="public_chat")
        puppet_in(weir, "bridge", "bridge_bob", room)
        send(alice, room, "m0")
        assert bridge.wait_for(lambda: "m0" in bodies(bridge.transactions()))

        bridge.hanging = True
        for text in ("m1", "m2", "m3"):
            _, seconds = timed(lambda: send(alice, room, text))
            assert seconds < 1.0, f"a send waited {seconds:.2f} s on the hung appservice"
        # The other appservice is served meanwhile.
        assert other.wait_for(lambda: bodies(other.transactions())[-3:] == ["m1", "m2", "m3"])
        # The bridge is sent the same transaction again after each deadline, on one
        # connection at a time, while clients are answered at once.
        assert bridge.wait_for(lambda: len(unanswered(bridge)) >= 2, 30)
        r, seconds = timed(lambda: alice.get(f"{V3}/account/whoami"))
        assert r.status_code == 200 and seconds < 1.0
        hung = unanswered(bridge)
        assert len({t.path for t in hung}) == 1, [t.path for t in hung]
        assert bodies(hung[:1])[0] == "m1"  # the one it was sent when it stopped answering
        assert bridge.max_current == 1

        # Weir restarts while the bridge still hangs; a message is sent meanwhile.
        weir.stop()
        weir = start_with_appservices(registrations, database_url, deadline=HUNG_DEADLINE)
        alice = MatrixClient(weir.client_url, token=alice.token)  # a new port
        send(alice, room, "m4")
        assert bridge.wait_for(lambda: len(unanswered(bridge)) > len(hung) + 1, 30)
        assert unanswered(bridge)[-1].path == hung[0].path  # the same txnId

        # It comes back and calls us, as a bridge does on start: its backoff ends.
        bridge.hanging = False
        assert bridge.wait_for(lambda: bridge.current == 0, 2 * HUNG_DEADLINE + 5)
        r = as_client(weir, "bridge").get(f"{V3}/account/whoami")
        assert r.status_code == 200 and r.json()["user_id"] == f"@bridgebot:{SERVER_NAME}"
        assert bridge.wait_for(lambda: "m4" in bodies(bridge.transactions()), 15)
        answered = bridge.transactions()
        assert bodies(answered) == ["m0", "m1", "m2", "m3", "m4"]
        assert hung[0].path in [t.path for t in answered]
        assert all(t.headers["authorization"] == "Bearer hs-bridge" for t in answered)
        assert bridge.max_current == 1


def test_ping_reports_what_the_appservice_did(start_with_appservices, tmp_path):
    with FakeAppservice() as fake:
        registrations = {
            "bridge": registration_yaml("bridge", fake.url),
            "nourl": registration_yaml("nourl", None, users="@nourl_.*", aliases="#nourl_.*"),
        }
        weir = start_with_appservices(registrations, deadline=DEADLINE)
        bot = as_client(weir, "bridge")
        path = "/_matrix/client/v1/appservice/bridge/ping"
        r = bot.post(path, json={"transaction_id": "t1"})
        assert r.status_code == 200 and isinstance(r.json()["duration_ms"], int), r.text
        assert_matches_spec(r, "POST", PING)
        assert fake.received[-1].body == {"transaction_id": "t1"}
        assert fake.received[-1].headers["authorization"] == "Bearer hs-bridge"

        fake.hanging = True
        r, seconds = timed(lambda: bot.post(path, json={}))
        assert r.status_code == 504 and r.json()["errcode"] == "M_CONNECTION_TIMEOUT", r.text
        assert_matches_spec(r, "POST", PING)
        assert seconds < DEADLINE + 1
        fake.stop()
        r = bot.post(path, json={})
        assert r.status_code == 502 and r.json()["errcode"] == "M_CONNECTION_FAILED", r.text

        # Another appservice's ID, a user's token, an appservice without a URL.
        assert as_client(weir, "nourl").post(path, json={}).status_code == 403
        alice = user(weir, "alice")
        r = alice.post(path, json={})
        assert r.status_code == 403 and r.json()["errcode"] == "M_FORBIDDEN"
        r = as_client(weir, "nourl").post("/_matrix/client/v1/appservice/nourl/ping", json={})
        assert r.status_code == 400 and r.json()["errcode"] == "M_URL_NOT_SET", r.text


def test_namespaces_and_masquerading(start_with_appservices):
    wide = registration_yaml("wide", None, users="@.*:weir\\.test", aliases="#.*", exclusive=False)
    weir = start_with_appservices({"bridge": registration_yaml("bridge", None), "wide": wide})
    bot = as_client(weir, "bridge")
    # A non-exclusive namespace does not reach into another appservice's exclusive one.
    other = as_client(weir, "wide")
    r = other.post(
        f"{V3}/register", json={"type": "m.login.application_service", "username": "bridge_x"}
    )
    assert r.status_code == 400 and r.json()["errcode"] == "M_EXCLUSIVE", r.text
    r = other.post(
        f"{V3}/register", json={"type": "m.login.application_service", "username": "wide_x"}
    )
    assert r.status_code == 200, r.text
    # Outside its namespace: refused, whoever asks.
    r = bot.post(
        f"{V3}/register", json={"type": "m.login.application_service", "username": "carol"}
    )
    assert r.status_code == 400 and r.json()["errcode"] == "M_EXCLUSIVE", r.text
    r = bot.post(
        f"{V3}/register",
        json={"auth": {"type": "m.login.application_service"}, "username": "bridge_carol"},
    )
    assert r.status_code == 200 and r.json()["user_id"] == f"@bridge_carol:{SERVER_NAME}"
    carol_token = r.json()["access_token"]
    r = bot.get(f"{V3}/account/whoami", params={"user_id": f"@bridge_carol:{SERVER_NAME}"})
    assert r.json()["user_id"] == f"@bridge_carol:{SERVER_NAME}", r.text
    # MSC3202: the device the appservice names, one of the user's.
    device = as_client(weir, "bridge").get(
        f"{V3}/account/whoami", headers={"Authorization": f"Bearer {carol_token}"}
    )
    device_id = device.json()["device_id"]
    r = bot.get(
        f"{V3}/account/whoami",
        params={
            "user_id": f"@bridge_carol:{SERVER_NAME}",
            "org.matrix.msc3202.device_id": device_id,
        },
    )
    assert r.json()["device_id"] == device_id, r.text
    r = bot.get(
        f"{V3}/account/whoami",
        params={"user_id": f"@bridge_carol:{SERVER_NAME}", "org.matrix.msc3202.device_id": "NOPE"},
    )
    assert r.status_code == 403, r.text
    # A name in its namespace nobody registered: 403, as the spec's identity assertion.
    r = bot.get(f"{V3}/account/whoami", params={"user_id": f"@bridge_nobody:{SERVER_NAME}"})
    assert r.status_code == 403 and r.json()["errcode"] == "M_FORBIDDEN", r.text
    # Login through the token; a password login has no password to match.
    r = bot.post(
        f"{V3}/login",
        json={
            "type": "m.login.application_service",
            "identifier": {"type": "m.id.user", "user": "bridge_carol"},
        },
    )
    assert r.status_code == 200 and r.json()["user_id"] == f"@bridge_carol:{SERVER_NAME}"
    r = bot.post(
        f"{V3}/login",
        auth=False,
        json={
            "type": "m.login.application_service",
            "identifier": {"type": "m.id.user", "user": "bridge_carol"},
        },
    )
    assert r.status_code == 401, r.text
    # Its own alias namespace is its to use.
    r = bot.post(f"{V3}/createRoom", json={"room_alias_name": "bridge_portal"})
    assert r.status_code == 200, r.text
    # Everyone else: the namespace is exclusive.
    r = bot.get(f"{V3}/register/available", auth=False, params={"username": "bridge_dave"})
    assert r.status_code == 400 and r.json()["errcode"] == "M_EXCLUSIVE", r.text
    # Third-party lookups: no protocol is offered.
    assert bot.get(f"{V3}/thirdparty/protocols").json() == {}
    assert bot.get(f"{V3}/thirdparty/protocol/irc").status_code == 404
    assert bot.get(f"{V3}/thirdparty/location", params={"alias": "#a:b"}).json() == []


@pytest.mark.parametrize(
    "text, reason",
    [
        ("id: x\nurl: null\n", "as_token: Missing data for required field."),
        (
            registration_yaml("x", None).replace("@bridge_.*", "@bridge_(("),
            "namespaces.users.0.regex: Not a valid regular expression",
        ),
        ("id: [unclosed\n", "not valid YAML"),
    ],
)
def test_a_bad_registration_file_exits_2_with_one_line(tmp_path, text, reason):
    (tmp_path / "bridge.yaml").write_text(text)
    write_config(
        str(tmp_path / "config.toml"), {"app_service_config_files": [str(tmp_path / "bridge.yaml")]}
    )
    result = run_app(["--config", str(tmp_path / "config.toml")], cwd=str(tmp_path))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"config: app_service_config_files: {tmp_path}/bridge.yaml: ")
    assert reason in lines[0]
