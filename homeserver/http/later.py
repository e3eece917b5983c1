"""Answers waited for after the application has returned: a parked /sync.

A view with nothing to send yet returns a `LaterResponse`. Flask finishes the request as it
does any other, its contexts included, and the server then iterates the response's body:
that is where the wait happens, in `parked` (http/places.py), and where the answer is made
once it comes. WSGI lets a body call start_response in its first iteration (PEP 3333).

So a waiting request holds its socket and what its service keeps for it, and nothing of
Flask's; and a wake-up costs the answer and its write, not Flask's finishing of the request,
which the request had done when it parked. Each of thousands of syncs one message wakes
would otherwise pay it in the same moment (docs/operations.md, "Sizing").

The wait ends (`end`) on every way out: the server closes the body it iterates, and a
response the application made but never returned (http/server.py, `end_unreturned`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from flask import Response

from homeserver.core.json_text import EncodedJson
from homeserver.http.places import parked
from homeserver.http.responses import exception_response, json_response

# The environ's key for a LaterResponse whose wait has not ended yet (end_unreturned).
LATER = "weir.later"

# answer(while_waiting) -> the answer's body, which waits with `while_waiting()` entered.
Answer = Callable[[Callable[[], AbstractContextManager]], dict | EncodedJson]


class LaterResponse(Response):
    """A JSON answer to be waited for: `answer(while_waiting)` waits, then gives the body;
    `end()` gives up the wait, once enough and more harmless (the waiting service's own)."""

    def __init__(self, environ: dict, answer: Answer, end: Callable[[], None]):
        # Not Response.__init__ (as JsonResponse): what Flask and werkzeug read is set here.
        self.response = []
        self.direct_passthrough = False
        self._on_close: list = []
        self.status = 200
        self._environ = environ
        self._answer = answer
        self._end = end
        environ[LATER] = self

    def __call__(self, environ, start_response):
        return _WaitedBody(self, start_response)

    def end(self) -> None:
        self._environ.pop(LATER, None)
        self._end()


class _WaitedBody:
    """The body the server iterates: the wait, then the answer's own response."""

    __slots__ = ("_later", "_start_response")

    def __init__(self, later: LaterResponse, start_response):
        self._later = later
        self._start_response = start_response

    def __iter__(self) -> Iterator[bytes]:
        later = self._later
        environ = later._environ
        try:
            response = json_response(later._answer(functools.partial(parked, environ)))
        except Exception as error:
            # As Flask's error handlers answer (http/responses.py).
            response = exception_response(error)
        return iter(response(environ, self._start_response))

    def close(self) -> None:
        self._later.end()


def end_unreturned(environ: dict) -> None:
    """Ends the wait of a LaterResponse the application made but never returned (an error
    on the way out of Flask): its service would keep it registered otherwise."""
    later = environ.get(LATER)
    if later is not None:
        later.end()
