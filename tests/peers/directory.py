"""A remote room directory for an :class:`HonestPeer`: public rooms and aliases.

    rooms = serve_directory(peer, rooms=[room("!a:peer.test", "Alpha", 5), ...],
                            aliases={"#lobby:peer.test": "!a:peer.test"})

`GET` and `POST /_matrix/federation/v1/publicRooms` page through ``rooms`` (largest first)
with ``since`` tokens ``"o<offset>"``; `POST` applies ``generic_search_term`` and
``room_types`` unless ``post_filtering=False``, in which case POST answers 404
M_UNRECOGNIZED as a server without filtering support would. `query/directory` resolves
``aliases`` and answers 404 M_NOT_FOUND otherwise.
"""

from __future__ import annotations

from urllib.parse import parse_qs

PUBLIC_ROOMS = "/_matrix/federation/v1/publicRooms"
QUERY_DIRECTORY = "/_matrix/federation/v1/query/directory"


def room(
    room_id: str, name: str, members: int, topic: str | None = None, room_type: str | None = None
) -> dict:
    entry = {
        "room_id": room_id,
        "name": name,
        "num_joined_members": members,
        "world_readable": False,
        "guest_can_join": False,
        "join_rule": "public",
    }
    if topic is not None:
        entry["topic"] = topic
    if room_type is not None:
        entry["room_type"] = room_type
    return entry


def _page(rooms: list[dict], limit, since) -> dict:
    ordered = sorted(rooms, key=lambda r: (-r["num_joined_members"], r["room_id"]))
    offset = int(since[1:]) if since else 0
    limit = int(limit) if limit else len(ordered)
    chunk = ordered[offset : offset + limit]
    body = {"chunk": chunk, "total_room_count_estimate": len(ordered)}
    if offset + limit < len(ordered):
        body["next_batch"] = f"o{offset + limit}"
    if offset > 0:
        body["prev_batch"] = f"o{max(0, offset - limit)}"
    return body


def _matches(entry: dict, room_filter: dict) -> bool:
    term = (room_filter.get("generic_search_term") or "").casefold()
    if term and not any(
        term in (entry.get(k) or "").casefold() for k in ("name", "topic", "canonical_alias")
    ):
        return False
    types = room_filter.get("room_types")
    return types is None or entry.get("room_type") in types


def serve_directory(
    peer, rooms: list[dict], aliases: dict | None = None, post_filtering: bool = True
) -> list[dict]:
    aliases = aliases or {}

    def get_rooms(req):
        query = {k: v[0] for k, v in parse_qs(req.query).items()}
        return 200, _page(rooms, query.get("limit"), query.get("since"))

    def post_rooms(req):
        if not post_filtering:
            return 404, {"errcode": "M_UNRECOGNIZED", "error": "Unrecognized request"}
        body = req.json() or {}
        matching = [r for r in rooms if _matches(r, body.get("filter") or {})]
        return 200, _page(matching, body.get("limit"), body.get("since"))

    def query_directory(req):
        alias = parse_qs(req.query).get("room_alias", [""])[0]
        if alias not in aliases:
            return 404, {"errcode": "M_NOT_FOUND", "error": "Room alias not found"}
        return 200, {"room_id": aliases[alias], "servers": [peer.server_name]}

    peer.route("GET", PUBLIC_ROOMS, get_rooms)
    peer.route("POST", PUBLIC_ROOMS, post_rooms)
    peer.route("GET", QUERY_DIRECTORY, query_directory)
    return rooms
