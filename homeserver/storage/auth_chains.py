"""The auth chain index (0028_auth_chain_index.sql): which events are in one state set's auth
chain and not in another's, read as integers, without loading or walking events.

A room's auth graph (its state events, each pointing at its auth_events) is covered by
chains. An event extends the chain of one of its auth events when that event is the chain's
head, and otherwise starts a chain of its own; so on a chain, every event has all those
below it in its auth chain. A link from an event to each of its auth events on other chains
completes the graph. The auth chain of a set of events, itself included, is then per chain
everything up to the highest seq the set reaches through links (`Reach`), and the auth
difference of state sets (rooms/state_res.py) is per chain the seqs between the least and
the most any set reaches.

Nothing here is held between calls: every figure is read in the caller's transaction, which
runs on a database thread (storage/database.py), not on the hub.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from homeserver.core.events import Event
from homeserver.storage import streams
from homeserver.storage.database import in_lists

CHAIN_STREAM = "auth_chains"
# Chains' seq ranges asked for in one query.
_RANGES_PER_QUERY = 100

Position = tuple[int, int]  # (chain_id, seq)


def index_events(tx, events: Iterable[Event]) -> None:
    """Gives each state event of `events` (one room) not indexed yet its position and links,
    in the caller's transaction; auth events in the batch go first. An auth event that was
    never stored is left out, as a walk of the graph leaves it out."""
    batch = {e.event_id: e for e in events if e.state_key is not None}
    for event_id in _positions(tx, batch.keys()):
        del batch[event_id]
    if not batch:
        return
    if tx.dialect == "postgres":  # two writers to a room would both extend one chain's head
        room = next(iter(batch.values())).room_id
        tx.execute("SELECT pg_advisory_xact_lock(hashtext(?))", (f"auth_chains {room}",))
    positions = _positions(tx, {a for e in batch.values() for a in e.auth_event_ids})
    heads = _heads(tx, {chain for chain, _ in positions.values()})
    last = streams.advance(tx, CHAIN_STREAM, len(batch))
    new_chains = iter(range(last - len(batch) + 1, last + 1))
    rows, links = [], []
    for event in _auth_order(batch):
        auth = [positions[a] for a in event.auth_event_ids if a in positions]
        on_head = [(chain, seq + 1) for chain, seq in auth if heads.get(chain) == seq]
        chain, seq = on_head[0] if on_head else (next(new_chains), 1)
        heads[chain] = seq
        positions[event.event_id] = (chain, seq)
        rows.append((event.event_id, chain, seq))
        targets: dict[int, int] = {}
        for target, target_seq in auth:
            if target != chain and target_seq > targets.get(target, 0):
                targets[target] = target_seq
        links += [(chain, seq, target, target_seq) for target, target_seq in targets.items()]
    tx.executemany(
        "INSERT INTO event_auth_positions (event_id, chain_id, seq) VALUES (?, ?, ?)", rows
    )
    tx.executemany(
        "INSERT INTO auth_chain_links (origin_chain, origin_seq, target_chain, target_seq)"
        " VALUES (?, ?, ?, ?)",
        links,
    )


def auth_difference(
    tx, state_sets: Sequence[Mapping], pending: Mapping[str, Sequence[str]] | None = None
) -> set[str] | None:
    """The events in some state set's auth chain (the set's own events included) but not
    in every one's. `pending`: events of the sets not stored yet ({event_id: its auth event
    IDs}), such as the received event whose resolution this is; no stored event cites them,
    so each counts as its auth events plus itself. None when another event of the sets is
    not indexed (the caller then walks)."""
    pending = pending or {}
    values = [set(s.values()) for s in state_sets]
    every = set[str]().union(*values)
    positions = _positions(tx, every | {a for auths in pending.values() for a in auths})
    unplaced = every - positions.keys()
    if unplaced - pending.keys():
        return None

    def starts(ids: Iterable[str]) -> list[Position]:
        found = []
        for event_id in ids:
            if event_id in positions:
                found.append(positions[event_id])
            else:
                found += [positions[a] for a in pending[event_id] if a in positions]
        return found

    common = set.intersection(*values)
    base = Reach(_Links(tx))
    base.add(starts(common))
    tops = []
    for ids in values:
        reach = base.copy()
        reach.add(starts(ids - common))
        tops.append(reach.top)
    ranges = []
    for chain in set[int]().union(*tops):
        seqs = [top.get(chain, 0) for top in tops]
        if min(seqs) < max(seqs):
            ranges.append((chain, min(seqs), max(seqs)))
    return _events_in(tx, ranges) | (unplaced - common)


class Reach:
    """The auth chain of a set of events, as the highest seq it reaches on each chain."""

    def __init__(self, links: _Links):
        self.top: dict[int, int] = {}
        self._links = links
        self._followed: dict[int, int] = {}  # per chain, the seq its links are followed to

    def copy(self) -> Reach:
        other = Reach(self._links)
        other.top, other._followed = dict(self.top), dict(self._followed)
        return other

    def add(self, positions: Iterable[Position]) -> None:
        todo = set()
        for chain, seq in positions:
            if seq > self.top.get(chain, 0):
                self.top[chain] = seq
                todo.add(chain)
        while todo:
            raised = set()
            for chain, chain_links in self._links.of(todo).items():
                followed, top = self._followed.get(chain, 0), self.top[chain]
                for origin_seq, target, target_seq in chain_links:
                    if followed < origin_seq <= top and target_seq > self.top.get(target, 0):
                        self.top[target] = target_seq
                        raised.add(target)
                self._followed[chain] = top
            todo = raised


class _Links:
    """The links out of each chain, read once per chain in one transaction."""

    def __init__(self, tx):
        self.tx = tx
        self._by_chain: dict[int, list[tuple[int, int, int]]] = {}

    def of(self, chains: set[int]) -> dict[int, list[tuple[int, int, int]]]:
        unread = [c for c in chains if c not in self._by_chain]
        for chain in unread:
            self._by_chain[chain] = []
        for chunk, marks in in_lists(unread):
            for origin, origin_seq, target, target_seq in self.tx.fetchall(
                "SELECT origin_chain, origin_seq, target_chain, target_seq"
                f" FROM auth_chain_links WHERE origin_chain IN ({marks})",
                chunk,
            ):
                self._by_chain[origin].append((origin_seq, target, target_seq))
        return {c: self._by_chain[c] for c in chains}


def _positions(tx, event_ids: Iterable[str]) -> dict[str, Position]:
    found: dict[str, Position] = {}
    for chunk, marks in in_lists(list(event_ids)):
        for event_id, chain, seq in tx.fetchall(
            f"SELECT event_id, chain_id, seq FROM event_auth_positions WHERE event_id IN ({marks})",
            chunk,
        ):
            found[event_id] = (chain, seq)
    return found


def _heads(tx, chains: set[int]) -> dict[int, int]:
    heads: dict[int, int] = {}
    for chunk, marks in in_lists(list(chains)):
        for chain, seq in tx.fetchall(
            "SELECT chain_id, MAX(seq) FROM event_auth_positions"
            f" WHERE chain_id IN ({marks}) GROUP BY chain_id",
            chunk,
        ):
            heads[chain] = seq
    return heads


def _events_in(tx, ranges: list[tuple[int, int, int]]) -> set[str]:
    """The events at seqs `low` < seq <= `high` on each (chain, low, high)."""
    found: set[str] = set()
    for start in range(0, len(ranges), _RANGES_PER_QUERY):
        chunk = ranges[start : start + _RANGES_PER_QUERY]
        where = " OR ".join("(chain_id = ? AND seq > ? AND seq <= ?)" for _ in chunk)
        params = [value for r in chunk for value in r]
        found.update(
            r[0]
            for r in tx.fetchall(f"SELECT event_id FROM event_auth_positions WHERE {where}", params)
        )
    return found


def _auth_order(batch: dict[str, Event]) -> list[Event]:
    """The batch with each event after those of its auth events that are in the batch."""
    ordered: list[Event] = []
    placed: set[str] = set()
    entered: set[str] = set()  # a cycle (possible in room versions 1 and 2) ends here
    for root in batch:
        stack = [(root, False)]
        while stack:
            event_id, expanded = stack.pop()
            if expanded:
                placed.add(event_id)
                ordered.append(batch[event_id])
                continue
            if event_id in entered:
                continue
            entered.add(event_id)
            stack.append((event_id, True))
            stack.extend(
                (a, False)
                for a in batch[event_id].auth_event_ids
                if a in batch and a not in entered
            )
    return ordered
