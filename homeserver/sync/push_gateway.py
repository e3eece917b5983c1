"""One notification to a push gateway (push gateway spec, `POST /_matrix/push/v1/notify`),
and what it is made of.

The call goes through `WebClient` (federation/web_client.py): the gateway's host resolved
here, every address through the `[push]` IP filter, the connection pinned to the allowed
address, all within the caller's one deadline. The answer is read up to `MAX_ANSWER_BYTES`.
"""

from __future__ import annotations

import json

from urllib3.exceptions import HTTPError, ProtocolError, ReadTimeoutError

from budget import OutboundDeadline
from homeserver.federation.errors import DestinationUnreachable, MalformedResponse, RemoteError
from homeserver.federation.transport import discard
from homeserver.federation.web_client import WebClient
from homeserver.storage.pushers import OwedAction, Pusher, RoomLabels

NOTIFY_PATH = "/_matrix/push/v1/notify"
EVENT_ID_ONLY = "event_id_only"
# A gateway's answer is `{"rejected": [pushkey, ...]}`: a few keys, never megabytes.
MAX_ANSWER_BYTES = 64 * 1024


def tweaks(actions: list) -> dict:
    """The `set_tweak` actions as the gateway's `tweaks` object."""
    found = {}
    for action in actions:
        if isinstance(action, dict) and isinstance(action.get("set_tweak"), str):
            found[action["set_tweak"]] = action.get("value", True)
    return found


def device(pusher: Pusher, actions: list) -> dict:
    """The pusher as the gateway's `devices` entry: its data minus the URL, which is ours."""
    return {
        "app_id": pusher.app_id,
        "pushkey": pusher.pushkey,
        "pushkey_ts": pusher.pushkey_ts // 1000,  # seconds, as the spec says
        "data": {k: v for k, v in pusher.data.items() if k != "url"},
        "tweaks": tweaks(actions),
    }


def notification(
    pusher: Pusher, owed: OwedAction, counts: tuple[int, int], labels: RoomLabels | None
) -> dict:
    """The body of one notify. `event_id_only` (labels None) gives the IDs, the counts and
    the priority alone: the app fetches the event itself."""
    event = owed.event
    body: dict = {
        "event_id": owed.event_id,
        "room_id": owed.room_id,
        "counts": {"unread": counts[0], "missed_calls": counts[1]},
        "prio": "high" if owed.highlight else "low",
        "devices": [device(pusher, owed.actions)],
    }
    if labels is None:
        return {"notification": body}
    body["type"] = event.get("type")
    body["sender"] = event.get("sender")
    if "content" in event:
        body["content"] = event["content"]
    if event.get("type") == "m.room.member":
        body["user_is_target"] = event.get("state_key") == pusher.user_id
        body["membership"] = event.get("content", {}).get("membership")
    for field, value in (
        ("sender_display_name", labels.sender_display_name),
        ("room_name", labels.room_name),
        ("room_alias", labels.room_alias),
    ):
        if value is not None:
            body[field] = value
    return {"notification": body}


class PushGateway:
    def __init__(self, client: WebClient):
        self.client = client

    def notify(self, url: str, body: dict, deadline: OutboundDeadline) -> list[str]:
        """POSTs `body` to the gateway; returns the pushkeys it rejected. Raises
        `DestinationUnreachable`, `RemoteError` (an HTTP error status), `MalformedResponse`,
        and the deadline's `DeadlineExceeded`."""
        data = json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        with deadline:
            response, pool = self.client.request("POST", url, deadline, headers, data)
            try:
                return self._answer(url, response, deadline)
            finally:
                discard(response)
                pool.close()

    def _answer(self, url: str, response, deadline: OutboundDeadline) -> list[str]:
        if response.status // 100 != 2:
            raise RemoteError(url, response.status)
        try:
            text = response.read(MAX_ANSWER_BYTES + 1, decode_content=False)
        except ReadTimeoutError:
            deadline.check(0.05)
            raise DestinationUnreachable(url, "read timed out") from None
        except (ProtocolError, HTTPError, OSError) as e:
            raise DestinationUnreachable(url, f"connection failed: {e}") from None
        if len(text) > MAX_ANSWER_BYTES:
            raise MalformedResponse(url, "answer too large")
        try:
            answer = json.loads(text) if text.strip() else {}
        except ValueError:
            raise MalformedResponse(url, "answer is not JSON") from None
        rejected = answer.get("rejected") if isinstance(answer, dict) else None
        return [k for k in rejected if isinstance(k, str)] if isinstance(rejected, list) else []
