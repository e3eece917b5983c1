"""Push rule evaluation (client-server spec, "Push Rules": conditions and actions).

A user's merged ruleset is compiled once (`compile_rules`, cached by push_ruleset.py) into
tuples in priority order, disabled rules left out. An event's facts (`EventFacts`) are read
once for all the users it is evaluated for, and each condition's outcome is kept by the
condition: most conditions (a type, a msgtype, @room, the member count) are the same tuple
for every user, so a room of thousands costs a few dict lookups a user. Only the display
name and the user's own ID differ per user, and text is searched for a literal before any
regular expression runs.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace

from homeserver.sync.push_rules import KINDS

NEVER = ("never",)
DISPLAY_NAME = ("display_name",)
# The user the shared defaults are compiled for (`defaults_template`): a condition naming
# them becomes ("self", condition), its value filled in with each user's own.
SELF = "@\x00:\x00"
SELF_LOCALPART = "\x00"
_COUNT = re.compile(r"(==|<=|>=|<|>)?([0-9]+)")
_GLOB_CHARS = frozenset("*?[")
# Mentions by name or @room in the body: skipped for an event with `m.mentions` (the spec,
# "Predefined rules": deprecated since v1.7 for such events), as Synapse skips them.
LEGACY_MENTION_RULES = frozenset(
    {".m.rule.contains_display_name", ".m.rule.contains_user_name", ".m.rule.roomnotif"}
)
# The notification level a condition's key needs when power levels do not name it.
DEFAULT_NOTIFICATION_LEVEL = 50


@dataclass(frozen=True)
class Rule:
    rule_id: str
    conditions: tuple
    actions: list
    notify: bool
    highlight: bool
    legacy_mention: bool = False


@dataclass(frozen=True)
class CompiledRules:
    rules: tuple[Rule, ...]


def split_key(key: str) -> tuple[str, ...]:
    """A dotted key's path, `\\.` being a dot within a name and `\\\\` a backslash."""
    parts, current, escaped = [], [], False
    for ch in key:
        if escaped:
            current.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ".":
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return tuple(parts)


def _typed(value) -> tuple | None:
    """A condition's value, hashable and telling types apart (True is not 1); None for
    values the spec's property conditions do not take (objects and arrays)."""
    if value is None or isinstance(value, (str, bool, int)):
        return (type(value).__name__, value)
    return None


def compile_condition(condition: dict) -> tuple:
    kind = condition.get("kind")
    if kind == "event_match":
        key, pattern = condition.get("key"), condition.get("pattern")
        if isinstance(key, str) and isinstance(pattern, str):
            return ("match", split_key(key), pattern.lower(), key == "content.body")
    elif kind in ("event_property_is", "event_property_contains"):
        key, value = condition.get("key"), _typed(condition.get("value"))
        if isinstance(key, str) and value is not None:
            return ("is" if kind == "event_property_is" else "contains", split_key(key), value)
    elif kind == "contains_display_name":
        return DISPLAY_NAME
    elif kind == "room_member_count":
        found = _COUNT.fullmatch(str(condition.get("is", "")))
        if found:
            return ("count", found.group(1) or "==", int(found.group(2)))
    elif kind == "sender_notification_permission":
        if isinstance(condition.get("key"), str):
            return ("permission", condition["key"])
    return NEVER  # the spec: a condition not understood never matches


def _highlights(actions: list) -> bool:
    return any(
        isinstance(a, dict) and a.get("set_tweak") == "highlight" and a.get("value", True)
        for a in actions
    )


def compile_rules(user_id: str, ruleset: dict) -> CompiledRules:
    """The merged ruleset's enabled rules, in the order they are tried."""
    rules = []
    for kind in KINDS:
        for rule in ruleset.get(kind, ()):
            if not rule.get("enabled", True):
                continue
            if kind == "content":
                pattern = rule.get("pattern")
                conditions: tuple = (
                    (("match", ("content", "body"), pattern.lower(), True),)
                    if isinstance(pattern, str)
                    else (NEVER,)
                )
            elif kind == "room":
                conditions = (("is", ("room_id",), ("str", rule["rule_id"])),)
            elif kind == "sender":
                conditions = (("is", ("sender",), ("str", rule["rule_id"])),)
            else:
                conditions = tuple(compile_condition(c) for c in rule.get("conditions", ()))
            actions = rule.get("actions", [])
            rule_id = rule["rule_id"]
            notify, highlight = "notify" in actions, _highlights(actions)
            legacy = rule_id in LEGACY_MENTION_RULES
            rules.append(Rule(rule_id, conditions, actions, notify, highlight, legacy))
    return CompiledRules(tuple(rules))


@functools.lru_cache(maxsize=4096)
def _glob(pattern: str, words: bool) -> re.Pattern:
    parts = []
    for ch in pattern:
        parts.append(".*?" if ch == "*" else "." if ch == "?" else re.escape(ch))
    body = "".join(parts)
    if words:
        return re.compile(rf"(?:^|\W){body}(?:\W|$)", re.IGNORECASE | re.DOTALL)
    return re.compile(rf"{body}\Z", re.IGNORECASE | re.DOTALL)


_MISSING = object()


class EventFacts:
    """One event, as every user's rules read it; `memo` keeps each condition's outcome."""

    __slots__ = (
        "pdu",
        "member_count",
        "sender_level",
        "levels",
        "memo",
        "mentions",
        "_body",
        "_names",
    )

    def __init__(self, pdu: dict, member_count: int, sender_level: int, levels: dict):
        self.pdu = pdu
        self.member_count = member_count
        self.sender_level = sender_level
        self.levels = levels  # the power levels' `notifications`
        self.memo: dict = {}
        content = pdu.get("content", {})
        self.mentions = "m.mentions" in content  # the sender said whom it mentions
        body = content.get("body")
        self._body = body.lower() if isinstance(body, str) else None
        self._names: dict = {}

    def value(self, path: tuple):
        found = self.pdu
        for name in path:
            if not isinstance(found, dict):
                return _MISSING
            found = found.get(name, _MISSING)
            if found is _MISSING:
                return _MISSING
        return found

    def check(self, condition: tuple) -> bool:
        kind = condition[0]
        if kind == "match":
            return self._match(condition[1], condition[2], condition[3])
        if kind == "is":
            return _typed(self.value(condition[1])) == condition[2]
        if kind == "contains":
            found = self.value(condition[1])
            return isinstance(found, list) and any(_typed(v) == condition[2] for v in found)
        if kind == "count":
            return _compare(self.member_count, condition[1], condition[2])
        if kind == "permission":
            level = self.levels.get(condition[1], DEFAULT_NOTIFICATION_LEVEL)
            return isinstance(level, int) and self.sender_level >= level
        return False

    def _match(self, path: tuple, pattern: str, words: bool) -> bool:
        found = self._body if words else self.value(path)
        if not isinstance(found, str):
            return False
        if words:
            if _GLOB_CHARS.isdisjoint(pattern) and pattern not in found:
                return False  # no literal, no word: the regex need not run
            return _glob(pattern, True).search(found) is not None
        if _GLOB_CHARS.isdisjoint(pattern):
            return found.lower() == pattern
        return _glob(pattern, False).match(found) is not None

    def mentions_name(self, name: str | None) -> bool:
        """contains_display_name: the name as a word of the body, in any case."""
        if not name or self._body is None:
            return False
        found = self._names.get(name)
        if found is None:
            lowered = name.lower()
            found = lowered in self._body and (
                re.search(rf"(?:^|\W){re.escape(lowered)}(?:\W|$)", self._body) is not None
            )
            self._names[name] = found
        return found


def _compare(count: int, op: str, n: int) -> bool:
    if op == "==":
        return count == n
    if op == "<":
        return count < n
    if op == ">":
        return count > n
    if op == "<=":
        return count <= n
    return count >= n


def first_match(
    rules: CompiledRules, facts: EventFacts, user_id: str, display_name: str | None
) -> Rule | None:
    """The first of the user's rules whose conditions all hold."""
    memo, mentions = facts.memo, facts.mentions
    for rule in rules.rules:
        if mentions and rule.legacy_mention:
            continue
        for condition in rule.conditions:
            holds: bool | None
            if condition is DISPLAY_NAME:
                holds = facts.mentions_name(display_name)
            elif condition[0] == "self":
                condition = _personal(condition[1], user_id)
                holds = memo.get(condition)
                if holds is None:
                    holds = memo[condition] = facts.check(condition)
            else:
                holds = memo.get(condition)
                if holds is None:
                    holds = memo[condition] = facts.check(condition)
            if not holds:
                break
        else:
            return rule
    return None


def _fill(value, user_id: str):
    if value == SELF:
        return user_id
    if value == SELF_LOCALPART:
        return user_id[1:].split(":", 1)[0].lower()
    if isinstance(value, tuple):
        return tuple(_fill(v, user_id) for v in value)
    return value


def _personal(condition: tuple, user_id: str) -> tuple:
    """A condition of the shared defaults, with the user's own ID or localpart in it
    (lowered in a pattern, as compile_condition lowers patterns)."""
    value = user_id.lower() if condition[0] == "match" else user_id
    return tuple(_fill(part, value) for part in condition)


def _names_self(condition: tuple) -> bool:
    return any(
        part in (SELF, SELF_LOCALPART) or (isinstance(part, tuple) and _names_self(part))
        for part in condition
    )


def defaults_template(ruleset: dict) -> CompiledRules:
    """The server defaults compiled once for every user who changed none of them:
    `ruleset` is the defaults of the user `SELF`."""
    compiled = compile_rules(SELF, ruleset)
    return CompiledRules(
        tuple(
            replace(
                rule,
                conditions=tuple(
                    ("self", c) if c is not DISPLAY_NAME and _names_self(c) else c
                    for c in rule.conditions
                ),
            )
            for rule in compiled.rules
        )
    )
