"""Leases on claimed rows, renewed for as long as the rows are in flight: the claim stage of the
delivery pipeline (docs/ARCHITECTURE.md, "The send path").

A worker claims rows (``queued → sending``, ``lease_until = now + LEASE_SECONDS``); the reconciler
re-drives a ``sending`` row only once its lease has run out. A slow machine must make delivery
slower, never duplicated, so a lease must not run out while its row is still being worked on:

* **Heartbeat.** Every worker process has one :class:`LeaseKeeper`. The rows a task claims are
  *held* (:meth:`LeaseKeeper.hold`) until the task ends (:meth:`LeaseKeeper.release`); a daemon
  thread renews the lease of every held row every ``LEASE_SECONDS / 4`` seconds, in one UPDATE,
  however long the task takes (a 500-row batch behind a slow provider, a starved CPU). A lease
  therefore only runs out when the process died, hung for longer than a lease, or lost the
  database; a row is held at most ``LEASE_MAX_HOLD_SECONDS``, so a task stuck forever gives its
  rows up to the reconciler.
* **No call outlives its lease.** Before a provider call the caller asks :meth:`LeaseKeeper.ensure`
  for the rows it is about to send: their lease is extended (now, in the caller's thread) to cover
  at least the call's deadline, and the rows that are no longer ours (the reconciler took them over,
  or a cancel settled them) are returned as lost. A lost row is never sent from here.
* **Nor does a call that waited for its slot.** In a sliding window of calls, a message waits for
  a free slot; right before its call starts, :meth:`LeaseKeeper.covers` checks (in memory) that
  the lease last written still covers that call's timeout, and the message is skipped otherwise.
* **A lease is never shortened.** The heartbeat writes ``GREATEST(lease_until, now + LEASE_SECONDS)``:
  the lease :meth:`ensure` gave the rows of a call in flight (its whole deadline) stands even when
  the heartbeat stalls (a starved process, a GIL-holding C call such as key generation): only rows
  that are not in a call can expire under a live worker, and those are never sent once lost.
* **Lock safety.** The heartbeat's UPDATE skips rows locked by anyone else (``SKIP LOCKED``): it
  never waits on, or deadlocks with, the worker's own recording transaction or the reconciler. A
  skipped row keeps its previous lease; :meth:`ensure` (which does wait) is what decides "lost".

The heartbeat is switched off by ``NOTIFY["LEASE_HEARTBEAT"] = False`` (the in-process unit tests,
whose rows live in an uncommitted transaction another thread cannot see); :meth:`ensure` then
still renews in the caller's thread before every call.
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
