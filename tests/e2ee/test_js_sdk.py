"""matrix-js-sdk with its Rust crypto (tests/e2ee/js, installed by `make test`) against the real
server, on both engines: two users share an encrypted room and a second device added later
decrypts; cross-signing and a key backup set up as Element does, restored on a new device;
presence set by one client and seen by another."""

import base64
import hashlib
import hmac
import itertools
import json
import os
import shutil
import subprocess

import pytest
import requests

from tests.appservice.conftest import registration_yaml
from tests.e2ee.conftest import PASSWORD, V3, count_rows
from tests.peers.appservice import FakeAppservice
from tests.peers.push_gateway import PushGateway
from tests.peers.web import WebSite
from tests.support.admin import register_admin
from tests.support.metrics import metric
from tests.support.server import MatrixClient

JS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js")
_names = itertools.count()


@pytest.fixture(scope="module")
def node():
    """The node binary, with the harness's packages installed (`make test` runs `npm ci`);
    a skip without them, except under CI, where they must be there."""
    binary = shutil.which("node")
    missing = None
    if binary is None:
        missing = "node not found"
    elif not os.path.exists(os.path.join(JS, "node_modules", ".installed")):
        missing = "tests/e2ee/js/node_modules missing: run `make test` (it runs npm ci)"
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{missing}, and CI requires the matrix-js-sdk tests")
        pytest.skip(missing)
    return binary


def run_node(
    node: str, script: str, *args: str, tmp_path, timeout: float = 240, env: dict | None = None
) -> dict:
    """Runs a harness script; its last stdout line is its JSON result. The SDK's logs go to
    a file, shown when the script fails. `env` adds to the environment (for example
    NODE_EXTRA_CA_CERTS, to trust a test CA)."""
    log = tmp_path / f"{script}.log"
    with open(log, "wb") as stderr:
        proc = subprocess.run(
            [node, os.path.join(JS, script), *args],
            cwd=JS,
            stdout=subprocess.PIPE,
            stderr=stderr,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
    lines = proc.stdout.decode().strip().splitlines()
    result = json.loads(lines[-1]) if lines else {}
    tail = log.read_text(errors="replace")[-6000:]
    assert proc.returncode == 0 and "error" not in result, f"{result}\n--- node stderr ---\n{tail}"
    return result


def registered(server, prefix: str) -> dict:
    """A fresh account (the module's server is shared); the harness logs in its devices."""
    name = f"{prefix}{next(_names)}"
    MatrixClient(server.client_url).register(name, PASSWORD)
    return {"user": name, "password": PASSWORD}


def test_two_users_and_a_later_device_decrypt_each_other(server, node, tmp_path):
    messages = {
        "from_alice": "hello bob, from alice",
        "from_bob": "hello alice, from bob",
        "after_second_device": "bob's new device reads this",
        "from_bob2": "and writes this",
    }
    scenario = {
        "alice": registered(server, "alice"),
        "bob": registered(server, "bob"),
        "messages": messages,
    }
    result = run_node(
        node, "two_users.mjs", server.client_url, json.dumps(scenario), tmp_path=tmp_path
    )

    devices, sent, received = result["devices"], result["sent"], result["received"]
    assert result["encrypted_room"] == {"alice": True, "bob": True}
    assert received[devices["bob"]][sent["fromAlice"]] == messages["from_alice"]
    assert received[devices["alice"]][sent["fromBob"]] == messages["from_bob"]
    assert received[devices["bob2"]][sent["afterSecond"]] == messages["after_second_device"]
    assert received[devices["bob"]][sent["afterSecond"]] == messages["after_second_device"]
    # Megolm shares the session from its current index: history stays sealed to the new device.
    assert result["bob2_history"] == "HISTORICAL_MESSAGE_NO_KEY_BACKUP"
    assert received[devices["alice"]][sent["fromBob2"]] == messages["from_bob2"]
    assert received[devices["bob"]][sent["fromBob2"]] == messages["from_bob2"]

    # What the server holds is ciphertext only: every message is an m.room.encrypted event
    # and no plaintext appears in it.
    bob = MatrixClient(server.client_url)
    bob.login(scenario["bob"]["user"], PASSWORD)
    r = bob.get(f"{V3}/rooms/{result['room_id']}/messages", params={"dir": "b", "limit": 50})
    assert r.status_code == 200, r.text
    by_id = {event["event_id"]: event for event in r.json()["chunk"]}
    for event_id in sent.values():
        event = by_id[event_id]
        assert event["type"] == "m.room.encrypted"
        assert event["content"]["algorithm"] == "m.megolm.v1.aes-sha2"
    assert not any(text in r.text for text in messages.values())


def test_cross_signing_and_key_backup_restore_history_on_a_new_device(server, node, tmp_path):
    alice = registered(server, "alice")
    scenario = {"alice": alice, "bob": registered(server, "bob"), "messages": {"history": "old"}}
    result = run_node(
        node, "backup.mjs", server.client_url, json.dumps(scenario), tmp_path=tmp_path
    )

    assert result["cross_signing_ready"] is True
    assert result["backup"]["trusted"] is True  # signed by alice's device and master key
    assert result["backup"]["active"] == result["backup"]["version"]
    assert result["bob_sees"] == {"cross_signing_keys": True, "signed_by_owner": True}
    assert result["backed_up_sessions"] == 1
    # History is sealed until the new device holds the backup key.
    assert result["before_restore"] == "HISTORICAL_MESSAGE_BACKUP_UNCONFIGURED"
    assert result["restored"] == {"total": 1, "imported": 1}
    assert result["history"] == "old"

    # The server holds the backup as the spec shapes it, and only ciphertext.
    client = MatrixClient(server.client_url)
    client.login(alice["user"], PASSWORD)
    r = client.get(f"{V3}/room_keys/keys", params={"version": result["backup"]["version"]})
    assert r.status_code == 200, r.text
    (session,) = r.json()["rooms"][result["room_id"]]["sessions"].values()
    assert set(session) == {"first_message_index", "forwarded_count", "is_verified", "session_data"}
    assert set(session["session_data"]) == {"ciphertext", "ephemeral", "mac"}


@pytest.mark.parametrize("server", ["sqlite"], indirect=True)  # both: tests/sync/test_presence.py
def test_presence_through_matrix_js_sdk(server, node, tmp_path):
    """alice's client sets a presence; bob's client sees it in its sync and by asking."""
    scenario = {
        "alice": registered(server, "alice"),
        "bob": registered(server, "bob"),
        "status": "back in five",
    }
    result = run_node(
        node, "presence.mjs", server.client_url, json.dumps(scenario), tmp_path=tmp_path
    )
    expected = {"presence": "unavailable", "status_msg": "back in five"}
    assert result["synced"] == expected and result["fetched"] == expected


@pytest.mark.parametrize("server", ["sqlite"], indirect=True)  # both: tests/rooms, tests/sync
def test_everyday_screens_through_matrix_js_sdk(server, node, tmp_path):
    """Element's member list, report dialog, favourites and moderation, through the SDK:
    joined_members, reportEvent, setRoomTag (seen back through sync), ban, unban and forget
    (the room gone from the client and from a new device's syncs, left rooms included)."""
    alice, bob = registered(server, "alice"), registered(server, "bob")
    scenario = {"alice": alice, "bob": bob, "tag": "m.favourite", "reason": "spam"}
    result = run_node(
        node, "everyday.mjs", server.client_url, json.dumps(scenario), tmp_path=tmp_path
    )
    joined = sorted(f"@{who['user']}:weir.test" for who in (alice, bob))
    assert result["joined"] == joined
    assert result["report"] == {}
    assert (
        count_rows(
            server,
            "SELECT COUNT(*) FROM reports WHERE reporter = ? AND event_id = ? AND score = -100"
            " AND reason = 'spam'",
            (f"@{bob['user']}:weir.test", result["eventId"]),
        )
        == 1
    )
    assert result["tags"] == {"m.favourite": {"order": 0.5}}
    assert result["tagAccountData"] == {"tags": {"m.favourite": {"order": 0.5}}}
    assert result["leftBeforeForget"] is True
    assert result["forgottenHere"] is True
    assert result["leftAfterForget"] is False


@pytest.mark.parametrize(
    "server", ["sqlite"], indirect=True
)  # both: tests/rooms/test_relations_api.py
def test_edits_reactions_and_threads_through_matrix_js_sdk(server, node, tmp_path):
    """alice edits a message, bob reacts and both reply in a thread; bob's client, started
    afterwards, shows the edit (from /event's bundled edit alone too), the reaction through
    /relations, and the thread from /threads with its replies."""
    scenario = {"alice": registered(server, "alice"), "bob": registered(server, "bob")}
    result = run_node(
        node, "relations.mjs", server.client_url, json.dumps(scenario), tmp_path=tmp_path
    )
    assert result["edited"] == {"timeline": "hello world", "fetched": "hello world"}
    assert result["replaced_by"]
    assert result["reactions"] == {"timeline": ["👍"], "served": ["👍"]}
    root, last = result["ids"]["root"], result["ids"]["last"]
    assert result["threads"] == [root]
    assert result["thread_list"] == [root] and result["my_threads"] == [root]
    thread = result["thread"]
    assert thread["length"] == 2 and thread["latest"] == last
    assert thread["latest_body"] == "alice replies last" and thread["participated"] is True
    assert thread["replies"][-2:] == ["bob replies in the thread", "alice replies last"]


@pytest.mark.parametrize(
    "server", ["sqlite"], indirect=True
)  # both: tests/rooms/test_context_api.py
def test_permalink_opens_through_matrix_js_sdk(server, node, tmp_path):
    """alice's client opens the 5th of 30 messages, older than its first sync, through
    getEventTimeline (/context): its timeline holds the event with its neighbours; and
    timestampToEvent forward from the 5th's time finds it (or one sent in the same ms)."""
    scenario = {"alice": registered(server, "alice")}
    result = run_node(
        node, "context.mjs", server.client_url, json.dumps(scenario), tmp_path=tmp_path
    )
    assert result["live_had_it"] is False
    assert result["has_event"] is True
    bodies = result["bodies"]
    assert "m5" in bodies
    index = bodies.index("m5")
    assert bodies[index - 1 : index + 2] == ["m4", "m5", "m6"]
    fifth, jumped = result["fifth"], result["jumped"]
    assert jumped["origin_server_ts"] == fifth["origin_server_ts"]
    assert jumped["event_id"] in result["ids"][:5]


@pytest.mark.parametrize("server", ["sqlite"], indirect=True)  # both: test_search_api.py
def test_search_through_matrix_js_sdk(server, node, tmp_path):
    """bob searches alice's room with searchRoomEvents, as Element does: ten results newest
    first, then the next page with the first message and the events around it."""
    scenario = {"alice": registered(server, "alice"), "bob": registered(server, "bob")}
    result = run_node(
        node, "search.mjs", server.client_url, json.dumps(scenario), tmp_path=tmp_path
    )
    assert result["count"] == 11 and result["highlights"] == ["treasure"]
    assert result["first_page"] == 10 and result["had_next_batch"] and not result["more"]
    assert result["bodies"] == [f"treasure chest {i}" for i in reversed(range(10))] + [
        "the treasure is buried"
    ]
    last = result["last"]
    assert last["event_id"] == result["buried"] and last["sender"] == result["alice"]
    assert last["before"] == ["before the map"] and last["after"] == ["after the map"]


@pytest.mark.parametrize(
    "server", ["sqlite"], indirect=True
)  # both: tests/rooms/test_hierarchy_api.py
def test_a_space_and_its_room_through_matrix_js_sdk(server, node, tmp_path):
    """alice links a room into a space both ways; getRoomHierarchy shows both to her and to
    bob, who is in neither, and a one-room page follows next_batch to the end."""
    scenario = {"alice": registered(server, "alice"), "bob": registered(server, "bob")}
    result = run_node(
        node, "spaces.mjs", server.client_url, json.dumps(scenario), tmp_path=tmp_path
    )
    space, room = result["ids"]["space"], result["ids"]["room"]
    expected = [
        {"room_id": space, "name": "Team", "room_type": "m.space", "children": [room]},
        {"room_id": room, "name": "General", "room_type": None, "children": []},
    ]
    assert result["alice"] == expected
    assert result["bob"] == expected
    assert result["pages"] == [[space], [room]]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # both: test_url_preview.py
def test_link_preview_through_matrix_js_sdk(start_weir, database_url, node, tmp_path):
    """alice's client previews a link she sent with getUrlPreview at the message's time, as
    Element does: the page's og:title, fetched once from a web site on loopback."""
    site_ip = "127.40.62.11"
    page = b'<html><head><meta property="og:title" content="Previewed by js"></head></html>'
    with WebSite(site_ip) as site:
        site.page("/article", page)
        weir = start_weir(
            {
                "database": {"url": database_url},
                "url_preview": {"enabled": True, "ip_range_allowlist": [f"{site_ip}/32"]},
            }
        )
        scenario = {"alice": registered(weir, "alice"), "url": site.url("/article")}
        result = run_node(
            node, "preview.mjs", weir.client_url, json.dumps(scenario), tmp_path=tmp_path
        )
        assert result["og"] == {"og:title": "Previewed by js"}
        assert site.count("/article") == 1


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # both: test_account_settings
def test_account_settings_through_matrix_js_sdk(start_weir, database_url, node, tmp_path):
    """alice changes her password with setPassword (a wrong current one is refused with the
    flows), gets an OpenID token the federation listener vouches for, TURN credentials from
    the server's shared secret, and deactivates her account: her login is then refused."""
    secret = "js-turn-secret"
    voip = {"turn_uris": ["turn:turn.weir.test:3478"], "turn_shared_secret": secret}
    weir = start_weir({"voip": voip, "database": {"url": database_url}})
    scenario = {
        "alice": registered(weir, "alice"),
        "new_password": "a new one",
        "federation_url": weir.federation_url,
    }
    result = run_node(node, "account.mjs", weir.client_url, json.dumps(scenario), tmp_path=tmp_path)
    user_id = result["user_id"]

    assert result["wrong"] == {
        "status": 401,
        "errcode": "M_FORBIDDEN",
        "flows": [{"stages": ["m.login.password"]}],
    }
    assert result["after_change"] == {"old": "403 M_FORBIDDEN", "new": "ok"}

    openid = result["openid"]
    assert openid["matrix_server_name"] == "weir.test" and openid["token_type"] == "Bearer"
    assert result["vouched"] == {"status": 200, "body": {"sub": user_id}}
    info = requests.get(
        weir.fed_url("/_matrix/federation/v1/openid/userinfo"),
        params={"access_token": openid["access_token"]},
        timeout=10,
    )
    # Asked after the deactivation: a deactivated user's token vouches for no one.
    assert (info.status_code, info.json()["errcode"]) == (401, "M_UNKNOWN_TOKEN")

    turn = result["turn"]
    assert turn["uris"] == voip["turn_uris"] and turn["ttl"] == 86400
    assert turn["username"].endswith(":" + user_id)
    mac = hmac.new(secret.encode(), turn["username"].encode(), hashlib.sha1).digest()
    assert turn["password"] == base64.b64encode(mac).decode()

    assert result["deactivated"] == {"id_server_unbind_result": "no-support"}
    assert result["after_deactivation"] == "403 M_USER_DEACTIVATED"


@pytest.mark.parametrize("server", ["sqlite"], indirect=True)  # both: test_user_directory.py
def test_user_directory_through_matrix_js_sdk(server, node, tmp_path):
    """alice finds bob, who shares her room, with searchUserDirectory by part of his display
    name and by his user ID; carol, in no room, has the same word in hers and is not found."""
    names = ("alice", "bob", "carol")
    scenario = {name: registered(server, name) for name in names}
    result = run_node(
        node, "user_directory.mjs", server.client_url, json.dumps(scenario), tmp_path=tmp_path
    )
    bob = {"user_id": result["bob"], "display_name": "Bartholomew Quillfeather"}
    assert result["by_name"] == {"results": [bob], "limited": False}
    assert result["by_id"] == {"results": [bob], "limited": False}


@pytest.mark.parametrize("server", ["sqlite"], indirect=True)  # both: test_room_upgrade.py
@pytest.mark.parametrize("version", ["11", "12"])
def test_a_room_upgrade_through_matrix_js_sdk(server, node, tmp_path, version):
    """alice's upgradeRoom; bob's client sees the tombstone, is refused in the old room,
    joins the replacement it names and finds the old room from there (findPredecessor,
    getRoomUpgradeHistory with its links checked)."""
    scenario = {
        "alice": registered(server, "alice"),
        "bob": registered(server, "bob"),
        "version": version,
    }
    result = run_node(
        node, "upgrade.mjs", server.client_url, json.dumps(scenario), tmp_path=tmp_path
    )
    old, new = result["old_room"], result["new_room"]
    assert result["tombstone"] == {
        "sender": result["alice"],
        "content": {"body": "This room has been replaced", "replacement_room": new},
    }
    assert result["refusal"] == {"status": 403, "errcode": "M_FORBIDDEN"}
    predecessor = result["predecessor"]
    assert predecessor["roomId"] == old
    # Before 12 the create event names the tombstone too; 12's room ID comes first.
    assert predecessor.get("eventId") == (result["tombstone_id"] if version == "11" else None)
    assert result["history"] == [old, new]
    assert result["name"] == "Lobby" and result["version"] == version


@pytest.mark.parametrize("server", ["sqlite"], indirect=True)  # both: tests/sync/test_push_*
def test_push_rules_and_unread_counts_through_matrix_js_sdk(server, node, tmp_path):
    """bob adds, disables and deletes a content rule; alice's two messages make his room's
    unread count 2, a mention his highlight count 1, and his read receipt clears both."""
    scenario = {"alice": registered(server, "alice"), "bob": registered(server, "bob")}
    result = run_node(node, "push.mjs", server.client_url, json.dumps(scenario), tmp_path=tmp_path)
    rules = result["rules"]
    assert rules["added"] == {
        "rule_id": "tulips",
        "default": False,
        "enabled": True,
        "pattern": "tulip",
        "actions": ["notify"],
    }
    assert rules["disabled"]["enabled"] is False
    assert rules["deleted"] is None
    assert result["seen"] == [
        {"total": 2, "highlight": 0},
        {"total": 3, "highlight": 1},
        {"total": 0, "highlight": 0},
    ]


@pytest.mark.parametrize(
    "database_url", ["sqlite"], indirect=True
)  # both: tests/accounts/test_registration_tokens.py
def test_registration_token_through_matrix_js_sdk(start_weir, database_url, node, tmp_path):
    """Element's token registration with InteractiveAuth: the token is valid, the first user
    registers through the token stage and the SDK's dummy stage, and the one-use token is
    then invalid and refused to a second user with M_FORBIDDEN."""
    weir = start_weir({"database": {"url": database_url}, "registration": {"requires_token": True}})
    admin = register_admin(weir.client_url, "jsadmin")
    made = admin.post("/_synapse/admin/v1/registration_tokens/new", json={"uses_allowed": 1})
    assert made.status_code == 200, made.text
    scenario = {
        "token": made.json()["token"],
        "first": "tokenfirst",
        "second": "tokensecond",
        "password": PASSWORD,
    }
    result = run_node(
        node, "registration_token.mjs", weir.client_url, json.dumps(scenario), tmp_path=tmp_path
    )
    assert result["before"] is True and result["after"] is False
    assert result["user_id"] == "@tokenfirst:weir.test" and result["has_token"]
    assert result["first_stages"] == ["m.login.registration_token"]  # dummy: the SDK's own
    assert result["second"] == {"refused": "M_FORBIDDEN"}
    assert result["second_stages"] == ["m.login.registration_token"] * 2
    details = admin.get(f"/_synapse/admin/v1/registration_tokens/{scenario['token']}").json()
    assert (details["pending"], details["completed"]) == (0, 1)


@pytest.mark.parametrize("server", ["sqlite"], indirect=True)  # both: test_sliding_sync.py
def test_sliding_sync_through_matrix_js_sdk(server, node, tmp_path):
    """bob's client syncs with matrix-js-sdk's SlidingSync (MSC4186's unstable path, its
    to_device and e2ee extensions feeding the rust crypto), alice's with /sync: he sees her
    invite to an encrypted room in his list, joins, and each decrypts the other's message."""
    scenario = {"alice": registered(server, "alice"), "bob": registered(server, "bob")}
    result = run_node(
        node, "sliding.mjs", server.client_url, json.dumps(scenario), tmp_path=tmp_path
    )
    assert result["invites_seen"] == [result["room_id"]]
    assert result["invite_name"] == "Sliding secrets"
    assert result["encrypted_for_bob"] is True
    assert result["bob_read"] == "a secret over sliding sync"
    assert result["alice_read"] == "and one back"
    assert result["to_device_seen"] >= 1  # the room key, at least
    assert result["list_count"] == 1


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # both: tests/appservice/
def test_an_appservice_puppet_through_matrix_js_sdk(start_weir, database_url, node, tmp_path):
    """A bridge's puppet, registered and driven with matrix-js-sdk on the appservice's token
    (`queryParams: { user_id }`), talks with alice's syncing client; her answer reaches the
    appservice in a transaction."""
    with FakeAppservice() as fake:
        path = tmp_path / "bridge.yaml"
        path.write_text(registration_yaml("bridge", fake.url))
        weir = start_weir(
            {"database": {"url": database_url}, "app_service_config_files": [str(path)]}
        )
        scenario = {
            "alice": registered(weir, "alice"),
            "as_token": "as-bridge",
            "puppet": "bridge_js",
        }
        result = run_node(
            node, "appservice.mjs", weir.client_url, json.dumps(scenario), tmp_path=tmp_path
        )
        puppet = "@bridge_js:weir.test"
        assert result["puppet"] == puppet and result["whoami"] == puppet
        assert result["seen"] == {"sender": puppet, "body": "hello from the other network"}

        def answered() -> list[dict]:
            return [e for t in fake.transactions() for e in t.body["events"]]

        assert fake.wait_for(lambda: any(e["event_id"] == result["reply"] for e in answered()))
        reply = next(e for e in answered() if e["event_id"] == result["reply"])
        assert reply["sender"] == result["alice"] and reply["content"]["body"] == "hello back"
        assert reply["room_id"] == result["room_id"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # both: tests/sync/test_pushers
def test_a_pusher_through_matrix_js_sdk(start_weir, database_url, node, tmp_path):
    """bob's client sets an http pusher with setPusher and reads it back with getPushers;
    alice's message then reaches his push gateway on loopback as a notify."""
    gateway_ip = "127.40.70.11"
    with PushGateway(gateway_ip) as gateway:
        weir = start_weir(
            {
                "database": {"url": database_url},
                "push": {"ip_range_allowlist": [f"{gateway_ip}/32"]},
            }
        )
        scenario = {
            "alice": registered(weir, "alice"),
            "bob": registered(weir, "bob"),
            "gateway_url": gateway.url,
        }
        result = run_node(
            node, "pushers.mjs", weir.client_url, json.dumps(scenario), tmp_path=tmp_path
        )
        [pusher] = result["pushers"]
        assert pusher["kind"] == "http" and pusher["app_id"] == "org.weir.js"
        assert pusher["pushkey"] == "js-pushkey" and pusher["data"] == {"url": gateway.url}
        notified = gateway.wait_for(lambda n: n["event_id"] == result["event_id"])
        assert notified["room_id"] == result["room_id"]
        assert notified["sender"] == result["alice"]
        assert notified["room_name"] == "Pushed room"
        assert notified["content"] == {"msgtype": "m.text", "body": "ring bob's phone"}
        assert [d["pushkey"] for d in notified["devices"]] == ["js-pushkey"]
        assert len(gateway.arrived) == 1


# PostgreSQL only: several instances need it (SQLite with two exits 2, test_instances.py).
def test_two_instances_through_matrix_js_sdk(pg_cluster, start_weir, node, tmp_path):
    """alice's client syncs on instance a, bob's on b, of one server on one PostgreSQL: the
    invite, the joins, the room keys (to-device) and a later device of bob's on a (a device
    list change) all cross instances, and every message is decrypted on the other side."""
    shared = {
        "database": {"url": pg_cluster.new_database()},
        "data_dir": str(tmp_path / "shared-data"),
        "cluster": {"instances": 2},
    }
    a = start_weir({**shared, "instance_name": "a"}, name="a")
    b = start_weir({**shared, "instance_name": "b"}, name="b")
    messages = {"from_alice": "hello from a", "from_bob": "hello from b", "later": "to bob2"}
    scenario = {
        "alice": registered(a, "alice"),
        "bob": registered(b, "bob"),
        "other_url": b.client_url,
        "messages": messages,
    }
    result = run_node(node, "instances.mjs", a.client_url, json.dumps(scenario), tmp_path=tmp_path)
    devices, sent, received = result["devices"], result["sent"], result["received"]
    assert received[devices["bob"]][sent["fromAlice"]] == messages["from_alice"]
    assert received[devices["alice"]][sent["fromBob"]] == messages["from_bob"]
    assert received[devices["bob2"]][sent["later"]] == messages["later"]
    assert received[devices["bob"]][sent["later"]] == messages["later"]
    # Both instances woke syncs for what the other wrote.
    for proc in (a, b):
        assert metric(proc.client_url, "weir_cluster_wakes_total") > 0
