"""Presence (client-server spec, "Presence"; server-server spec, "Presence"): whether a user
is online, idle (`unavailable`) or offline, with an optional status message.

Our users set it with `PUT /presence/{userId}/status`, and by syncing: a sync with
`set_presence` online or unavailable puts the user in that state, one without it brings an
offline user online (and leaves a user who chose unavailable so), and `offline` changes
nothing. A user whose syncs stopped is offline once `SYNC_ONLINE_TIMEOUT_MS`
has passed after the last one ended (a long-poll counts until its timeout), as Synapse does;
`sweep` finds them. Other servers' users' presence arrives in m.presence EDUs from their
server, for users who share a room with one of ours; one not heard of for
`REMOTE_TIMEOUT_MS` is shown offline, as its server may be gone.

A change is stored (storage/presence.py) with a position in the presence stream, which sync
tokens carry, and wakes the syncs of the users who share a room with its user. Our users'
changes go to the servers that share a room with them, in an m.presence EDU (ephemeral, in
the federation sender's memory, as typing is). A change that a client would not see (the
same state, message and activity) is neither stored nor sent.

With `presence.enabled = false`, nothing is tracked: the endpoints answer 403, syncs carry
no presence, and other servers' EDUs are dropped.

With several instances (`shared`), a user may sync through any of them, so until when they
count as online is stored (`online_until_ms`) and memory only saves writes: an instance
stores a time `SHARED_ONLINE_AHEAD_MS` past what it needs, and writes again only once its
syncs need more, so a busy user costs each instance a write every 30 s at most. Each
instance's sweep reads the stored times, not its memory, and takes a user offline only if
their time has run out still when it writes (`PresenceStore.go_offline`): one they left is
never taken offline while another keeps them online, and one whose instance died is taken
offline by the others. The price: offline up to 30 s later than with one instance.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable

import gevent

from homeserver.core.clock import now_ms
from homeserver.core.errors import forbidden, invalid_param, not_found
from homeserver.core.identifiers import is_valid_user_id, server_of
from homeserver.storage.presence import Presence, PresenceStore

log = logging.getLogger(__name__)

STATES = ("online", "unavailable", "offline")
# Synapse's figures: offline 30 s after the last sync ended; a user active in the last
# minute is `currently_active`; another server's user unheard of for 30 min is offline.
SYNC_ONLINE_TIMEOUT_MS = 30_000
CURRENTLY_ACTIVE_MS = 60_000
REMOTE_TIMEOUT_MS = 30 * 60_000
SWEEP_SECONDS = 5.0
# A sync waits at most this long (homeserver/sync/service.py, MAX_TIMEOUT_MS).
MAX_SYNC_WAIT_MS = 5 * 60_000
MAX_STATUS_MSG_BYTES = 1024
# Users looked at in one m.presence EDU; a server sends its users in a room with ours.
MAX_REMOTE_ITEMS = 1000
# Presence events in one sync response.
MAX_SYNC_EVENTS = 1000
# Several instances: how far past what a sync needs the stored online time is put.
SHARED_ONLINE_AHEAD_MS = 30_000
# Users one sweep takes offline at most; the rest go at the next.
SWEEP_BATCH = 1000

# send_edu(destinations, edu_type, content): the federation sender's in-memory queue.
SendEdu = Callable[[Iterable[str], str, dict], None]


def presence_event(presence: Presence, now: int) -> dict:
    """The m.presence event a client is sent (in /sync) of a stored presence."""
    content: dict = {
        "presence": presence.state,
        "last_active_ago": max(0, now - presence.last_active_ts),
        "currently_active": presence.currently_active,
    }
    if presence.status_msg is not None:
        content["status_msg"] = presence.status_msg
    return {"type": "m.presence", "sender": presence.user_id, "content": content}


class PresenceService:
    def __init__(
        self,
        store: PresenceStore,
        server_name: str,
        enabled: bool,
        sharing: Callable[[str], set[str]],
        notify_users: Callable[[Iterable[str]], None],
        send_edu: SendEdu,
        clock: Callable[[], float] = time.monotonic,
        shared: bool = False,
        wall_ms: Callable[[], int] = now_ms,
    ):
        """`sharing(user_id)`: the users who share a room with the user, itself included;
        `shared`: other instances share the database."""
        self.store = store
        self.server_name = server_name
        self.enabled = enabled
        self._sharing = sharing
        self._notify_users = notify_users
        self._send_edu = send_edu
        self._clock = clock
        # Users not offline, by when they go offline unless heard of again (clock seconds).
        self._online_until: dict[str, float] = {}
        # Our users' presence as last stored, while they are not offline: a sync's check
        # costs no read.
        self._local: dict[str, Presence] = {}
        self._sweeper: gevent.Greenlet | None = None
        self._shared = shared
        self._wall_ms = wall_ms  # stored online times: every instance's clock
        # Several instances: the online time this instance last stored, per user (ms).
        self._stored_until: dict[str, int] = {}

    # --- life cycle (main only: homeserver/processes/main.py) ---------------------------

    def start(self) -> None:
        if self.enabled and self._sweeper is None:
            self._sweeper = gevent.spawn(self._sweep_forever)

    def stop(self) -> None:
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.kill(block=False)

    # --- our users ------------------------------------------------------------------------

    def set_status(self, requester_id: str, user_id: str, body: dict) -> None:
        """PUT /presence/{userId}/status."""
        self._require_enabled()
        if user_id != requester_id:
            raise forbidden("You may only set your own presence")
        state, status_msg = body.get("presence"), body.get("status_msg")
        if state not in STATES:
            raise invalid_param("presence must be one of " + ", ".join(STATES))
        if status_msg is not None and not isinstance(status_msg, str):
            raise invalid_param("status_msg must be a string")
        if status_msg is not None and len(status_msg.encode()) > MAX_STATUS_MSG_BYTES:
            raise invalid_param(f"status_msg is at most {MAX_STATUS_MSG_BYTES} bytes")
        self._set_local(user_id, state, status_msg, SYNC_ONLINE_TIMEOUT_MS / 1000)

    def status(self, requester_id: str, user_id: str) -> dict:
        """GET /presence/{userId}/status: for the user, and users who share a room with it."""
        self._require_enabled()
        if not is_valid_user_id(user_id):
            raise invalid_param("Not a user ID")
        found = self.store.get(user_id)
        if found is not None and user_id != requester_id:
            if not self.store.shares_a_room(requester_id, user_id):
                found = None
        if found is None:
            raise not_found("No presence for this user is visible to you")
        return presence_event(found, now_ms())["content"]

    def syncing(self, user_id: str, set_presence: str | None, timeout_ms: int) -> None:
        """A /sync of `user_id` began, waiting up to `timeout_ms`: it is online (or
        unavailable) until SYNC_ONLINE_TIMEOUT_MS after that wait would end."""
        if not self.enabled or set_presence == "offline":
            return
        state = set_presence or "online"
        until_seconds = (min(timeout_ms, MAX_SYNC_WAIT_MS) + SYNC_ONLINE_TIMEOUT_MS) / 1000
        current = self._local.get(user_id) or self.store.get(user_id)
        if current is not None and (
            current.state == state or (set_presence is None and current.state != "offline")
        ):
            self._local[user_id] = current
            stored = self._keep_online(user_id, until_seconds)
            if stored:
                self.store.keep_online(user_id, stored)
            return
        status_msg = current.status_msg if current is not None else None
        self._set_local(user_id, state, status_msg, until_seconds)

    def _keep_online(self, user_id: str, for_s: float) -> int:
        """Keeps the user online for `for_s` from now. With several instances, the online
        time to store (in the same write as a change, if any), or 0 if what this instance
        stored covers it."""
        if not self._shared:
            until = self._clock() + for_s
            self._online_until[user_id] = max(self._online_until.get(user_id, 0.0), until)
            return 0
        until_ms = self._wall_ms() + int(for_s * 1000)
        if until_ms <= self._stored_until.get(user_id, 0):
            return 0
        self._stored_until[user_id] = until_ms + SHARED_ONLINE_AHEAD_MS
        return self._stored_until[user_id]

    def _not_online(self, user_id: str) -> None:
        self._online_until.pop(user_id, None)
        self._stored_until.pop(user_id, None)

    def forget(self, user_id: str) -> None:
        """Another instance changed the user's presence: read it again, store again."""
        self._local.pop(user_id, None)
        self._stored_until.pop(user_id, None)

    def _set_local(self, user_id: str, state: str, status_msg: str | None, for_s: float) -> None:
        now = now_ms()
        presence = Presence(user_id, state, status_msg, now, state == "online")
        stored = 0
        if state == "offline":
            self._not_online(user_id)
        else:
            stored = self._keep_online(user_id, for_s)
        if self._changed(presence, online_until_ms=stored):
            self._tell_servers(presence, now)
        elif stored:
            self.store.keep_online(user_id, stored)
        if state == "offline":
            self._local.pop(user_id, None)
        else:
            self._local[user_id] = presence

    def _tell_servers(self, presence: Presence, now: int) -> None:
        sharing = self._sharing(presence.user_id)
        servers = {server_of(u) for u in sharing} - {self.server_name}
        if not servers:
            return
        item = {"user_id": presence.user_id, **presence_event(presence, now)["content"]}
        self._send_edu(sorted(servers), "m.presence", {"push": [item]})

    # --- other servers' users -------------------------------------------------------------

    def receive_remote(self, origin: str, edus: list[dict]) -> tuple[int, int]:
        """The m.presence EDUs of a transaction from `origin`: each item of one of its
        users who shares a room with one of ours is applied. Returns (applied, dropped)."""
        applied = dropped = 0
        if not self.enabled:
            return applied, dropped
        looked_at = 0
        for edu in edus:
            if edu.get("edu_type") != "m.presence":
                continue
            content = edu.get("content")
            items = content.get("push") if isinstance(content, dict) else None
            if not isinstance(items, list):
                dropped += 1
                continue
            for item in items:
                looked_at += 1
                if looked_at > MAX_REMOTE_ITEMS or not self._apply_remote(origin, item):
                    dropped += 1
                else:
                    applied += 1
        return applied, dropped

    def _apply_remote(self, origin: str, item) -> bool:
        if not isinstance(item, dict):
            return False
        user_id, state = item.get("user_id"), item.get("presence")
        status_msg, ago = item.get("status_msg"), item.get("last_active_ago", 0)
        active = item.get("currently_active", False)
        if not (isinstance(user_id, str) and is_valid_user_id(user_id)):
            return False
        if server_of(user_id) != origin or state not in STATES:
            return False
        if status_msg is not None and (
            not isinstance(status_msg, str) or len(status_msg.encode()) > MAX_STATUS_MSG_BYTES
        ):
            return False
        if not isinstance(ago, int) or isinstance(ago, bool) or ago < 0:
            ago = 0
        sharing = self._sharing(user_id)
        if not any(server_of(u) == self.server_name for u in sharing):
            return False  # no user of ours shares a room with them
        presence = Presence(user_id, state, status_msg, now_ms() - ago, active is True)
        stored = 0
        if state == "offline":
            self._not_online(user_id)
        else:
            self._online_until.pop(user_id, None)  # from now, not the latest of the two
            stored = self._keep_online(user_id, REMOTE_TIMEOUT_MS / 1000)
        if not self._changed(presence, sharing, stored) and stored:
            self.store.keep_online(user_id, stored)
        return True

    # --- both -------------------------------------------------------------------------------

    def _changed(
        self, presence: Presence, sharing: set[str] | None = None, online_until_ms: int = 0
    ) -> bool:
        """Stores `presence` if a client would see a change, and wakes the syncs of those
        who share a room with its user; whether it changed."""
        if presence.same_as(self.store.get(presence.user_id)):
            return False
        self.store.put(presence, online_until_ms)
        self._notify_users(sharing if sharing is not None else self._sharing(presence.user_id))
        return True

    def sweep(self) -> int:
        """Everyone whose time ran out goes offline; returns how many did."""
        if self._shared:
            return self._sweep_stored()
        now = self._clock()
        gone = [user_id for user_id, until in self._online_until.items() if until <= now]
        for user_id in gone:
            del self._online_until[user_id]
            self._local.pop(user_id, None)
            current = self.store.get(user_id)
            status_msg = current.status_msg if current is not None else None
            last_active = current.last_active_ts if current is not None else now_ms()
            offline = Presence(user_id, "offline", status_msg, last_active, False)
            if self._changed(offline) and server_of(user_id) == self.server_name:
                self._tell_servers(offline, now_ms())
        return len(gone)

    def _sweep_stored(self) -> int:
        """Several instances: those whose stored online time ran out, whichever instance
        they synced through, each taken offline by one instance."""
        now = self._wall_ms()
        gone = 0
        for user_id in self.store.past_online(now, SWEEP_BATCH):
            offline = self.store.go_offline(user_id, now)
            if offline is None:
                continue
            gone += 1
            self._not_online(user_id)
            self._local.pop(user_id, None)
            self._notify_users(self._sharing(user_id))
            if server_of(user_id) == self.server_name:
                self._tell_servers(offline, now)
        return gone

    def _sweep_forever(self) -> None:
        while True:
            gevent.sleep(SWEEP_SECONDS)
            try:
                self.sweep()
            except Exception:
                log.exception("presence sweep")

    def _require_enabled(self) -> None:
        if not self.enabled:
            raise forbidden("Presence is disabled on this server")

    # --- /sync -------------------------------------------------------------------------------

    def sync_events(self, user_id: str, after: int, up_to: int) -> tuple[list[dict], int]:
        """The m.presence events a sync shows: of the users sharing a room with `user_id`
        (and its own) whose presence changed in (after, up_to], at most MAX_SYNC_EVENTS;
        and the position they reach, for the next token (the rest come next time)."""
        if not self.enabled or up_to <= after:
            return [], after
        found = self.store.visible_changes(user_id, after, up_to, MAX_SYNC_EVENTS)
        reached = found[-1].position if len(found) == MAX_SYNC_EVENTS else up_to
        now = now_ms()
        return [presence_event(p, now) for p in found], reached
