"""Migration steps SQL alone cannot write, by schema number: each runs after its numbered
file in `schema/`, in the same transaction (storage/migrations.py). Like the SQL files, a
step is never edited after it has landed, so it imports nothing from the live storage code.
"""

from __future__ import annotations

import json
from typing import Callable

# 0026: the chain length the live code keeps (event_state.MAX_CHAIN when this was written).
_MAX_CHAIN_0026 = 100


def _state_groups_to_deltas(tx) -> None:
    """Rewrites each state group stored as a whole JSON map as a delta on the room's group
    before it (by number), starting a new whole group every 100; then drops the maps."""
    rooms = [r[0] for r in tx.fetchall("SELECT DISTINCT room_id FROM state_groups")]
    for room_id in rooms:
        groups = [
            r[0]
            for r in tx.fetchall(
                "SELECT state_group FROM state_groups WHERE room_id = ? ORDER BY state_group",
                (room_id,),
            )
        ]
        previous: tuple[int, dict] | None = None
        length = 0
        for group in groups:  # one map in memory at a time: old rooms hold many large ones
            text = tx.fetchone("SELECT state FROM state_groups WHERE state_group = ?", (group,))[0]
            state = {}
            for key, event_id in json.loads(text).items():
                event_type, _, state_key = key.partition("\u0000")
                state[(event_type, state_key)] = event_id
            if previous is not None and length < _MAX_CHAIN_0026:
                base, base_state = previous
                length += 1
                delta: dict = {k: v for k, v in state.items() if base_state.get(k) != v}
                delta.update({k: None for k in base_state.keys() - state.keys()})
            else:
                base, length, delta = None, 0, state
            tx.execute(
                "UPDATE state_groups SET prev_state_group = ?, chain_length = ?"
                " WHERE state_group = ?",
                (base, length, group),
            )
            tx.executemany(
                "INSERT INTO state_group_entries (state_group, type, state_key, event_id)"
                " VALUES (?, ?, ?, ?)",
                [(group, t, k, e) for (t, k), e in delta.items()],
            )
            previous = (group, state)
    tx.execute("ALTER TABLE state_groups DROP COLUMN state")


STEPS: dict[int, Callable] = {26: _state_groups_to_deltas}
