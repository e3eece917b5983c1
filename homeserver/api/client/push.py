"""Push rules (client-server spec, "Push Rules: API") and `GET /notifications`: the
rules are sync/push_ruleset.py's, the notifications sync/notifications.py's."""

from __future__ import annotations

from flask import Blueprint

from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import runtime
from homeserver.core.errors import invalid_param
from homeserver.http.parsing import json_object, query_int, query_str
from homeserver.http.responses import json_response
from homeserver.sync.notifications import DEFAULT_LIMIT

bp = Blueprint("push", __name__, url_prefix="/_matrix/client/v3")

MAX_RULE_BYTES = 64 * 1024
_FIELDS = ("enabled", "actions")


def _split(rule_id: str) -> tuple[str, str | None]:
    """(the rule ID, "enabled" or "actions" when the path names one of its fields)."""
    for field in _FIELDS:
        if rule_id.endswith("/" + field):
            return rule_id[: -len(field) - 1], field
    return rule_id, None


@bp.get("/pushrules/")
@requires_auth
def push_rules():
    return json_response({"global": runtime().push_rules.ruleset(current_requester().user_id)})


@bp.get("/pushrules/global/")
@requires_auth
def global_push_rules():
    return json_response(runtime().push_rules.ruleset(current_requester().user_id))


@bp.get("/pushrules/<scope>/<kind>/<path:rule_id>")
@requires_auth
def push_rule(scope: str, kind: str, rule_id: str):
    rule_id, field = _split(rule_id)
    rule = runtime().push_rules.rule(current_requester().user_id, scope, kind, rule_id)
    return json_response({field: rule[field]} if field else rule)


@bp.put("/pushrules/<scope>/<kind>/<path:rule_id>")
@requires_auth
def put_push_rule(scope: str, kind: str, rule_id: str):
    rule_id, field = _split(rule_id)
    body = json_object(max_bytes=MAX_RULE_BYTES)
    rules, user_id = runtime().push_rules, current_requester().user_id
    if field is not None:
        if field not in body:
            raise invalid_param(f"Missing {field}")
        rules.set_field(user_id, scope, kind, rule_id, field, body[field])
    elif scope != "global":
        rules.rule(user_id, scope, kind, rule_id)  # 404: only the global scope exists
    else:
        rules.put(user_id, kind, rule_id, body, query_str("before"), query_str("after"))
    return json_response({})


@bp.delete("/pushrules/<scope>/<kind>/<path:rule_id>")
@requires_auth
def delete_push_rule(scope: str, kind: str, rule_id: str):
    runtime().push_rules.delete(current_requester().user_id, scope, kind, rule_id)
    return json_response({})


@bp.get("/notifications")
@requires_auth
def notifications():
    limit = query_int("limit", DEFAULT_LIMIT, minimum=0)
    found = runtime().sync.notifications
    assert found is not None, "the runtime's sync keeps unread counts"
    page = found.page(current_requester().user_id, query_str("from"), limit, query_str("only"))
    return json_response(page)
