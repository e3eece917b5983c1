"""Inbound X-Matrix authentication and the notary endpoints, against the real server process
with a TLS federation listener, real origin peers and a real DNS server."""

import json
import os
import re
import time
from urllib.parse import quote

import pytest
import requests
from signedjson.key import (
    decode_verify_key_bytes,
    encode_verify_key_base64,
    generate_signing_key,
    get_verify_key,
)
from signedjson.sign import verify_signed_json
from unpaddedbase64 import decode_base64

from homeserver.api.app import create_flask_app
from homeserver.api.federation_auth import UNAUTHENTICATED_ROUTES, requires_server_auth
from homeserver.config import parse_config
from homeserver.federation.signing import sign_request
from homeserver.http.parsing import json_object
from homeserver.http.responses import json_response
from homeserver.runtime import HomeserverRuntime
from tests.peers.honest import HonestPeer
from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge
from tests.support.spec import assert_matches_spec

WEIR_IP = "127.30.0.1"
PROFILE = "/_matrix/federation/v1/query/profile"
KEYS = "/_matrix/key/v2/server"


@pytest.fixture(scope="module")
def origin(test_ca, dns):
    dns.add_a("origin.test", "127.31.0.1")
    with HonestPeer("origin.test", test_ca, host="127.31.0.1", port=8448) as peer:
        yield peer


@pytest.fixture(scope="module")
def retired(test_ca, dns):
    """An origin whose key 'ed25519:old' expired an hour ago (listed in old_verify_keys)."""
    dns.add_a("retired.test", "127.31.0.2")
    peer = HonestPeer("retired.test", test_ca, host="127.31.0.2", port=8448)
    peer.old_key = generate_signing_key("old")
    peer.old_verify_keys = {
        "ed25519:old": {
            "key": encode_verify_key_base64(get_verify_key(peer.old_key)),
            "expired_ts": int(time.time() * 1000) - 3600_000,
        }
    }
    with peer:
        yield peer


def weir_settings(test_ca, dns, directory, ip=WEIR_IP, **security):
    fed = federation_settings(test_ca, dns)
    fed.update(tls_listener_settings(test_ca, "weir.test", ip))
    settings = merge(base_settings(os.path.join(directory, "data")), {"federation": fed})
    if security:
        settings["security"] = {"federation": security}
    return settings


@pytest.fixture(scope="module")
def weir(test_ca, dns, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-fed"))
    proc = WeirProcess(directory, weir_settings(test_ca, dns, directory)).start()
    yield proc
    proc.stop()


def fed_get(weir, test_ca, target, authorization=None):
    headers = {"Authorization": authorization} if authorization else {}
    return requests.get(weir.fed_url(target), headers=headers, verify=test_ca.ca_path, timeout=30)


def profile_target(user_id):
    return f"{PROFILE}?user_id={quote(user_id, safe='')}"


def test_signed_request_from_origin_is_accepted(weir, test_ca, origin):
    MatrixClient(weir.client_url).register("alice")
    target = profile_target("@alice:weir.test")
    r = fed_get(weir, test_ca, target, origin.sign_request("weir.test", "GET", target))
    assert (r.status_code, r.json()) == (200, {})
    assert_matches_spec(r, "GET", PROFILE, api="server-server")
    target = profile_target("@nobody:weir.test")
    r = fed_get(weir, test_ca, target, origin.sign_request("weir.test", "GET", target))
    assert (r.status_code, r.json()["errcode"]) == (404, "M_NOT_FOUND")
    assert origin.hits(KEYS) == 1  # fetched once, then from the database
    weir.wait_for_log(re.escape(f"{PROFILE}?user_id=%40alice%3Aweir.test 200"))


def test_access_log_names_the_verified_origin(weir, test_ca, origin):
    target = profile_target("@alice:weir.test") + "&field=displayname"
    r = fed_get(weir, test_ca, target, origin.sign_request("weir.test", "GET", target))
    assert r.status_code == 200
    line = weir.wait_for_log("field=displayname")
    assert line.rstrip().endswith("origin=origin.test")


@pytest.mark.parametrize(
    "case",
    [
        "wrong signature",
        "wrong destination",
        "unknown key",
        "other uri",
        "other method",
        "other origin",
    ],
)
def test_bad_signatures_are_refused(weir, test_ca, origin, case):
    target = profile_target("@alice:weir.test")
    if case == "wrong signature":
        impostor = generate_signing_key(origin.signing_key.version)
        auth = sign_request(impostor, "origin.test", "weir.test", "GET", target)
    elif case == "wrong destination":
        auth = origin.sign_request("elsewhere.test", "GET", target)
    elif case == "unknown key":
        auth = sign_request(generate_signing_key("nope"), "origin.test", "weir.test", "GET", target)
    elif case == "other uri":
        auth = origin.sign_request("weir.test", "GET", target + "&field=avatar_url")
    elif case == "other method":
        auth = origin.sign_request("weir.test", "PUT", target)
    else:
        auth = origin.sign_request("weir.test", "GET", target).replace("origin.test", "127.31.0.1")
    r = fed_get(weir, test_ca, target, auth)
    assert (r.status_code, r.json()["errcode"]) == (401, "M_UNAUTHORIZED")


def test_expired_key_is_refused(weir, test_ca, retired):
    target = profile_target("@alice:weir.test")
    auth = sign_request(retired.old_key, "retired.test", "weir.test", "GET", target)
    r = fed_get(weir, test_ca, target, auth)
    assert (r.status_code, r.json()["errcode"]) == (401, "M_UNAUTHORIZED")
    # Its current key works.
    r = fed_get(weir, test_ca, target, retired.sign_request("weir.test", "GET", target))
    assert r.status_code == 200


@pytest.mark.parametrize(
    "authorization, status",
    [
        (None, 401),
        ("Bearer sometoken", 401),
        ('X-Matrix origin="origin.test",key="ed25519:a_peer"', 400),
        ('X-Matrix origin="not a/server",key="ed25519:a_peer",sig="abc"', 400),
    ],
)
def test_missing_or_malformed_header_is_refused(weir, test_ca, authorization, status):
    r = fed_get(weir, test_ca, profile_target("@alice:weir.test"), authorization)
    assert (r.status_code, r.json()["errcode"]) == (status, "M_UNAUTHORIZED")


def test_version_needs_no_auth(weir, test_ca):
    r = fed_get(weir, test_ca, "/_matrix/federation/v1/version")
    assert r.status_code == 200 and r.json()["server"]["name"] == "Weir"
    assert_matches_spec(r, "GET", "/_matrix/federation/v1/version", api="server-server")


# -- notary ------------------------------------------------------------------------------------


def weir_verify_key(weir, test_ca):
    doc = fed_get(weir, test_ca, KEYS).json()
    ((key_id, value),) = doc["verify_keys"].items()
    return decode_verify_key_bytes(key_id, decode_base64(value["key"]))


def test_notary_serves_origin_keys_signed_by_both(weir, test_ca, origin):
    r = fed_get(weir, test_ca, "/_matrix/key/v2/query/origin.test")
    assert r.status_code == 200
    assert_matches_spec(r, "GET", "/_matrix/key/v2/query/{serverName}", api="server-server")
    assert_matches_spec(fed_get(weir, test_ca, KEYS), "GET", KEYS, api="server-server")
    ((doc,),) = r.json().values()
    assert doc["server_name"] == "origin.test" and origin.key_id in doc["verify_keys"]
    verify_signed_json(doc, "origin.test", get_verify_key(origin.signing_key))
    verify_signed_json(doc, "weir.test", weir_verify_key(weir, test_ca))


def test_notary_post_honours_minimum_valid_until_ts(weir, test_ca, origin):
    fetches = origin.hits(KEYS)
    body = {"server_keys": {"origin.test": {origin.key_id: {}}, "weir.test": {}}}
    r = requests.post(weir.fed_url("/_matrix/key/v2/query"), json=body, verify=test_ca.ca_path)
    assert_matches_spec(r, "POST", "/_matrix/key/v2/query", api="server-server")
    names = sorted(d["server_name"] for d in r.json()["server_keys"])
    assert names == ["origin.test", "weir.test"]
    assert origin.hits(KEYS) == fetches  # cached document is valid now: no fetch
    later = int(time.time() * 1000) + 3 * 24 * 3600 * 1000  # beyond the cached validity
    body = {"server_keys": {"origin.test": {origin.key_id: {"minimum_valid_until_ts": later}}}}
    r = requests.post(weir.fed_url("/_matrix/key/v2/query"), json=body, verify=test_ca.ca_path)
    assert r.status_code == 200 and len(r.json()["server_keys"]) == 1
    assert origin.hits(KEYS) == fetches + 1  # fetched again to try to satisfy it


def test_notary_query_criteria_ignore_unknown_keys(weir, test_ca, origin):
    # The spec's Query Criteria object does not forbid other keys: they are ignored.
    body = {"server_keys": {"origin.test": {origin.key_id: {"x.unknown": 1}}}}
    r = requests.post(weir.fed_url("/_matrix/key/v2/query"), json=body, verify=test_ca.ca_path)
    assert r.status_code == 200, r.text
    assert [d["server_name"] for d in r.json()["server_keys"]] == ["origin.test"]


def test_notary_unknown_server_and_bad_query(weir, test_ca):
    r = fed_get(weir, test_ca, "/_matrix/key/v2/query/unresolvable.test")
    assert r.json() == {"server_keys": []}
    r = requests.post(
        weir.fed_url("/_matrix/key/v2/query"), json={"server_keys": []}, verify=test_ca.ca_path
    )
    assert r.status_code == 400


def test_notary_query_naming_no_server_is_an_empty_answer(weir, test_ca):
    # Spec, POST /_matrix/key/v2/query: "If no servers are given, the notary server must
    # return an empty server_keys array in the response."
    r = requests.post(
        weir.fed_url("/_matrix/key/v2/query"), json={"server_keys": {}}, verify=test_ca.ca_path
    )
    assert (r.status_code, r.json()) == (200, {"server_keys": []})
    assert_matches_spec(r, "POST", "/_matrix/key/v2/query", api="server-server")


# -- the key-resolution rate over HTTP -------------------------------------------------------


def test_key_resolution_rate_gives_429_with_retry_after(test_ca, dns, origin, retired, tmp_path):
    settings = weir_settings(
        test_ca,
        dns,
        str(tmp_path),
        ip="127.30.0.2",
        key_resolution_per_ip_rate={"max_requests": 1, "per_seconds": 3600},
    )
    with WeirProcess(str(tmp_path), settings) as weir:
        target = profile_target("@nobody:weir.test")
        r = fed_get(weir, test_ca, target, origin.sign_request("weir.test", "GET", target))
        assert r.status_code == 404  # authenticated; its key fetch used the allowance
        r = fed_get(weir, test_ca, target, retired.sign_request("weir.test", "GET", target))
        assert (r.status_code, r.json()["errcode"]) == (429, "M_LIMIT_EXCEEDED")
        assert int(r.headers["Retry-After"]) >= 1 and r.json()["retry_after_ms"] > 0
        # The known origin still gets in: its key is cached.
        r = fed_get(weir, test_ca, target, origin.sign_request("weir.test", "GET", target))
        assert r.status_code == 404


# -- in-process: the guard on every route, and signed content --------------------------------


@pytest.fixture
def app_runtime(test_ca, dns, tmp_path):
    config = parse_config(
        {
            "server_name": "weir.test",
            "data_dir": str(tmp_path),
            "database": {"url": f"sqlite:///{tmp_path}/homeserver.db"},
            "federation": federation_settings(test_ca, dns),
        }
    )
    rt = HomeserverRuntime(config)
    yield rt
    rt.close()


def test_every_federation_route_requires_server_auth(app_runtime):
    app = create_flask_app(app_runtime)
    federation_rules = [
        r for r in app.url_map.iter_rules() if r.rule.startswith("/_matrix/federation/")
    ]
    assert federation_rules
    for rule in federation_rules:
        view = app.view_functions[rule.endpoint]
        assert (
            getattr(view, "requires_server_auth", False) or rule.rule in UNAUTHENTICATED_ROUTES
        ), rule.rule


def test_signed_content_is_verified(app_runtime, origin):
    app = create_flask_app(app_runtime)

    @requires_server_auth
    def echo(txn):
        return json_response({"txn": txn, "body": json_object()})

    app.add_url_rule("/_matrix/federation/v1/echo/<txn>", view_func=echo, methods=["PUT"])
    content = {"pdus": [{"type": "m.room.message", "content": {"body": "héllo"}}]}
    target = "/_matrix/federation/v1/echo/t%201"
    auth = origin.sign_request("weir.test", "PUT", target, content)
    http = app.test_client()
    r = http.put(
        target,
        json=content,
        headers={"Authorization": auth},
        environ_overrides={"REQUEST_URI": target},
    )
    assert r.status_code == 200 and r.json == {"txn": "t 1", "body": content}, r.json
    r = http.put(
        target,
        json={"pdus": []},
        headers={"Authorization": auth},
        environ_overrides={"REQUEST_URI": target},
    )
    assert (r.status_code, r.json["errcode"]) == (401, "M_UNAUTHORIZED")


def test_a_signed_body_is_parsed_once(app_runtime, origin, monkeypatch):
    # A transaction body may be 10 MiB of JSON, parsed on the hub: the guard that verifies
    # it and the handler after it share one parse.
    app = create_flask_app(app_runtime)

    @requires_server_auth
    def echo(txn):
        return json_response({"n": len(json_object()["pdus"])})

    app.add_url_rule("/_matrix/federation/v1/echo/<txn>", view_func=echo, methods=["PUT"])
    content = {"pdus": [{"type": "m.room.message", "content": {"body": "x" * 1000}}]}
    raw = json.dumps(content).encode()
    target = "/_matrix/federation/v1/echo/t1"
    auth = origin.sign_request("weir.test", "PUT", target, content)
    parsed = []
    real_loads = json.loads
    monkeypatch.setattr(
        json, "loads", lambda s, *a, **kw: (parsed.append(s), real_loads(s, *a, **kw))[1]
    )
    r = app.test_client().put(
        target,
        data=raw,
        content_type="application/json",
        headers={"Authorization": auth},
        environ_overrides={"REQUEST_URI": target},
    )
    assert r.status_code == 200 and r.get_json() == {"n": 1}
    # The strict decoder (homeserver/core/strict_json.py) hands json.loads the UTF-8 text.
    assert parsed.count(raw.decode("utf-8")) == 1


def test_repeated_authorization_headers(app_runtime, origin):
    # Two X-Matrix headers (WSGI joins them with a comma): one with a key we cannot find, one
    # valid. The valid one authenticates the request.
    app = create_flask_app(app_runtime)
    target = profile_target("@nobody:weir.test")
    unknown = sign_request(generate_signing_key("gone"), "origin.test", "weir.test", "GET", target)
    valid = origin.sign_request("weir.test", "GET", target)
    r = app.test_client().get(
        target,
        headers=[("Authorization", unknown), ("Authorization", valid)],
        environ_overrides={"REQUEST_URI": target},
    )
    assert (r.status_code, r.json["errcode"]) == (404, "M_NOT_FOUND")


def test_notary_names_that_are_not_server_names_cost_nothing(app_runtime):
    # Left out of the answer, like an unreachable server, before a key-resolution slot or
    # a rate token is spent on a discovery that cannot succeed.
    keyring = app_runtime.keyring
    documents = keyring.key_documents({"not a server!": ([], 0), "x:99999": ([], 0)}, "192.0.2.7")
    assert documents == []
    assert keyring.network_fetches == 0
    assert app_runtime.key_resolution_rate.tracked_keys == 0
