"""What a transaction carries besides room events, with a fake appservice
(tests/peers/appservice.py): typing and receipts in rooms it watches when it asked for
ephemeral events (MSC2409), to-device messages for its users (MSC3202), and only the rooms
and events of its namespaces."""

from urllib.parse import quote

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


def pushed(fake: FakeAppservice, key: str) -> list[dict]:
    return [item for t in fake.transactions() for item in t.body.get(key, [])]


def test_typing_receipts_and_to_device_reach_the_appservice(start_with_appservices, database_url):
    with FakeAppservice() as fake:
        weir = start_with_appservices(
            {"bridge": registration_yaml("bridge", fake.url, msc3202=True)}, database_url
        )
        alice = user(weir, "alice")
        watched = create_room(alice, preset="public_chat")
        unwatched = create_room(alice, preset="public_chat")
        bot = as_client(weir, "bridge")
        r = bot.post(
            f"{V3}/register",
            json={"type": "m.login.application_service", "username": "bridge_bob"},
        )
        assert r.status_code == 200, r.text
        puppet, device = r.json()["user_id"], r.json()["device_id"]
        r = bot.post(f"{V3}/join/{quote(watched)}", params={"user_id": puppet}, json={})
        assert r.status_code == 200, r.text

        # Events: the watched room's, never the other's.
        elsewhere = send(alice, unwatched, "not for the bridge")
        here = send(alice, watched, "for the bridge")
        assert fake.wait_for(lambda: here in [e["event_id"] for e in pushed(fake, "events")])
        assert elsewhere not in [e["event_id"] for e in pushed(fake, "events")]

        # Typing and a receipt, in both names for ephemeral events.
        r = alice.put(
            f"{V3}/rooms/{quote(watched)}/typing/{quote(alice.user_id)}",
            json={"typing": True, "timeout": 30000},
        )
        assert r.status_code == 200, r.text
        r = alice.post(f"{V3}/rooms/{quote(watched)}/receipt/m.read/{quote(here)}", json={})
        assert r.status_code == 200, r.text
        r = alice.put(
            f"{V3}/rooms/{quote(unwatched)}/typing/{quote(alice.user_id)}",
            json={"typing": True, "timeout": 30000},
        )
        assert fake.wait_for(
            lambda: any(e["type"] == "m.receipt" for e in pushed(fake, "ephemeral"))
        )
        ephemeral = pushed(fake, "ephemeral")
        assert ephemeral == pushed(fake, "de.sorunome.msc2409.ephemeral")
        typing = [e for e in ephemeral if e["type"] == "m.typing"]
        assert typing and typing[0] == {
            "type": "m.typing",
            "room_id": watched,
            "content": {"user_ids": [alice.user_id]},
        }
        receipt = next(e for e in ephemeral if e["type"] == "m.receipt")
        assert receipt["room_id"] == watched
        assert alice.user_id in receipt["content"][here]["m.read"]

        # A to-device message to the puppet's device.
        r = alice.put(
            f"{V3}/sendToDevice/m.bridge.test/td1",
            json={"messages": {puppet: {device: {"hello": "device"}}}},
        )
        assert r.status_code == 200, r.text
        assert fake.wait_for(lambda: pushed(fake, "de.sorunome.msc2409.to_device"))
        assert pushed(fake, "de.sorunome.msc2409.to_device") == [
            {
                "type": "m.bridge.test",
                "sender": alice.user_id,
                "to_user_id": puppet,
                "to_device_id": device,
                "content": {"hello": "device"},
            }
        ]
        assert puppet.endswith(f":{SERVER_NAME}")
        # The other room's typing, sent before the to-device message, never came.
        assert all(e["room_id"] == watched for e in pushed(fake, "ephemeral"))


def test_third_party_lookups_go_to_the_appservice_offering_the_protocol(start_with_appservices):
    with FakeAppservice() as fake:
        gitter = {
            "user_fields": ["username"],
            "location_fields": ["room"],
            "icon": "mxc://example.org/gitter",
            "field_types": {},
            "instances": [{"desc": "Gitter", "fields": {}, "network_id": "gitter"}],
        }
        portal = {
            "alias": "#bridge_gitter_matrix:weir.test",
            "protocol": "gitter",
            "fields": {"room": "matrix"},
        }
        fake.answers = {
            "/_matrix/app/v1/thirdparty/protocol/gitter": (200, gitter),
            "/_matrix/app/v1/thirdparty/location/gitter": (200, [portal]),
            "/_matrix/app/v1/thirdparty/location": (200, [portal]),
            "/_matrix/app/v1/thirdparty/user/gitter": (404, {"errcode": "M_NOT_FOUND"}),
        }
        weir = start_with_appservices(
            {"bridge": registration_yaml("bridge", fake.url, protocols=("gitter",))}
        )
        alice = user(weir, "alice")
        assert alice.get(f"{V3}/thirdparty/protocols").json() == {"gitter": gitter}
        assert alice.get(f"{V3}/thirdparty/protocol/gitter").json() == gitter
        r = alice.get(f"{V3}/thirdparty/protocol/irc")
        assert r.status_code == 404 and r.json()["errcode"] == "M_NOT_FOUND"

        r = alice.get(f"{V3}/thirdparty/location/gitter", params={"room": "matrix"})
        assert r.status_code == 200 and r.json() == [portal], r.text
        asked = fake.received[-1]
        assert asked.path == "/_matrix/app/v1/thirdparty/location/gitter?room=matrix"
        assert asked.headers["authorization"] == "Bearer hs-bridge"
        r = alice.get(f"{V3}/thirdparty/location", params={"alias": portal["alias"]})
        assert r.json() == [portal]
        # The appservice found no one: an empty list, not its error.
        assert alice.get(f"{V3}/thirdparty/user/gitter", params={"username": "x"}).json() == []
        assert alice.get(f"{V3}/thirdparty/user/irc").status_code == 404
