"""CPU seconds and RSS per process kind, sampled every second with psutil.

A *kind* is a name (``web``, ``worker_standard``, ``postgres``…) and a function returning its root
pids; every descendant of a root (the prefork pool, gunicorn's worker) belongs to the kind.
Postgres: the postmaster, its background processes and the backends of the bench's own database;
backends connected to other databases (someone's ``make run`` or tests on the same server) are left out.

CPU over a window is the sum, per process, of ``user + system`` at the window's end minus at its
start; a process born inside the window starts from 0, one that died inside it counts up to its
last sample (so at most one second of a short-lived process is missed).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

log = logging.getLogger(__name__)
BACKEND = re.compile(r"^postgres: (\S+) (\S+) (\S+\(\d+\)|\[local\])")


def listening_pid(port: int) -> int | None:
    """Pid of the process listening on TCP ``port`` (root sees every process), else ``None``."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return conn.pid
    return None


@dataclass
class _Proc:
    kind: str
    created: float
    first_cpu: float
    last_cpu: float
    rss: int = 0
    alive: bool = True


@dataclass
class Sample:
    t: float
    cpu: dict[str, float]
    rss: dict[str, int]


@dataclass
class ProcessMonitor:
    """Samples every ``interval`` seconds in a daemon thread. ``kinds`` maps a kind to a function
    returning root pids (evaluated at each sample, so restarted processes are followed)."""

    kinds: dict[str, Callable[[], list[int]]]
    postgres_database: str | None = None
    interval: float = 1.0
    procs: dict[int, _Proc] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    marks: dict[str, tuple[float, dict[int, float]]] = field(default_factory=dict)
    _handles: dict[int, psutil.Process] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="bench-procs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception:  # a sampling hiccup must never end the bench
                log.debug("process sample failed", exc_info=True)

    def _members(self) -> dict[int, str]:
        members: dict[int, str] = {}
        for kind, roots in self.kinds.items():
            for pid in roots():
                try:
                    root = self._handle(pid)
                    family = [root, *root.children(recursive=True)]
                except psutil.Error:
                    continue
                for proc in family:
                    if kind == "postgres" and not self._our_postgres(proc):
                        continue
                    members.setdefault(proc.pid, kind)
        return members

    def _our_postgres(self, proc: psutil.Process) -> bool:
        try:
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:
            return False
        match = BACKEND.match(cmdline)
        return match is None or self.postgres_database is None or match.group(2) == self.postgres_database

    def _handle(self, pid: int) -> psutil.Process:
        handle = self._handles.get(pid)
        if handle is None or not handle.is_running():
            handle = psutil.Process(pid)
            self._handles[pid] = handle
        return handle

    def sample(self) -> Sample:
        now = time.time()
        members = self._members()
        with self._lock:
            for pid, kind in members.items():
                try:
                    proc = self._handle(pid)
                    with proc.oneshot():
                        times = proc.cpu_times()
                        cpu = times.user + times.system
                        rss = proc.memory_info().rss
                        created = proc.create_time()
                except psutil.Error:
                    continue
                known = self.procs.get(pid)
                if known is None or abs(known.created - created) > 0.5:  # new process (or pid reuse)
                    self.procs[pid] = known = _Proc(kind, created, cpu, cpu)
                known.last_cpu, known.rss, known.alive = cpu, rss, True
            for pid, known in self.procs.items():
                if pid not in members:
                    known.alive = False
            cpu_by_kind: dict[str, float] = {}
            rss_by_kind: dict[str, int] = {}
            for known in self.procs.values():
                cpu_by_kind[known.kind] = cpu_by_kind.get(known.kind, 0.0) + known.last_cpu
                if known.alive:
                    rss_by_kind[known.kind] = rss_by_kind.get(known.kind, 0) + known.rss
            sample = Sample(now, cpu_by_kind, rss_by_kind)
            self.samples.append(sample)
            return sample

    def mark(self, name: str) -> float:
        """Sample now and remember every process's CPU under ``name``; returns the instant."""
        sample = self.sample()
        with self._lock:
            self.marks[name] = (sample.t, {pid: p.last_cpu for pid, p in self.procs.items()})
        return sample.t

    def cpu_between(self, start: str, end: str) -> dict[str, float]:
        """CPU seconds per kind between two marks."""
        t0, at_start = self.marks[start]
        _, at_end = self.marks[end]
        out: dict[str, float] = {kind: 0.0 for kind in self.kinds}
        with self._lock:
            for pid, proc in self.procs.items():
                if pid not in at_end:
                    continue
                if pid in at_start:
                    base = at_start[pid]
                elif proc.created >= t0 - 1.0:
                    base = 0.0
                else:  # existed before but was first seen after the start mark
                    base = proc.first_cpu
                out[proc.kind] = out.get(proc.kind, 0.0) + max(0.0, at_end[pid] - base)
        return {k: round(v, 2) for k, v in out.items()}

    def rss_between(self, t0: float, t1: float) -> dict[str, list[tuple[float, int]]]:
        """RSS timeline per kind (``[(t, bytes)]``) between two instants."""
        series: dict[str, list[tuple[float, int]]] = {}
        for s in self.samples:
            if t0 <= s.t <= t1:
                for kind, rss in s.rss.items():
                    series.setdefault(kind, []).append((s.t, rss))
        return series


def steal_seconds() -> float:
    """Host CPU steal so far (all cores, seconds); 0 where the kernel does not report it."""
    return float(getattr(psutil.cpu_times(), "steal", 0.0))


def busy_seconds() -> float:
    """All CPU time so far except idle and iowait (all cores, seconds)."""
    t = psutil.cpu_times()
    return sum(v for k, v in t._asdict().items() if k not in ("idle", "iowait", "steal", "guest", "guest_nice"))


def cores() -> int:
    return psutil.cpu_count() or 1
