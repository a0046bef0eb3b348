"""Client-side deadlines on database connections, for the one case the server-side ones cannot cover: a server that
does not run at all (SIGSTOPped, a frozen VM, a hung storage layer under it). `statement_timeout` is the server's
own clock, so it never fires; `tcp_user_timeout` never fires either, because the kernel keeps acknowledging the
bytes (on a Unix socket there is no TCP at all); and psycopg waits for an answer without a limit.

A Watchdog thread shuts the socket of a connection whose block outlives its deadline (shutdown(2) on the socket
psycopg polls): the call blocked on it fails at once with an OperationalError, and the connection, now broken, is
discarded by its pool. No cancel request is sent: it would wait on the same frozen server, and the server's
`statement_timeout` ends the statement anyway if it was merely slow.
"""

from __future__ import annotations

import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

import psycopg


class DatabaseDeadlineExceeded(psycopg.OperationalError):
    """The database did not answer within the client-side deadline; the connection was cut."""


@dataclass(eq=False)
class _Guarded:
    conn: psycopg.Connection
    seconds: float
    armed: bool = True
    fired: bool = field(default=False)


class Watchdog:
    """One thread that cuts the connections whose guarded blocks outlive their deadline."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Guarded]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    @contextmanager
    def guard(self, conn: psycopg.Connection, seconds: float) -> Iterator[None]:
        """Within this block, `conn` is cut after `seconds` (the block's calls on it then raise
        DatabaseDeadlineExceeded)."""
        entry = _Guarded(conn, seconds)
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + max(0.0, seconds), next(self._order), entry))
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="database-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()
        try:
            yield
        except psycopg.OperationalError as exc:
            if entry.fired and not isinstance(exc, DatabaseDeadlineExceeded):
                raise DatabaseDeadlineExceeded(f"the database did not answer within {seconds:g} s (client-side "
                                               "deadline); the connection was cut") from exc
            raise
        finally:
            with self._cond:  # disarmed under the lock: a connection back in its pool is never cut by mistake
                entry.armed = False

    def _watch(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                _, _, entry = heapq.heappop(self._heap)
                if entry.armed:
                    entry.fired = True
                    _cut(entry.conn)


def _cut(conn: psycopg.Connection) -> None:
    try:
        descriptor = os.dup(conn.pgconn.socket)
    except (OSError, psycopg.OperationalError):  # closed meanwhile: nothing to cut
        return
    # The duplicate is closed; shutdown acts on the shared socket. A socket the server already shut needs nothing.
    with socket.socket(fileno=descriptor) as sock, suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


WATCHDOG = Watchdog()  # one thread per process, for every pool
