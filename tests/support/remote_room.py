"""A local room with members on fake origins: their PDUs are built against what the local
server shows through its client API (state event IDs, the latest event), as a remote server
in the room would build them.

    room = RemoteRoom.create(alice)                       # alice: a MatrixClient, logged in
    join_id, join = room.join_pdu(origin, "bob")          # @bob:<origin> joins (public room)
    r = send_transaction(weir.federation_url, origin, "weir.test", "t1", [join], ca)
    ids, pdus = room.messages(origin, "bob", ["one", "two"], prev=join_id)

    room, join_id = room_joined_by(weir, ca, alice, origin)   # the same, in one step
"""

from __future__ import annotations

from urllib.parse import quote

from homeserver.rooms.versions import KNOWN_ROOM_VERSIONS, RoomVersion
from tests.peers.origins import FakeOrigin, send_transaction

V3 = "/_matrix/client/v3"


class RemoteRoom:
    def __init__(self, client, room_id: str):
        self.client = client
        self.room_id = room_id
        # user ID -> event ID of their membership, once they joined through us
        self.members: dict[str, str] = {}
        self.depth = 100
        create = self.state_events()[("m.room.create", "")]
        self.version: RoomVersion = KNOWN_ROOM_VERSIONS[create["content"].get("room_version", "1")]

    @classmethod
    def create(cls, client, **body) -> RemoteRoom:
        r = client.post(f"{V3}/createRoom", json={"preset": "public_chat", **body})
        assert r.status_code == 200, r.text
        return cls(client, r.json()["room_id"])

    def _path(self, rest: str) -> str:
        return f"{V3}/rooms/{quote(self.room_id, safe='')}{rest}"

    def state_events(self) -> dict[tuple[str, str], dict]:
        r = self.client.get(self._path("/state"))
        assert r.status_code == 200, r.text
        return {(e["type"], e["state_key"]): e for e in r.json()}

    def state_ids(self) -> dict[tuple[str, str], str]:
        return {k: e["event_id"] for k, e in self.state_events().items()}

    def auth_ids(self, *keys: tuple[str, str]) -> list[str]:
        """The state events of `keys` as auth events: in v12 never the create event, which
        the room ID names."""
        state = self.state_ids()
        skip = ("m.room.create", "") if self.version.room_id_is_create_event_id else None
        return [state[k] for k in keys if k != skip]

    def pdu(self, origin: FakeOrigin, sender: str, event_type: str, content: dict, **kw):
        """(event_id, pdu) of an event of `origin`'s in this room, of its version, at the
        next depth."""
        kw.setdefault("depth", self._next_depth())
        return origin.pdu(self.room_id, sender, event_type, content, version=self.version, **kw)

    def latest_event_id(self) -> str:
        r = self.client.get(self._path("/messages"), params={"dir": "b", "limit": 1})
        assert r.status_code == 200, r.text
        return r.json()["chunk"][0]["event_id"]

    def timeline(self) -> list[dict]:
        """Every event the local client sees, oldest first."""
        events, token = [], None
        while True:
            params = {"dir": "f", "limit": 1000, **({"from": token} if token else {})}
            r = self.client.get(self._path("/messages"), params=params)
            assert r.status_code == 200, r.text
            body = r.json()
            events += body["chunk"]
            if not body["chunk"] or body.get("end") in (None, token):
                return events
            token = body["end"]

    def _next_depth(self) -> int:
        self.depth += 1
        return self.depth

    def join_pdu(
        self, origin: FakeOrigin, localpart: str, prev: str | None = None, profile=None
    ) -> tuple[str, dict]:
        """`profile`: the displayname and avatar_url the join carries, if any."""
        user = origin.user(localpart)
        auth = self.auth_ids(
            ("m.room.create", ""), ("m.room.power_levels", ""), ("m.room.join_rules", "")
        )
        event_id, pdu = self.pdu(
            origin,
            user,
            "m.room.member",
            {"membership": "join", **(profile or {})},
            state_key=user,
            prev_events=[prev or self.latest_event_id()],
            auth_events=auth,
        )
        self.members[user] = event_id
        return event_id, pdu

    def auth_for(self, user: str) -> list[str]:
        return [
            *self.auth_ids(("m.room.create", ""), ("m.room.power_levels", "")),
            self.members[user],
        ]

    def messages(
        self,
        origin: FakeOrigin,
        localpart: str,
        bodies: list[str],
        prev: str,
        auth: list[str] | None = None,
    ) -> tuple[list[str], list[dict]]:
        """Message PDUs by ``@localpart:origin``, each following the one before."""
        user = origin.user(localpart)
        auth = auth or self.auth_for(user)
        ids, pdus = [], []
        for body in bodies:
            event_id, pdu = self.pdu(
                origin,
                user,
                "m.room.message",
                {"msgtype": "m.text", "body": body},
                prev_events=[prev],
                auth_events=auth,
            )
            ids.append(event_id)
            pdus.append(pdu)
            prev = event_id
        return ids, pdus


def room_joined_by(
    weir, ca, client, origin: FakeOrigin, localpart: str = "bob"
) -> tuple[RemoteRoom, str]:
    """A new public room of ``client``'s that ``@localpart:origin`` joined through a
    transaction to ``weir``; returns the room and the join's event ID."""
    room = RemoteRoom.create(client)
    join_id, join = room.join_pdu(origin, localpart)
    r = send_transaction(
        weir.federation_url, origin, "weir.test", f"join-{room.room_id}-{localpart}", [join], ca
    )
    assert (r.status_code, r.json()) == (200, {"pdus": {join_id: {}}}), r.text
    return room, join_id
