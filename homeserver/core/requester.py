"""Requester: who an authenticated client request comes from, as every service sees it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Requester:
    user_id: str
    device_id: str
    is_admin: bool
    token_hash: str
    # The application service acting through its as_token (appservice/service.py).
    appservice_id: str | None = None
