"""Numbered schema migrations, applied in order at start.

Each file in `schema/` is `NNNN_name.sql`, written once in the SQL both engines share. Two
placeholders cover where they differ: `{serial}` (an auto-increment primary key) and `{blob}`.
Where the engines differ more (full-text search), a migration is a pair of files,
`NNNN_name.sqlite.sql` and `NNNN_name.postgres.sql`, and each engine runs its own.
A migration is never edited after it has landed; a change is a new file. What SQL alone
cannot write (rewriting stored data) is a step in `schema_steps.py`, run after the file of
its number in the same transaction.
"""

from __future__ import annotations

import logging
import os
import re

from homeserver.storage.database import Database
from homeserver.storage.schema_steps import STEPS

log = logging.getLogger(__name__)

SCHEMA_DIR = os.path.join(os.path.dirname(__file__), "schema")

_DIALECT_WORDS = {
    "sqlite": {"serial": "INTEGER PRIMARY KEY AUTOINCREMENT", "blob": "BLOB"},
    "postgres": {"serial": "BIGSERIAL PRIMARY KEY", "blob": "BYTEA"},
}


def available_migrations() -> list[tuple[int, str, str]]:
    """(version, name, path) for every schema file, in order."""
    files = set()
    for name in os.listdir(SCHEMA_DIR):
        m = re.fullmatch(r"(\d{4})_(\w+?)(\.sqlite|\.postgres)?\.sql", name)
        if m:
            # An engine's own file: the path keeps `{dialect}` for migrate to fill in.
            file = f"{m.group(1)}_{m.group(2)}{'.{dialect}' if m.group(3) else ''}.sql"
            files.add((int(m.group(1)), m.group(2), os.path.join(SCHEMA_DIR, file)))
    found = sorted(files)
    versions = [v for v, _, _ in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"duplicate migration numbers in {SCHEMA_DIR}")
    return found


def _statements(path: str, dialect: str) -> list[str]:
    with open(path.replace("{dialect}", dialect)) as f:
        text = f.read().format(**_DIALECT_WORDS[dialect])
    text = re.sub(r"--[^\n]*", "", text)
    return [s.strip() for s in text.split(";") if s.strip()]


def _one_at_a_time(tx) -> None:
    """Instances starting together on one PostgreSQL would each apply a migration the
    other is applying: each transaction here waits for the others' commits first."""
    if tx.dialect == "postgres":
        tx.execute("SELECT pg_advisory_xact_lock(hashtext('weir schema migrations'))")


def migrate(db: Database, until: int | None = None) -> int:
    """Applies every migration not yet applied (up to `until`, for a test that needs an
    older schema); returns the schema version."""

    def current(tx) -> set[int]:
        _one_at_a_time(tx)
        tx.execute(
            "CREATE TABLE IF NOT EXISTS schema_version ("
            " version INTEGER PRIMARY KEY, name TEXT NOT NULL)"
        )
        return {row[0] for row in tx.fetchall("SELECT version FROM schema_version")}

    applied = db.write(current)
    version = max(applied, default=0)
    for number, name, path in available_migrations():
        if number in applied or (until is not None and number > until):
            continue

        statements = _statements(path, db.dialect)
        step = STEPS.get(number)

        def apply(tx) -> bool:
            _one_at_a_time(tx)
            if tx.fetchone("SELECT 1 FROM schema_version WHERE version = ?", (number,)):
                return False  # another instance applied it meanwhile
            for sql in statements:
                tx.execute(sql)
            if step is not None:
                step(tx)
            tx.execute("INSERT INTO schema_version (version, name) VALUES (?, ?)", (number, name))
            return True

        if db.write(apply):
            log.info("applied schema migration %04d_%s", number, name)
        version = number
    return version
