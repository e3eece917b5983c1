"""A user's push rules (client-server spec, "Push Rules"): the server defaults
(push_rules.py) merged with what the user made or changed, and the changes themselves.

Order within a kind, as Synapse serves it: `.m.rule.master` first, then the user's rules
(their own order), then the other defaults. Rule IDs starting with "." are the server's: a
user may enable, disable and change the actions of those, never create or delete them. A
change is stored, forgets the user's compiled rules (push_eval.py), and is set as the
user's `m.push_rules` account data, so their /sync hears of it."""

from __future__ import annotations

from homeserver.core.concurrency import KeyedLocks, in_turns
from homeserver.core.errors import invalid_param, not_found
from homeserver.storage.push import PushStore, UserRule, UserRules
from homeserver.sync.account_data import AccountDataService
from homeserver.sync.push_eval import SELF, CompiledRules, compile_rules, defaults_template
from homeserver.sync.push_rules import KINDS, default_ruleset

PUSH_RULES_TYPE = "m.push_rules"
_ACTIONS = frozenset({"notify", "dont_notify", "coalesce"})
# Compiled rules kept (one entry per user); past it the cache starts again.
MAX_CACHED_USERS = 100_000
# Users' rules compiled between two pauses for the hub (about 5 ms of work).
COMPILED_PER_PAUSE = 50


def merged_ruleset(user_id: str, own: UserRules) -> dict:
    """{kind: [rule, ...]} as clients read it."""
    ruleset = default_ruleset(user_id)
    changed = own.defaults or {}
    for kind, rules in ruleset.items():
        for rule in rules:
            enabled, actions = changed.get((kind, rule["rule_id"]), (None, None))
            if enabled is not None:
                rule["enabled"] = enabled
            if actions is not None:
                rule["actions"] = actions
    for kind in KINDS:
        mine = [_client_rule(r) for r in own.rules if r.kind == kind]
        defaults = ruleset[kind]
        master = [r for r in defaults if r["rule_id"] == ".m.rule.master"]
        rest = [r for r in defaults if r["rule_id"] != ".m.rule.master"]
        ruleset[kind] = master + mine + rest
    return ruleset


def _client_rule(rule: UserRule) -> dict:
    out: dict = {
        "rule_id": rule.rule_id,
        "default": False,
        "enabled": rule.enabled,
        "actions": rule.actions,
    }
    if rule.conditions is not None:
        out["conditions"] = rule.conditions
    if rule.pattern is not None:
        out["pattern"] = rule.pattern
    return out


def check_actions(actions) -> list:
    """The spec's actions: "notify" and tweaks; "dont_notify" and "coalesce" are old
    no-ops still accepted."""
    if not isinstance(actions, list):
        raise invalid_param("actions must be a list")
    for action in actions:
        if isinstance(action, str) and action in _ACTIONS:
            continue
        if isinstance(action, dict) and isinstance(action.get("set_tweak"), str):
            continue
        raise invalid_param(f"Unknown action: {action!r}")
    return actions


def _check_conditions(conditions) -> list:
    if not isinstance(conditions, list):
        raise invalid_param("conditions must be a list")
    for condition in conditions:
        if not isinstance(condition, dict) or not isinstance(condition.get("kind"), str):
            raise invalid_param("Each condition must be an object with a kind")
        kind = condition["kind"]
        if kind == "event_match" and not (
            isinstance(condition.get("key"), str) and isinstance(condition.get("pattern"), str)
        ):
            raise invalid_param("event_match takes a key and a pattern")
        if kind in ("event_property_is", "event_property_contains") and not (
            isinstance(condition.get("key"), str) and "value" in condition
        ):
            raise invalid_param(f"{kind} takes a key and a value")
    return conditions


def parse_rule(kind: str, rule_id: str, body: dict) -> UserRule:
    """A new user rule from a PUT's body (400 M_INVALID_PARAM when it is no rule)."""
    if rule_id.startswith("."):
        raise invalid_param("Rule IDs starting with '.' are the server's")
    if not rule_id or "/" in rule_id or "\\" in rule_id:
        raise invalid_param("A rule ID may not be empty or hold '/' or '\\'")
    actions = check_actions(body.get("actions"))
    conditions = pattern = None
    if kind in ("override", "underride"):
        conditions = _check_conditions(body.get("conditions", []))
    elif kind == "content":
        pattern = body.get("pattern")
        if not isinstance(pattern, str):
            raise invalid_param("A content rule needs a pattern")
    return UserRule(kind, rule_id, conditions, pattern, actions, True)


class PushRules:
    def __init__(self, store: PushStore, account_data: AccountDataService):
        self.store = store
        self.account_data = account_data
        self._compiled: dict[str, CompiledRules] = {}
        self._defaults = defaults_template(default_ruleset(SELF))
        # One change of a user's rules at a time: placing a rule rewrites its kind's order,
        # which two writes at once on PostgreSQL could each make without the other.
        self._locks = KeyedLocks()

    # --- reads --------------------------------------------------------------------------

    def ruleset(self, user_id: str) -> dict:
        return merged_ruleset(user_id, self.store.rules_of([user_id]).get(user_id, UserRules()))

    def rule(self, user_id: str, scope: str, kind: str, rule_id: str) -> dict:
        if scope != "global" or kind not in KINDS:
            raise not_found("Unknown push rule scope or kind")
        for rule in self.ruleset(user_id)[kind]:
            if rule["rule_id"] == rule_id:
                return rule
        raise not_found("No such push rule")

    def compiled(self, user_ids: list[str]) -> dict[str, CompiledRules]:
        """Each user's rules, compiled, from the cache or one read for those missing."""
        missing = [u for u in user_ids if u not in self._compiled]
        if missing:
            if len(self._compiled) + len(missing) > MAX_CACHED_USERS:
                self._compiled.clear()
            own = self.store.rules_of(missing)
            # A big room's first message compiles thousands: the hub gets its turns.
            for user_id in in_turns(missing, COMPILED_PER_PAUSE):
                if user_id not in own:  # one object for all: a big room's cache stays small
                    self._compiled[user_id] = self._defaults
                    continue
                ruleset = merged_ruleset(user_id, own[user_id])
                self._compiled[user_id] = compile_rules(user_id, ruleset)
        return {u: self._compiled[u] for u in user_ids}

    # --- changes ------------------------------------------------------------------------

    def put(
        self,
        user_id: str,
        kind: str,
        rule_id: str,
        body: dict,
        before: str | None,
        after: str | None,
    ) -> None:
        if kind not in KINDS:
            raise not_found("Unknown push rule kind")
        rule = parse_rule(kind, rule_id, body)
        for anchor in (before, after):
            if anchor is not None and anchor.startswith("."):
                raise invalid_param("Rules cannot be placed relative to a server default rule")
        with self._locks.hold(user_id):
            placed = self.store.put_rule(user_id, rule, before, after)
        if not placed:
            raise invalid_param(f"No rule {before or after} of kind {kind} to place it by")
        self._changed(user_id)

    def delete(self, user_id: str, scope: str, kind: str, rule_id: str) -> None:
        if scope != "global" or kind not in KINDS:
            raise not_found("Unknown push rule scope or kind")
        if rule_id.startswith("."):
            self.rule(user_id, scope, kind, rule_id)  # 404 for an unknown one
            raise invalid_param("Server default rules cannot be deleted")
        if not self.store.delete_rule(user_id, kind, rule_id):
            raise not_found("No such push rule")
        self._changed(user_id)

    def set_field(
        self, user_id: str, scope: str, kind: str, rule_id: str, field: str, value
    ) -> None:
        """`enabled` (a boolean) or `actions` of a user's rule or of a default."""
        self.rule(user_id, scope, kind, rule_id)  # 404 for an unknown one
        if field == "enabled" and not isinstance(value, bool):
            raise invalid_param("enabled must be a boolean")
        if field == "actions":
            check_actions(value)
        if rule_id.startswith("."):
            self.store.set_default_field(user_id, kind, rule_id, field, value)
        elif not self.store.set_rule_field(user_id, kind, rule_id, field, value):
            raise not_found("No such push rule")
        self._changed(user_id)

    def forget(self, user_id: str) -> None:
        """Another instance may have changed the user's rules (its account data moved)."""
        self._compiled.pop(user_id, None)

    def _changed(self, user_id: str) -> None:
        self._compiled.pop(user_id, None)
        self.account_data.set(user_id, "", PUSH_RULES_TYPE, {"global": self.ruleset(user_id)})
