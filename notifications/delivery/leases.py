"""Leases on claimed rows, renewed for as long as the rows are in flight: the claim stage of the
delivery pipeline.

A worker claims rows (``queued → sending`` with a lease); the reconciler re-drives a ``sending`` row
only once its lease has run out. A slow machine must make delivery slower, never duplicated, so each
worker process's :class:`LeaseKeeper` renews the lease of every row it holds from a heartbeat thread,
extends it to cover each provider call's deadline before the call (:meth:`LeaseKeeper.ensure`, which
also reports the rows lost), checks it in memory right before a call (:meth:`LeaseKeeper.covers`) and
never shortens it. The rules and why: docs/ARCHITECTURE.md §6, "Leases, retries and unknown outcomes".
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection

from core import clock
from core.postgres import array_literal

log = logging.getLogger(__name__)

_RENEW_SQL = """
WITH mine AS (
    SELECT n.id FROM notifications_notification AS n
      JOIN unnest(%s::uuid[], %s::int[]) AS v(id, claims) ON n.id = v.id AND n.claims = v.claims
     WHERE n.status = 'sending'
       FOR UPDATE OF n {skip}
)
UPDATE notifications_notification AS n SET lease_until = GREATEST(n.lease_until, %s)
  FROM mine WHERE n.id = mine.id
RETURNING n.id, n.lease_until
"""


@dataclass
class _Held:
    claim: int  # the row's claim number (``claims``) this process holds it under
    since: float  # time.monotonic() when held
    until: datetime  # the lease we last wrote (UTC)


class LeaseKeeper:
    """The leases of the rows one worker process holds. Thread-safe (the high-tier worker runs
    several tasks as threads of one process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    # --- what a task calls --------------------------------------------------------------------

    def hold(self, rows: Iterable[tuple[object, int]], until: datetime) -> None:
        """Start renewing the leases of freshly claimed ``rows`` (``(id, claims)`` pairs, the
        claim's number) whose lease the claim set to ``until`` (UTC)."""
        started = time.monotonic()
        with self._lock:
            for pk, claim in rows:
                self._held[str(pk)] = _Held(int(claim), started, until)
        if settings.NOTIFY["LEASE_HEARTBEAT"]:
            self._start()

    def release(self, ids: Iterable[object]) -> None:
        """Stop renewing these rows (the task is done with them, recorded or not)."""
        with self._lock:
            for pk in ids:
                self._held.pop(str(pk), None)

    def ensure(self, ids: Iterable[object], seconds: float) -> set[str]:
        """Make the leases of ``ids`` cover at least ``seconds`` more (a provider call's deadline)
        before calling the provider for them. Renews in this thread (one UPDATE) when the last
        lease written does not cover it; the lease written is ``max(LEASE_SECONDS, seconds + 1)``
        from now.

        Returns the ids (as strings) that are still ours; the others are lost (no longer
        ``sending`` under our claim number) and must not be sent. Ids never held count as lost.
        """
        ids = [str(i) for i in ids]
        now = clock.now()
        need = now + timedelta(seconds=seconds)
        with self._lock:
            held = {i: self._held[i] for i in ids if i in self._held}
        stale = {i: h for i, h in held.items() if h.until < need}
        if not stale:
            return set(held)
        until = now + timedelta(seconds=max(float(settings.NOTIFY["LEASE_SECONDS"]), seconds + 1))
        owned = self._renew(stale, until, skip_locked=False)
        lost = set(stale) - owned
        if lost:
            log.warning("%d notification(s) changed hands before they were sent (lease lost); not sent here",
                        len(lost))
            self.release(lost)
        return set(held) - lost

    def covers(self, pk: object, seconds: float) -> bool:
        """Does the lease last written for the held row ``pk`` reach ``seconds`` (a call's own
        timeout) past now? In memory, no query: the provider event loop asks it right before each
        call of a sliding window (calls.py), so a call that waited for its slot never starts on a
        lease that could run out under it. A row not held (released, or lost) is not covered."""
        with self._lock:
            held = self._held.get(str(pk))
        return held is not None and held.until >= clock.now() + timedelta(seconds=seconds)

    # --- the heartbeat ------------------------------------------------------------------------

    def held_count(self) -> int:
        with self._lock:
            return len(self._held)

    def renew_all(self) -> int:
        """One heartbeat: renew every held row's lease (skipping rows locked by others and rows held
        longer than ``LEASE_MAX_HOLD_SECONDS``). Returns how many were renewed."""
        max_hold = float(settings.NOTIFY["LEASE_MAX_HOLD_SECONDS"])
        started = time.monotonic()
        with self._lock:
            due = {i: h for i, h in self._held.items() if started - h.since < max_hold}
            overdue = [i for i, h in self._held.items() if started - h.since >= max_hold]
            for i in overdue:
                del self._held[i]
        if overdue:
            log.error("%d notification(s) held for over %s s by one task: their leases are no longer renewed "
                      "and the reconciler will take them over", len(overdue), max_hold)
        if not due:
            return 0
        until = clock.now() + timedelta(seconds=float(settings.NOTIFY["LEASE_SECONDS"]))
        return len(self._renew(due, until, skip_locked=True))

    def _renew(self, rows: dict[str, _Held], until: datetime, *, skip_locked: bool) -> set[str]:
        sql = _RENEW_SQL.format(skip="SKIP LOCKED" if skip_locked else "")
        with connection.cursor() as cur:
            cur.execute(sql, [array_literal(rows), array_literal(h.claim for h in rows.values()), until])
            written = {str(r[0]): r[1] for r in cur.fetchall()}
        with self._lock:
            for i, lease in written.items():
                held = self._held.get(i)
                if held is not None and held.claim == rows[i].claim:
                    held.until = lease
        return set(written)

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        interval = max(0.2, float(settings.NOTIFY["LEASE_SECONDS"]) / 4)
        while True:
            self._wake.wait(interval)
            self._wake.clear()
            if not settings.NOTIFY["LEASE_HEARTBEAT"]:  # turned off (tests): held rows run out as set
                with self._lock:
                    self._thread = None
                return
            try:
                if self.held_count():
                    self.renew_all()
                elif connection.connection is not None:
                    connection.close()  # idle: no connection kept open between tasks
            except Exception as exc:
                # The database is unreachable or the connection broke: try again next beat with a
                # fresh connection. Rows keep the lease last written; if the outage outlasts it the
                # reconciler takes them over (the worker's ensure() then sees them lost).
                log.warning("lease heartbeat failed (%s); retrying in %.1f s", exc, interval)
                with contextlib.suppress(Exception):  # closing a broken connection may fail too
                    connection.close()


_keeper = LeaseKeeper()


def keeper() -> LeaseKeeper:
    """This process's :class:`LeaseKeeper`."""
    return _keeper


def _forget_after_fork() -> None:
    # A forked child (Celery prefork pool) holds nothing and has no heartbeat thread yet.
    global _keeper
    _keeper = LeaseKeeper()


os.register_at_fork(after_in_child=_forget_after_fork)
