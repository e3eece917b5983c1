"""A fake resident server holding a big room: tests/peers/resident.py's ResidentPeer, with
a public room version 10 room of `members` of its own users, each event signed by it, and
the reads a joining server makes afterwards.

    peer = BigResident(test_ca, host="127.78.5.2", members=10_000).start()
    client.post("/_matrix/client/v3/join/" + peer.room_id, params={"server_name": ...})

The room, one linear chain: create, the creator's join, power levels, join rules (public),
history visibility (shared), the joins of members 1 to `members` - 1, then `messages`
messages from members spread over the room. It answers make_join, send_join v2 (the whole
state, its auth chain and the event; members are never omitted), /state_ids, /event,
/backfill and /send (accepted, unread). A join is answered but never added to the room, so
every server that joins sees the same room. ResidentPeer's lies and junk are not served.
"""

from __future__ import annotations

import json
import time
from urllib.parse import parse_qs

from homeserver.rooms.events import add_hashes_and_signatures, event_id_for
from homeserver.rooms.versions import ROOM_V10
from tests.peers.honest import SeenRequest
from tests.peers.resident import ResidentPeer

FED_V1 = "/_matrix/federation/v1"
JSON = {"Content-Type": "application/json"}
BACKFILL_MAX = 100  # what Synapse serves at most
NOT_FOUND = (404, {"errcode": "M_NOT_FOUND", "error": "Unknown event"})


class BigResident(ResidentPeer):
    def __init__(self, ca, host: str, members: int, messages: int = 20, port: int = 8448):
        self.member_count = members
        self.message_count = messages
        super().__init__(ca, host, port)  # builds the room (_build_room)
        self.route("GET", f"{FED_V1}/state_ids/{self.room_id}", self._state_ids)
        self.route("GET", f"{FED_V1}/event/", self._event_by_id, prefix=True)
        self.route("PUT", f"{FED_V1}/send/", lambda req: (200, {"pdus": {}}), prefix=True)
        self._join_head = self._encode_join_answer()

    # -- the room --------------------------------------------------------------------------

    def _append(self, kind: str, content: dict, state_key, sender: str, auth: list) -> str:
        pdu = {
            "room_id": self.room_id,
            "sender": sender,
            "type": kind,
            "content": content,
            "prev_events": [self.chain[-1][0]] if self.chain else [],
            "auth_events": auth,
            "depth": len(self.chain) + 1,
            "origin_server_ts": self._ts + len(self.chain),
        }
        if state_key is not None:
            pdu["state_key"] = state_key
        add_hashes_and_signatures(ROOM_V10, pdu, self.server_name, self.signing_key)
        event_id = event_id_for(ROOM_V10, pdu)
        self.position[event_id] = len(self.chain)
        self.chain.append((event_id, pdu))
        return event_id

    def _build_room(self) -> None:
        """Replaces ResidentPeer's five events (its builder reads the whole room per event:
        fine for five, quadratic for ten thousand)."""
        self.chain: list[tuple[str, dict]] = []  # every event, oldest first
        self.position: dict[str, int] = {}
        self._ts = int(time.time() * 1000) - 60_000 - self.member_count - self.message_count
        c = self.creator
        create = self._append("m.room.create", {"creator": c, "room_version": "10"}, "", c, [])
        joined = self._append("m.room.member", {"membership": "join"}, c, c, [create])
        power = self._append("m.room.power_levels", _power_levels(c), "", c, [create, joined])
        base = [create, power, joined]
        rules = self._append("m.room.join_rules", {"join_rule": "public"}, "", c, base)
        shared = {"history_visibility": "shared"}
        self._append("m.room.history_visibility", shared, "", c, base)
        self.join_auth = [create, power, rules]
        members = {c: joined}
        for n in range(1, self.member_count):
            user = f"@m{n}:{self.server_name}"
            join = {"membership": "join", "displayname": f"member {n}"}
            members[user] = self._append("m.room.member", join, user, user, self.join_auth)
        self.events = list(self.chain)  # ResidentPeer's meaning: the room's state
        senders = list(members)
        step = max(1, len(senders) // max(1, self.message_count))
        for i in range(self.message_count):
            sender = senders[(i * step) % len(senders)]
            body = {"msgtype": "m.text", "body": f"message {i + 1} of {self.message_count}"}
            self._append("m.room.message", body, None, sender, [create, power, members[sender]])
        self.latest = self.chain[-1][0]

    def auth_closure(self, event_ids: list[str]) -> list[str]:
        """Every event reachable from `event_ids` through auth_events, them excluded."""
        seen: set[str] = set()
        frontier = [a for i in event_ids for a in self.pdu(i)["auth_events"]]
        while frontier:
            event_id = frontier.pop()
            if event_id not in seen:
                seen.add(event_id)
                frontier += self.pdu(event_id)["auth_events"]
        return sorted(seen, key=self.position.__getitem__)

    def pdu(self, event_id: str) -> dict:
        return self.chain[self.position[event_id]][1]

    def _encode_join_answer(self) -> bytes:
        """The send_join answer up to its "event", encoded once: its state is all the
        room's, whoever joins."""
        state = [pdu for _, pdu in self.events]
        chain = [self.pdu(i) for i in self.auth_closure([i for i, _ in self.events])]
        head = {"origin": self.server_name, "members_omitted": False}
        text = json.dumps(head)[:-1]
        text += f', "state": {json.dumps(state)}, "auth_chain": {json.dumps(chain)}, "event": '
        return text.encode()

    @property
    def join_answer_bytes(self) -> int:
        return len(self._join_head)

    # -- answers ---------------------------------------------------------------------------

    def _join_auth_events(self) -> list[str]:
        return self.join_auth  # known when built: no read of the whole room per make_join

    def _next_depth(self) -> int:
        return len(self.chain) + 1

    def _send_join(self, req: SeenRequest) -> tuple:
        return 200, self._join_head + req.body + b"}", JSON

    def _state_ids(self, req: SeenRequest) -> tuple:
        """The state before the event (as Synapse answers), and its auth chain."""
        at = self.position.get(parse_qs(req.query).get("event_id", [""])[0])
        if at is None:
            return NOT_FOUND
        state = [i for i, pdu in self.chain[:at] if "state_key" in pdu]
        return 200, {"pdu_ids": state, "auth_chain_ids": self.auth_closure(state)}

    def _event_by_id(self, req: SeenRequest) -> tuple:
        event_id = req.path[len(f"{FED_V1}/event/") :]
        if event_id not in self.position:
            return NOT_FOUND
        return 200, self._pdus([self.pdu(event_id)])

    def _backfill(self, req: SeenRequest) -> tuple:
        """The events given in `v` and those before them, newest first, up to `limit`."""
        query = parse_qs(req.query)
        known = [self.position[v] for v in query.get("v", []) if v in self.position]
        if not known:
            return NOT_FOUND
        limit = min(int(query.get("limit", ["10"])[0]), BACKFILL_MAX)
        top = max(known)
        window = self.chain[max(0, top - limit + 1) : top + 1]
        return 200, self._pdus([pdu for _, pdu in reversed(window)])

    def _pdus(self, pdus: list[dict]) -> dict:
        now = int(time.time() * 1000)
        return {"origin": self.server_name, "origin_server_ts": now, "pdus": pdus}

    def seen(self) -> dict[str, int]:
        """Requests it was sent, by kind."""
        kinds = ("make_join", "send_join", "state_ids", "event", "backfill", "send", "key")
        counts = dict.fromkeys(kinds, 0)
        for r in self.requests:
            parts = r.path.split("/")
            kind = parts[4] if len(parts) > 4 and parts[2] == "federation" else parts[2]
            counts[kind] = counts.get(kind, 0) + 1
        return {k: n for k, n in counts.items() if n}


def _power_levels(creator: str) -> dict:
    return {
        "users": {creator: 100},
        "users_default": 0,
        "events_default": 0,
        "state_default": 50,
        "ban": 50,
        "kick": 50,
        "redact": 50,
        "invite": 0,
    }
