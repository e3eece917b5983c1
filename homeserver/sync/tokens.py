"""Sync tokens: where a client is in every stream /sync serves.

`s<events>_<account_data>_<receipts>_<typing>_<epoch>_<to_device>_<device_lists>_<presence>`.
All but
typing and epoch are positions in streams kept in the database, so a token means the same
after a restart. Typing lives in memory: its position counts from 0 again in each process,
and `epoch` names the process that gave it (see typing.py for why that loses nothing);
several instances take typing positions from the database and share one epoch. The
token starts like a /messages token (`s<events>`), so /messages accepts a next_batch as
`from`, as the spec asks. Clients treat it as opaque. A token from before the last parts
existed reads them as 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from homeserver.core.errors import invalid_param

_TOKEN = re.compile(
    r"^s(\d{1,18})_(\d{1,18})_(\d{1,18})_(\d{1,18})_([0-9a-f]{8})"
    r"(?:_(\d{1,18})_(\d{1,18})(?:_(\d{1,18}))?)?$"
)


@dataclass(frozen=True)
class SyncToken:
    events: int
    account_data: int
    receipts: int
    typing: int
    typing_epoch: str
    to_device: int = 0
    device_lists: int = 0
    presence: int = 0

    def __str__(self) -> str:
        return (
            f"s{self.events}_{self.account_data}_{self.receipts}_{self.typing}_{self.typing_epoch}"
            f"_{self.to_device}_{self.device_lists}_{self.presence}"
        )

    @classmethod
    def parse(cls, text: str) -> "SyncToken":
        match = _TOKEN.match(text)
        if match is None:
            raise invalid_param("since is not a sync token from this server")
        events, account_data, receipts, typing = map(int, match.groups()[:4])
        to_device, device_lists, presence = (int(g or 0) for g in match.groups()[5:])
        return cls(
            events,
            account_data,
            receipts,
            typing,
            match.group(5),
            to_device,
            device_lists,
            presence,
        )

    def with_events(self, position: int) -> "SyncToken":
        """This token, moved on in the events stream only (dataclasses.replace costs
        several times more, once per woken sync)."""
        return SyncToken(
            position,
            self.account_data,
            self.receipts,
            self.typing,
            self.typing_epoch,
            self.to_device,
            self.device_lists,
            self.presence,
        )

    def typing_since(self, epoch: str) -> int:
        """The typing position this token has seen, in the current process's epoch."""
        return self.typing if self.typing_epoch == epoch else 0
