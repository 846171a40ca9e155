"""The web process's gunicorn worker: gthread, with a bound on how long a request's read waits.

gunicorn's threaded worker reads a started request with a blocking socket and no timeout, so a
client that stops mid-headers (slowloris) held a thread for ever; 8 of them froze the API.
:class:`ReadBoundThreadWorker` gives every read :data:`READ_TIMEOUT` seconds
(``GUNICORN_READ_TIMEOUT``, 5) to see data, then ends the connection and frees its thread. It bounds
each wait, not a trickle: production runs behind a buffering reverse proxy (docs/OPERATIONS.md).
"""

from __future__ import annotations

import os
import select
import socket

from gunicorn.http.errors import NoMoreData
from gunicorn.workers.gthread import ThreadWorker

#: Seconds one read of a request may wait for the client's next bytes.
READ_TIMEOUT = float(os.environ.get("GUNICORN_READ_TIMEOUT", "5"))


class ReadTimedOut(NoMoreData):
    """The client sent nothing for :data:`READ_TIMEOUT` seconds mid-request (gunicorn closes the
    connection as it does for a client that went away: a debug line, no traceback)."""

    def __str__(self):
        return f"no request data for {READ_TIMEOUT:g} s"


class ReadBoundSocket(socket.socket):
    """A client socket whose blocking ``recv`` waits at most :data:`READ_TIMEOUT` for data."""

    def recv(self, bufsize, flags=0):
        if self.gettimeout() is None:  # blocking (a worker thread's read), not the poller's non-blocking
            poller = select.poll()
            poller.register(self, select.POLLIN | select.POLLPRI)
            if not poller.poll(READ_TIMEOUT * 1000):
                raise ReadTimedOut()
        return super().recv(bufsize, flags)


class ReadBoundThreadWorker(ThreadWorker):
    """gunicorn's gthread worker reading through :class:`ReadBoundSocket`."""

    def handle(self, conn):
        if not isinstance(conn.sock, ReadBoundSocket) and type(conn.sock) is socket.socket:
            blocking = conn.sock.getblocking()
            conn.sock = ReadBoundSocket(fileno=conn.sock.detach())
            conn.sock.setblocking(blocking)
        return super().handle(conn)
