"""Sync tokens: where a client is in every stream /sync serves.

`s<events>_<account_data>_<receipts>_<typing>_<epoch>`. The first three are positions in
streams kept in the database, so a token means the same after a restart. Typing lives in
memory: its position counts from 0 again in each process, and `epoch` names the process that
gave it (see typing.py for why that loses nothing). The token starts like a /messages token
(`s<events>`), so /messages accepts a next_batch as `from`, as the spec asks. Clients treat it
as opaque.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from homeserver.core.errors import invalid_param

_TOKEN = re.compile(r"^s(\d{1,18})_(\d{1,18})_(\d{1,18})_(\d{1,18})_([0-9a-f]{8})$")


@dataclass(frozen=True)
class SyncToken:
    events: int
    account_data: int
    receipts: int
    typing: int
    typing_epoch: str

    def __str__(self) -> str:
        return (
            f"s{self.events}_{self.account_data}_{self.receipts}_{self.typing}_{self.typing_epoch}"
        )

    @classmethod
    def parse(cls, text: str) -> "SyncToken":
        match = _TOKEN.match(text)
        if match is None:
            raise invalid_param("since is not a sync token from this server")
        events, account_data, receipts, typing = map(int, match.groups()[:4])
        return cls(events, account_data, receipts, typing, match.group(5))

    def typing_since(self, epoch: str) -> int:
        """The typing position this token has seen, in the current process's epoch."""
        return self.typing if self.typing_epoch == epoch else 0
