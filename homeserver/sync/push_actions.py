"""What each stored event means for each local user (client-server spec, "Push Rules"),
recorded with the event, and what that counts: unread counts and /notifications.

`PushActions.hook` is a RoomService write hook: before an event is persisted (ours or one
received over federation), every local member joined to its room except the sender (and
the local user an invite is for) has their rules evaluated (push_eval.py), and the rows of
those it notifies are written in the event's own transaction (storage/push.py), so none is
ever lost or counted twice. The syncs the event wakes read the new counts (the woken ones
too: woken.py).

The room's facts (local members' display names, the joined count, the power levels) are read
once per room and kept until a state event is stored in it; each user's compiled rules are
kept until they change (push_ruleset.py). The evaluation runs on the hub, pausing for it
every `USERS_PER_PAUSE` users: `loadtests/push_rules_bench.py` measures it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from homeserver.core.concurrency import in_turns
from homeserver.core.events import Event
from homeserver.rooms.power_levels import CREATE, POWER_LEVELS, user_power_level
from homeserver.rooms.service import RoomService
from homeserver.storage.push import MAIN_THREAD, PushAction, PushStore
from homeserver.sync.push_eval import EventFacts, first_match
from homeserver.sync.push_ruleset import PushRules

# Users evaluated between two pauses for the hub (about 2 ms of work).
USERS_PER_PAUSE = 250
# Rooms whose facts are kept; past it the cache starts again.
MAX_CACHED_ROOMS = 10_000


@dataclass(frozen=True)
class RoomFacts:
    members: dict[str, str | None]  # local joined users: their display names
    joined: int
    version: object
    state: dict  # the create and power levels events, as power_levels.py reads them

    def sender_level(self, sender: str) -> int:
        return user_power_level(self.version, sender, self.state)  # type: ignore[arg-type]

    @property
    def notification_levels(self) -> dict:
        power_levels = self.state.get((POWER_LEVELS, ""))
        levels = power_levels.content.get("notifications") if power_levels else None
        return levels if isinstance(levels, dict) else {}


def thread_of(event: Event) -> str:
    relates = event.content.get("m.relates_to")
    if isinstance(relates, dict) and relates.get("rel_type") == "m.thread":
        root = relates.get("event_id")
        if isinstance(root, str):
            return root
    return MAIN_THREAD


class PushActions:
    def __init__(
        self,
        rules: PushRules,
        rooms: RoomService,
        server_name: str,
        on_notify: Callable[[Iterable[str]], None] | None = None,
    ):
        self.rules = rules
        # Told the users with new rows once they are committed: the push sender's wake-up.
        self.on_notify = on_notify
        self.store: PushStore = rules.store
        self.rooms = rooms
        self.server_name = server_name
        self._rooms: dict[str, RoomFacts] = {}

    def hook(self, events: list[Event]):
        """RoomService's write hook: the rows of the actions that notify, and the room's
        facts forgotten once a state event is stored."""
        room_id = events[0].room_id
        found: list[PushAction] = []
        # Not a room being created: no one of ours is in it yet.
        if room_id in self._rooms or self.rooms.room_exists(room_id):
            facts = self._room_facts(room_id)
            for event in events:
                found += self.evaluate(event, facts)
        changes_state = any(e.is_state for e in events)
        if changes_state:
            self._rooms.pop(room_id, None)
        if not found and not changes_state:
            return None

        def after(stored) -> None:
            if changes_state:  # read again once stored, whatever raced the write
                self._rooms.pop(room_id, None)
            if found and self.on_notify is not None:
                self.on_notify({a.user_id for a in found})

        return (lambda tx: PushStore.insert_push_actions(tx, found)), after

    def forget_room(self, room_id: str) -> None:
        """Another instance changed the room's state (sync/cluster.py)."""
        self._rooms.pop(room_id, None)

    def _room_facts(self, room_id: str) -> RoomFacts:
        facts = self._rooms.get(room_id)
        if facts is None:
            members, joined = self.store.local_members(room_id, self.server_name)
            state = self.rooms.store.current_state(room_id, [(CREATE, ""), (POWER_LEVELS, "")])
            version = self.rooms.room_version(room_id)
            facts = RoomFacts(members, joined, version, {k: s.event for k, s in state.items()})
            if len(self._rooms) >= MAX_CACHED_ROOMS:
                self._rooms.clear()
            self._rooms[room_id] = facts
        return facts

    def _audience(self, event: Event, room: RoomFacts) -> dict[str, str | None]:
        """Who the event is evaluated for, with their display names in the room."""
        audience = dict(room.members)
        audience.pop(event.sender, None)
        target = event.state_key
        if (
            event.type == "m.room.member"
            and event.membership == "invite"
            and target
            and target.endswith(":" + self.server_name)
        ):
            audience.setdefault(target, None)
        return audience

    def evaluate(self, event: Event, room: RoomFacts) -> list[PushAction]:
        audience = self._audience(event, room)
        if not audience:
            return []
        facts = EventFacts(
            event.pdu, room.joined, room.sender_level(event.sender), room.notification_levels
        )
        compiled = self.rules.compiled(list(audience))
        thread = thread_of(event)
        found = []
        for user_id, name in in_turns(audience.items(), USERS_PER_PAUSE):
            rule = first_match(compiled[user_id], facts, user_id, name)
            if rule is not None and rule.notify:
                found.append(
                    PushAction(user_id, event.event_id, thread, rule.highlight, rule.actions)
                )
        return found
