"""Noticing a client that hangs up while its request waits on a remote peer.

pywsgi reads the client socket only between requests, so a client that gives up while its
handler waits on an outbound call goes unnoticed until the call ends: its budget slot stays
taken for the whole deadline. `stop_on_client_disconnect` watches the socket meanwhile and,
on EOF, interrupts the request greenlet with `ClientDisconnected`, which unwinds every `with`
on the way out, so the slot is released within moments of the hang-up.
"""

from __future__ import annotations

import contextlib
import socket

import gevent


class ClientDisconnected(gevent.GreenletExit):
    """The client closed its connection while its request was waiting.

    A GreenletExit, so no `except Exception` on the way out can swallow it, and gevent treats
    it as a normal end of the greenlet rather than an error to report.
    """


class HangUpWatch:
    """One watched block: the request greenlet to interrupt, while it is still inside.

    A read watcher on the connection's descriptor, run by the hub: no greenlet and no
    duplicated descriptor per watched request, so that a parked /sync costs little more than
    its socket (docs/operations.md, "Sizing")."""

    def __init__(self, request_greenlet, sock):
        self.request_greenlet = request_greenlet
        self.inside = True
        # The raw TCP socket (TLS or not): a peek sees the stream without consuming it.
        self._raw = getattr(sock, "_sock", sock)
        self._watcher = gevent.get_hub().loop.io(sock.fileno(), 1)  # 1: readable
        self._watcher.start(self._readable)

    def _readable(self) -> None:
        try:
            data = self._raw.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return  # nothing after all: keep watching
        except OSError:
            data = b""  # reset by peer: as gone as EOF
        self.stop()
        if data == b"":
            self.hang_up()
        # Bytes instead of EOF: a pipelined next request or a TLS alert. The client is still
        # there, so stop watching rather than guess.

    def stop(self) -> None:
        self._watcher.stop()

    def close(self) -> None:
        self.inside = False
        self._watcher.stop()
        self._watcher.close()

    def hang_up(self) -> None:
        # Delivered from the hub on its next turn. The block may have ended meanwhile (the
        # request woke in the same turn): then the code after it must not be interrupted.
        gevent.get_hub().loop.run_callback(self._interrupt)

    def _interrupt(self) -> None:
        if self.inside:
            self.request_greenlet.throw(ClientDisconnected)


def watch_for_hang_up(environ: dict) -> HangUpWatch | None:
    """Starts watching the request's connection from the current greenlet; the caller
    closes the watch when its block ends. None for the dev server or a test client."""
    sock = environ.get("weir.socket")
    return None if sock is None else HangUpWatch(gevent.getcurrent(), sock)


@contextlib.contextmanager
def stop_on_client_disconnect(environ: dict):
    """Runs the body; if the client hangs up meanwhile, raises ClientDisconnected inside it,
    and never after it."""
    watch = watch_for_hang_up(environ)
    try:
        yield
    finally:
        if watch is not None:
            watch.close()
