"""Server-side search over the client-server API: `POST /search`, room events only
(rooms/search.py)."""

from __future__ import annotations

from flask import Blueprint
from marshmallow import Schema, fields, validate

from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import runtime
from homeserver.core.errors import invalid_param
from homeserver.http.parsing import json_object, query_str
from homeserver.http.parsing import validate as validate_body
from homeserver.http.responses import json_response
from homeserver.rooms.search import MAX_CONTEXT, Context, SearchRequest
from homeserver.storage.event_rows import SEARCHED_KEYS
from homeserver.sync.filters import parse_room_event_filter

bp = Blueprint("search", __name__, url_prefix="/_matrix/client/v3")

MAX_SEARCH_BYTES = 64 * 1024
_CATEGORIES = {"room_events"}
_CONTEXT_DEFAULT = 5  # the spec's default for before_limit and after_limit
_KEYS = tuple(SEARCHED_KEYS.values())


class _ContextBody(Schema):
    before_limit = fields.Integer(load_default=_CONTEXT_DEFAULT, validate=validate.Range(0))
    after_limit = fields.Integer(load_default=_CONTEXT_DEFAULT, validate=validate.Range(0))
    include_profile = fields.Boolean(load_default=False)


class _GroupBody(Schema):
    key = fields.String(required=True, validate=validate.OneOf(["room_id", "sender"]))


class _GroupingsBody(Schema):
    group_by = fields.List(fields.Nested(_GroupBody), load_default=list)


class _RoomEventsBody(Schema):
    search_term = fields.String(required=True)
    keys = fields.List(fields.String(validate=validate.OneOf(_KEYS)), load_default=_KEYS)
    filter = fields.Dict()
    order_by = fields.String(load_default="rank", validate=validate.OneOf(["rank", "recent"]))
    event_context = fields.Nested(_ContextBody)
    include_state = fields.Boolean(load_default=False)
    groupings = fields.Nested(_GroupingsBody)


class _CategoriesBody(Schema):
    room_events = fields.Nested(_RoomEventsBody)


class _SearchBody(Schema):
    search_categories = fields.Nested(_CategoriesBody, required=True)


def _request(room_events: dict) -> SearchRequest:
    event_filter = parse_room_event_filter(room_events.get("filter", {}))
    context = room_events.get("event_context")
    groupings = room_events.get("groupings") or {"group_by": []}
    return SearchRequest(
        term=room_events["search_term"],
        keys=tuple(dict.fromkeys(room_events["keys"])),
        event_filter=event_filter,
        rooms=event_filter.rooms,
        not_rooms=event_filter.not_rooms,
        recent=room_events["order_by"] == "recent",
        context=None
        if context is None
        else Context(
            min(context["before_limit"], MAX_CONTEXT),
            min(context["after_limit"], MAX_CONTEXT),
            context["include_profile"],
        ),
        include_state=room_events["include_state"],
        group_by=tuple(dict.fromkeys(g["key"] for g in groupings["group_by"])),
        next_batch=query_str("next_batch"),
    )


@bp.post("/search")
@requires_auth
def search():
    raw = json_object(MAX_SEARCH_BYTES)
    categories = raw.get("search_categories")
    if isinstance(categories, dict) and categories.keys() - _CATEGORIES:
        unknown = sorted(categories.keys() - _CATEGORIES)[0]
        raise invalid_param(f"Unknown search category: {unknown}")
    body = validate_body(_SearchBody(), raw)
    room_events = body["search_categories"].get("room_events")
    if room_events is None:
        return json_response({"search_categories": {}})
    return json_response(runtime().room_search.search(current_requester(), _request(room_events)))
