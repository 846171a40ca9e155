"""What one OTP costs: ``manage.py bench_otp`` (docs/PERFORMANCE.md, "What an OTP costs").

Starts only the processes an OTP goes through (emulator, the Procfile's gunicorn, the high worker)
against the bench database, sends ``count`` high-priority sends through ``POST /v1/notifications``
at ``rate`` per second with a real API key (:class:`bench.otp.OtpSender`), waits until the emulator
has every one, and divides the CPU of each process kind (``/proc`` deltas, :mod:`bench.procs`;
Postgres: the bench database's backends and the server's background processes) by the OTPs delivered.
No campaign runs beside it, so Postgres and Redis are the OTPs' alone (up to other users of the
same servers).
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from bench import procs
from bench.emulator import PROVIDER_OF_CHANNEL, Emulator
from bench.otp import OtpSender
from bench.production_stack import BenchStack
from bench.runner import OTP_USERS, clear_messages, monitor_for, reset_state
from bench.seed import ensure_otp_recipients
from bench.stats import cpu_ms_per_notification
from notifications.models import APIClient

#: The processes an OTP passes through, and the kinds reported.
OTP_PROCESSES = ("emulator", "web", "worker_high")
OTP_KINDS = ("web", "worker_high", "postgres", "redis")
#: The server's background processes (WAL writer, checkpointer, autovacuum…), apart from ``postgres``
#: (the bench database's backends): they serve every database of a shared server.
SHARED_KIND = "postgres_shared"


class OtpMonitor(procs.ProcessMonitor):
    """``postgres`` is the bench database's backends only; the server's other processes are
    ``postgres_shared`` (reported, not in the total)."""

    def _members(self) -> dict[int, str]:
        members = super()._members()
        for pid, kind in members.items():
            if kind == "postgres" and not self._backend(pid):
                members[pid] = SHARED_KIND
        return members

    def _backend(self, pid: int) -> bool:
        try:
            return procs.BACKEND.match(" ".join(self._handle(pid).cmdline())) is not None
        except Exception:
            return False


class OtpStack(BenchStack):
    """The bench stack reduced to what an OTP passes through."""

    def commands(self) -> dict[str, list[str]]:
        return {name: cmd for name, cmd in super().commands().items() if name in OTP_PROCESSES}

    def wait_for_workers(self, names=("high@",), timeout: float = 90) -> None:
        super().wait_for_workers(("high@",), timeout)


def run_otp_cpu(count: int, rate: float, channel: str, database_url: str, redis_url: str, work_dir: Path,
                progress: Callable[[str], None], env: dict[str, str] | None = None) -> dict:
    reset_state(redis_url)
    users = ensure_otp_recipients(OTP_USERS)
    _, key = APIClient.objects.create_key(name=f"bench-otp-{uuid.uuid4().hex[:6]}", allow_high=True)
    stack = OtpStack(database_url, redis_url, work_dir / "otp", env=dict(env or {}), log_dir=work_dir)
    base = monitor_for(stack, database_url, redis_url)
    monitor = OtpMonitor(base.kinds, postgres_database=base.postgres_database)
    progress(f"[otp] starting {', '.join(stack.commands())}…")
    stack.start_all()
    monitor.start()
    emulator = Emulator(stack.emulator)
    provider = PROVIDER_OF_CHANNEL[channel]
    try:
        sender = OtpSender(stack.api, key, users, [channel], rate, limit=count)
        for i in range(20):  # warm-up: imports, connections, first-request costs are not measured
            if sender.send_one(channel, users[-1 - i])["id"] is None:
                raise RuntimeError("warm-up OTP refused by the API")
        _wait_for(emulator, provider, 20, 60, stack)
        clear_messages(emulator)
        monitor.mark("start")
        sender.start()
        sender.wait_scheduled(count / rate + 60)
        sender.stop()  # waits for the requests in flight
        records = sender.records()
        accepted = [r for r in records if r["id"]]
        _wait_for(emulator, provider, len(accepted), 60, stack)
        monitor.mark("end")
        cpu = monitor.cpu_between("start", "end")
        analysis = emulator.analysis([r["id"] for r in accepted], 100)
        received = analysis.get("received_at_ms", {})
        latencies = sorted(min(received[r["id"]]) - r["accept_ms"] for r in accepted if received.get(r["id"]))
        delivered = len(latencies)
    finally:
        monitor.stop()
        dead = stack.dead()
        stack.stop_all()
    result = {
        "channel": channel, "rate": rate, "sent": len(records), "accepted": len(accepted),
        "delivered": delivered, "refused": [r.get("error") for r in records if not r["id"]][:3],
        "seconds": round(monitor.marks["end"][0] - monitor.marks["start"][0], 1),
        "cpu_seconds_by_kind": cpu,
        "cpu_ms_per_notification": cpu_ms_per_notification(cpu, OTP_KINDS, delivered),
        "emulator_cpu_ms_per_notification": cpu_ms_per_notification(cpu, ["emulator"], delivered)["emulator"],
        "postgres_shared_cpu_ms_per_notification": cpu_ms_per_notification(cpu, [SHARED_KIND], delivered)[SHARED_KIND],
        "api_ms_p50": round(statistics.median(r["api_ms"] for r in accepted), 1) if accepted else None,
        "latency_ms": {"p50": _pct(latencies, 50), "p99": _pct(latencies, 99), "max": _pct(latencies, 100)},
        "dead_processes": dead, "steal_seconds": round(procs.steal_seconds(), 1),
    }
    return result


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))], 1)


def _wait_for(emulator: Emulator, provider: str, n: int, timeout: float, stack: OtpStack) -> None:
    deadline = time.monotonic() + timeout
    while emulator.count(provider) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{n} OTPs did not reach the emulator within {timeout:.0f} s (dead: {stack.dead()})")
        time.sleep(0.1)
