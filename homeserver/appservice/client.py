"""Calls to application services (Application Service API), over plain urllib3.

The URL is the registration's, which the operator wrote: it is trusted as it is and not put
through the federation IP filter, since bridges live on loopback or a private network and no
client can name another address here. Every call has one total deadline (`appservice.deadline`,
connect, request and body together): on expiry the greenlet's timeout unwinds urllib3, which
closes the connection, so a hung appservice keeps no socket past its call.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import gevent
import urllib3
from urllib3.exceptions import HTTPError

from homeserver.federation.transport import USER_AGENT

MAX_ANSWER_BYTES = 1024 * 1024  # an appservice answers `{}`; anything larger is not read


class AppserviceUnreachable(Exception):
    """No answer: refused, reset, or the deadline passed (`timed_out`)."""

    def __init__(self, reason: str, timed_out: bool = False):
        super().__init__(reason)
        self.timed_out = timed_out


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes

    def json(self) -> object:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


class AppserviceClient:
    """One connection pool per appservice URL; `maxsize=1` per pool for transactions, whose
    one in flight at a time (appservice/sender.py) then never holds a second socket."""

    def __init__(self, deadline: float, *, pool_size: int = 1):
        self.deadline = deadline
        self._http = urllib3.PoolManager(
            maxsize=pool_size, retries=False, timeout=urllib3.Timeout(connect=deadline)
        )

    def call(
        self, method: str, url: str, hs_token: str, body: dict | None = None, deadline=None
    ) -> Answer:
        deadline = self.deadline if deadline is None else deadline
        headers = {"Authorization": f"Bearer {hs_token}", "User-Agent": USER_AGENT}
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        try:
            with gevent.Timeout(deadline):
                response = self._http.request(
                    method,
                    url,
                    body=data,
                    headers=headers,
                    preload_content=False,
                    timeout=urllib3.Timeout(connect=deadline, read=deadline),
                )
                try:
                    answer = response.read(MAX_ANSWER_BYTES + 1, decode_content=True)
                finally:
                    response.release_conn()
        except gevent.Timeout:
            raise AppserviceUnreachable(f"no answer within {deadline:g} s", True) from None
        except (HTTPError, OSError) as e:
            raise AppserviceUnreachable(type(e).__name__) from None
        return Answer(response.status, answer[:MAX_ANSWER_BYTES])

    def transaction(self, url: str, hs_token: str, txn_id: int, body: dict) -> Answer:
        return self.call("PUT", f"{url}/_matrix/app/v1/transactions/{txn_id}", hs_token, body)

    def ping(self, url: str, hs_token: str, transaction_id: str | None) -> float:
        """Milliseconds the appservice took to answer 200; an Answer otherwise."""
        body = {} if transaction_id is None else {"transaction_id": transaction_id}
        started = time.monotonic()
        answer = self.call("POST", f"{url}/_matrix/app/v1/ping", hs_token, body)
        if answer.status != 200:
            raise BadStatus(answer)
        return (time.monotonic() - started) * 1000

    def get_json(self, url: str, hs_token: str, deadline: float) -> object:
        """GET's JSON answer when 200, else None."""
        answer = self.call("GET", url, hs_token, None, deadline)
        return answer.json() if answer.status == 200 else None

    def close(self) -> None:
        self._http.clear()


class BadStatus(Exception):
    def __init__(self, answer: Answer):
        super().__init__(f"status {answer.status}")
        self.answer = answer
