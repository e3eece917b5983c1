"""Push rules over the client-server API on the real server (SQLite and PostgreSQL): a
user's rules created, read, updated, ordered with before/after and deleted, the server
defaults enabled, disabled and given other actions (never created or deleted), the errors
the spec names, and the change reaching /sync as m.push_rules account data."""

from urllib.parse import quote

from tests.rooms.conftest import V3
from tests.support.spec import assert_matches_spec
from tests.sync.conftest import sync

RULES = f"{V3}/pushrules/global"


def rule_path(kind: str, rule_id: str, field: str = "") -> str:
    return f"{RULES}/{kind}/{quote(rule_id, safe='')}" + (f"/{field}" if field else "")


def put_rule(client, kind: str, rule_id: str, body: dict, status: int = 200, **params):
    r = client.put(rule_path(kind, rule_id), json=body, params=params)
    assert r.status_code == status, r.text
    return r.json()


def user_rule_ids(client, kind: str) -> list[str]:
    ruleset = client.get(f"{RULES}/").json()
    return [r["rule_id"] for r in ruleset[kind] if not r["default"]]


def test_create_read_update_delete_a_content_rule(user):
    alice = user("alice")
    put_rule(alice, "content", "tulips", {"pattern": "tulip*", "actions": ["notify"]})
    got = alice.get(rule_path("content", "tulips"))
    assert_matches_spec(got, "get", "/_matrix/client/v3/pushrules/global/{kind}/{ruleId}")
    assert got.json() == {
        "rule_id": "tulips",
        "default": False,
        "enabled": True,
        "pattern": "tulip*",
        "actions": ["notify"],
    }
    content = alice.get(f"{RULES}/").json()["content"]
    # A user's rules come before the defaults of their kind.
    assert [r["rule_id"] for r in content] == ["tulips", ".m.rule.contains_user_name"]

    put_rule(alice, "content", "tulips", {"pattern": "rose", "actions": []})
    assert alice.get(rule_path("content", "tulips")).json()["pattern"] == "rose"

    r = alice.put(rule_path("content", "tulips", "enabled"), json={"enabled": False})
    assert r.status_code == 200, r.text
    assert alice.get(rule_path("content", "tulips", "enabled")).json() == {"enabled": False}
    highlight = ["notify", {"set_tweak": "highlight"}]
    r = alice.put(rule_path("content", "tulips", "actions"), json={"actions": highlight})
    assert r.status_code == 200, r.text
    assert alice.get(rule_path("content", "tulips", "actions")).json() == {"actions": highlight}

    assert alice.delete(rule_path("content", "tulips")).status_code == 200
    assert alice.get(rule_path("content", "tulips")).json()["errcode"] == "M_NOT_FOUND"
    assert alice.delete(rule_path("content", "tulips")).status_code == 404


def test_room_sender_and_override_rules(user):
    alice = user("alice")
    room_id, sender = "!quiet:weir.test", "@loud:weir.test"
    put_rule(alice, "room", room_id, {"actions": []})
    put_rule(alice, "sender", sender, {"actions": ["notify"]})
    conditions = [{"kind": "event_match", "key": "type", "pattern": "m.call.*"}]
    put_rule(alice, "override", "calls", {"conditions": conditions, "actions": ["notify"]})
    put_rule(alice, "underride", "anything", {"actions": ["notify"]})  # no conditions: all
    ruleset = alice.get(f"{RULES}/").json()
    assert [r["rule_id"] for r in ruleset["room"]] == [room_id]
    assert [r["rule_id"] for r in ruleset["sender"]] == [sender]
    # .m.rule.master stays first; the user's overrides go before the other defaults.
    assert [r["rule_id"] for r in ruleset["override"]][:3] == [
        ".m.rule.master",
        "calls",
        ".m.rule.suppress_notices",
    ]
    assert ruleset["override"][1]["conditions"] == conditions
    assert ruleset["underride"][0]["rule_id"] == "anything"
    assert alice.get(rule_path("underride", "anything")).json()["conditions"] == []


def test_before_and_after_place_rules(user):
    alice = user("alice")
    body = {"pattern": "x", "actions": ["notify"]}
    put_rule(alice, "content", "a", body)
    put_rule(alice, "content", "b", body)  # new rules go first
    assert user_rule_ids(alice, "content") == ["b", "a"]
    put_rule(alice, "content", "c", body, after="b")
    assert user_rule_ids(alice, "content") == ["b", "c", "a"]
    put_rule(alice, "content", "d", body, before="b")
    assert user_rule_ids(alice, "content") == ["d", "b", "c", "a"]
    put_rule(alice, "content", "a", body, before="d")  # moves an existing rule
    assert user_rule_ids(alice, "content") == ["a", "d", "b", "c"]
    put_rule(alice, "content", "b", {"pattern": "y", "actions": []})  # stays where it was
    assert user_rule_ids(alice, "content") == ["a", "d", "b", "c"]

    refused = put_rule(alice, "content", "e", body, status=400, before="nothing")
    assert refused["errcode"] == "M_INVALID_PARAM"
    refused = put_rule(alice, "content", "e", body, status=400, after=".m.rule.contains_user_name")
    assert refused["errcode"] == "M_INVALID_PARAM"
    assert user_rule_ids(alice, "content") == ["a", "d", "b", "c"]


def test_defaults_are_enabled_disabled_and_given_actions_never_created_or_deleted(user):
    alice = user("alice")
    master = rule_path("override", ".m.rule.master", "enabled")
    assert alice.put(master, json={"enabled": True}).status_code == 200
    assert alice.get(master).json() == {"enabled": True}
    assert alice.get(f"{RULES}/").json()["override"][0]["enabled"] is True
    assert alice.put(master, json={"enabled": False}).status_code == 200
    assert alice.get(master).json() == {"enabled": False}

    message = rule_path("underride", ".m.rule.message", "actions")
    loud = ["notify", {"set_tweak": "sound", "value": "default"}]
    assert alice.put(message, json={"actions": loud}).status_code == 200
    assert alice.get(message).json() == {"actions": loud}
    # Another user's defaults are their own.
    assert user("bob").get(message).json() == {"actions": ["notify"]}

    r = alice.delete(rule_path("underride", ".m.rule.message"))
    assert (r.status_code, r.json()["errcode"]) == (400, "M_INVALID_PARAM")
    refused = put_rule(alice, "override", ".m.rule.mine", {"actions": []}, status=400)
    assert refused["errcode"] == "M_INVALID_PARAM"
    assert alice.get(message).json() == {"actions": loud}


def test_errors(user):
    alice = user("alice")
    checks = [
        (alice.get(rule_path("override", "nothing")), 404, "M_NOT_FOUND"),
        (alice.get(rule_path("sideways", "x")), 404, "M_NOT_FOUND"),
        (alice.get(f"{V3}/pushrules/device/override/x"), 404, "M_NOT_FOUND"),
        (
            alice.put(rule_path("override", "nothing", "enabled"), json={"enabled": True}),
            404,
            "M_NOT_FOUND",
        ),
        (
            alice.put(rule_path("override", "nothing", "actions"), json={"actions": []}),
            404,
            "M_NOT_FOUND",
        ),
        (alice.delete(rule_path("room", "!nothing:weir.test")), 404, "M_NOT_FOUND"),
        (
            alice.put(rule_path("content", "p"), json={"actions": ["notify"]}),
            400,
            "M_INVALID_PARAM",
        ),  # no pattern
        (
            alice.put(rule_path("content", "p"), json={"pattern": "x", "actions": ["shout"]}),
            400,
            "M_INVALID_PARAM",
        ),
        (alice.put(rule_path("content", "p"), json={"pattern": "x"}), 400, "M_INVALID_PARAM"),
        (
            alice.put(
                rule_path("override", "p"), json={"conditions": [{"key": "type"}], "actions": []}
            ),
            400,
            "M_INVALID_PARAM",
        ),
        (alice.put(rule_path("override", "a\\b"), json={"actions": []}), 400, "M_INVALID_PARAM"),
        (
            alice.put(rule_path("override", ".m.rule.master", "enabled"), json={"enabled": "yes"}),
            400,
            "M_INVALID_PARAM",
        ),
        (
            alice.put(rule_path("override", ".m.rule.master", "actions"), json={"actions": "x"}),
            400,
            "M_INVALID_PARAM",
        ),
    ]
    for response, status, errcode in checks:
        assert (response.status_code, response.json()["errcode"]) == (status, errcode), (
            response.request.method,
            response.request.url,
            response.text,
        )
    assert user_rule_ids(alice, "content") == []


def test_a_change_reaches_sync_as_account_data(user):
    alice = user("alice")
    first = sync(alice)
    pushed = [e for e in first["account_data"]["events"] if e["type"] == "m.push_rules"]
    assert [r["rule_id"] for r in pushed[0]["content"]["global"]["content"]] == [
        ".m.rule.contains_user_name"
    ]
    since = first["next_batch"]
    put_rule(alice, "content", "tulips", {"pattern": "tulip", "actions": ["notify"]})
    later = sync(alice, since=since, timeout=10_000)
    pushed = [e for e in later["account_data"]["events"] if e["type"] == "m.push_rules"]
    assert [r["rule_id"] for r in pushed[0]["content"]["global"]["content"]] == [
        "tulips",
        ".m.rule.contains_user_name",
    ]
    # Clients set them through the rules, never as account data.
    r = alice.put(f"{V3}/user/{alice.user_id}/account_data/m.push_rules", json={})
    assert r.status_code == 405
