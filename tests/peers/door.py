"""A fake resident server whose room takes knocks: it answers make_knock and send_knock as
the spec says, keeps the knock, and can refuse it afterwards with a kick of the knocker,
which it sends to the knocker's server in a transaction (as the room's server may).

    peer = KnockDoorPeer(test_ca, host="127.31.114.4").start()
    alice.post("/_matrix/client/v3/knock/" + peer.room_id, params={"via": peer.server_name})
    kick = peer.refusal(alice_id)    # the leave, signed, its auth events naming the knock
"""

from __future__ import annotations

import time
from urllib.parse import unquote

from homeserver.rooms.events import add_hashes_and_signatures, event_id_for
from homeserver.rooms.versions import ROOM_V10
from tests.peers.honest import SeenRequest
from tests.peers.resident import ResidentPeer


class KnockDoorPeer(ResidentPeer):
    def __init__(self, ca, host: str, port: int = 8448):
        super().__init__(ca, host=host, port=port)
        self.knocks: dict[str, str] = {}  # user ID -> event ID of their knock
        base = f"/_matrix/federation/v1/%s/{self.room_id}/"
        self.route("GET", base % "make_knock", self._make_knock, prefix=True)
        self.route("PUT", base % "send_knock", self._send_knock, prefix=True)

    def _build_room(self) -> None:
        self._add("m.room.create", {"creator": self.creator, "room_version": "10"})
        self._add("m.room.member", {"membership": "join"}, state_key=self.creator)
        self._add("m.room.power_levels", {"users": {self.creator: 100}})
        self._add("m.room.join_rules", {"join_rule": "knock"})
        self._add("m.room.name", {"name": "Door"})

    def _ids(self, *types: str) -> list[str]:
        by_type = {p["type"]: i for i, p in self.events if p.get("state_key") == ""}
        return [by_type[t] for t in types]

    def _make_knock(self, req: SeenRequest) -> tuple:
        user_id = unquote(req.path.rsplit("/", 1)[1].split("?")[0])
        template = {
            "room_id": self.room_id,
            "sender": user_id,
            "type": "m.room.member",
            "state_key": user_id,
            "content": {"membership": "knock"},
            "prev_events": [self.events[-1][0]],
            "auth_events": self._ids("m.room.create", "m.room.power_levels", "m.room.join_rules"),
            "depth": len(self.events) + 1,
            "origin": self.server_name,
            "origin_server_ts": int(time.time() * 1000),
        }
        return 200, {"room_version": "10", "event": template}

    def _send_knock(self, req: SeenRequest) -> tuple:
        pdu = req.json()
        event_id = event_id_for(ROOM_V10, pdu)
        self.events.append((event_id, pdu))
        self.knocks[pdu["state_key"]] = event_id
        state = [
            {k: p[k] for k in ("type", "state_key", "sender", "content")}
            for _, p in self.events
            if p["type"] in ("m.room.create", "m.room.join_rules", "m.room.name")
        ]
        return 200, {"knock_room_state": state}

    def refusal(self, user_id: str, answering: str | None = None) -> dict:
        """The creator's kick of the knocker, its auth events naming the knock (or the
        event `answering`)."""
        pdu = self._event("m.room.member", {"membership": "leave"}, state_key=user_id)
        pdu["auth_events"] = [
            *self._ids("m.room.create", "m.room.power_levels"),
            self.events[1][0],  # the creator's join
            answering or self.knocks[user_id],
        ]
        del pdu["hashes"], pdu["signatures"]  # signed again over the auth events set here
        add_hashes_and_signatures(ROOM_V10, pdu, self.server_name, self.signing_key)
        return pdu
