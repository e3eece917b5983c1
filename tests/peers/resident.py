"""A fake resident server: an honest peer holding one room version 10 public room, which
answers make_join and send_join for it, honestly or with a chosen lie in its answer.

    peer = ResidentPeer(test_ca, host="127.40.15.2").start()
    peer.lie = "forged_state"        # or "bad_signature", or None
    peer.junk_events = 49_000        # send_join answers carry that many junk events too
    peer.backfill_answer = b"..."    # what /backfill answers (default: 404)
    alice.post("/_matrix/client/v3/join/" + peer.room_id, ...)
    assert peer.send_joins() == 1
"""

from __future__ import annotations

import time
from urllib.parse import unquote

from signedjson.key import generate_signing_key

from homeserver.rooms.events import add_hashes_and_signatures, event_id_for
from homeserver.rooms.versions import ROOM_V10
from tests.peers.honest import HonestPeer, SeenRequest


class ResidentPeer(HonestPeer):
    def __init__(self, ca, host: str, port: int = 8448, creator_name: str | None = None):
        super().__init__(f"{host}:{port}", ca, host=host, port=port)
        self.room_id = f"!resident:{self.server_name}"
        self.creator = f"@creator:{self.server_name}"
        self.creator_name = creator_name  # the displayname of the creator's join, if any
        self.lie: str | None = None
        self.junk_events = 0
        self.backfill_answer: bytes | None = None
        self.events: list[tuple[str, dict]] = []  # (event_id, pdu), in order: the state
        self.latest: str | None = None  # the newest event: the state's, or a message after it
        self._build_room()
        self.make_join_prefix = f"/_matrix/federation/v1/make_join/{self.room_id}/"
        self.send_join_prefix = f"/_matrix/federation/v2/send_join/{self.room_id}/"
        self.route("GET", self.make_join_prefix, self._make_join, prefix=True)
        self.route("PUT", self.send_join_prefix, self._send_join, prefix=True)
        backfill = f"/_matrix/federation/v1/backfill/{self.room_id}"
        self.route("GET", backfill, self._backfill)
        self._junk_cache: tuple[int, list[dict]] = (0, [])

    def send_joins(self) -> int:
        return sum(1 for r in self.requests if r.path.startswith(self.send_join_prefix))

    def _event(self, event_type, content, state_key="", sender=None, signing_key=None) -> dict:
        by_type = {p["type"]: i for i, p in self.events if p.get("state_key") == ""}
        auth = [by_type[t] for t in ("m.room.create", "m.room.power_levels") if t in by_type]
        auth += [i for i, p in self.events if p.get("state_key") == (sender or self.creator)][-1:]
        pdu = {
            "room_id": self.room_id,
            "sender": sender or self.creator,
            "type": event_type,
            "state_key": state_key,
            "content": content,
            "prev_events": [self.events[-1][0]] if self.events else [],
            "auth_events": auth if event_type != "m.room.create" else [],
            "depth": len(self.events) + 1,
            "origin_server_ts": int(time.time() * 1000),
        }
        add_hashes_and_signatures(ROOM_V10, pdu, self.server_name, signing_key or self.signing_key)
        return pdu

    def _add(self, *args, **kw) -> str:
        pdu = self._event(*args, **kw)
        event_id = event_id_for(ROOM_V10, pdu)
        self.events.append((event_id, pdu))
        self.latest = event_id
        return event_id

    def add_message(self, body: str) -> str:
        """A message after the state: history a server that joins has to backfill."""
        pdu = self._event("m.room.message", {"msgtype": "m.text", "body": body})
        del pdu["state_key"], pdu["hashes"], pdu["signatures"]
        pdu["prev_events"] = [self.latest]
        add_hashes_and_signatures(ROOM_V10, pdu, self.server_name, self.signing_key)
        self.latest = event_id_for(ROOM_V10, pdu)
        return self.latest

    def _build_room(self) -> None:
        self._add("m.room.create", {"creator": self.creator, "room_version": "10"})
        profile = {"displayname": self.creator_name} if self.creator_name else {}
        self._add("m.room.member", {"membership": "join", **profile}, state_key=self.creator)
        self._add("m.room.power_levels", {"users": {self.creator: 100}})
        self._add("m.room.join_rules", {"join_rule": "public"})
        self._add("m.room.name", {"name": "Resident"})

    def _join_auth_events(self) -> list[str]:
        by_type = {p["type"]: i for i, p in self.events}
        return [by_type[t] for t in ("m.room.create", "m.room.power_levels", "m.room.join_rules")]

    def _next_depth(self) -> int:
        return len(self.events) + 1

    def _make_join(self, req: SeenRequest) -> tuple:
        user_id = unquote(req.path[len(self.make_join_prefix) :])
        template = {
            "room_id": self.room_id,
            "sender": user_id,
            "type": "m.room.member",
            "state_key": user_id,
            "content": {"membership": "join"},
            "prev_events": [self.latest],
            "auth_events": self._join_auth_events(),
            "depth": self._next_depth(),
            "origin": self.server_name,
            "origin_server_ts": int(time.time() * 1000),
        }
        return 200, {"room_version": "10", "event": template}

    def _send_join(self, req: SeenRequest) -> tuple:
        state = [pdu for _, pdu in self.events]
        if self.lie == "forged_state":
            # Well signed, but sent by someone who was never in the room.
            intruder = f"@intruder:{self.server_name}"
            state[-1] = self._event("m.room.name", {"name": "Owned"}, sender=intruder)
        elif self.lie == "bad_signature":
            # Signed with a key that is not the one this server publishes.
            wrong = generate_signing_key(self.signing_key.version)
            state[3] = self._event("m.room.join_rules", {"join_rule": "public"}, signing_key=wrong)
        return 200, {
            "origin": self.server_name,
            "state": state,
            "auth_chain": state[:3] + self.junk(self.junk_events),
            "event": req.json(),
            "members_omitted": False,
        }

    def junk(self, count: int) -> list[dict]:
        """`count` events of the room in the right format, each its own, none of them signed
        by anyone (their signatures are made up), and named by no other event."""
        if self._junk_cache[0] != count:
            base = dict(self.events[-1][1])
            fake = {self.server_name: {self.key_id: "A" * 86}}
            self._junk_cache = (
                count,
                [
                    dict(base, content={"name": f"junk {n}"}, depth=10_000 + n, signatures=fake)
                    for n in range(count)
                ],
            )
        return self._junk_cache[1]

    def _backfill(self, req: SeenRequest) -> tuple:
        if self.backfill_answer is None:
            return 404, {"errcode": "M_NOT_FOUND", "error": "no history here"}
        return 200, self.backfill_answer
