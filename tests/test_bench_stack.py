"""The bench's stack never leaves a process behind when it cannot start (no platform, no database)."""

import sys

import pytest

from bench.production_stack import BenchStack


class Broken(BenchStack):
    def commands(self) -> dict[str, list[str]]:
        return {"emulator": [sys.executable, "-c", "import time; time.sleep(60)"],
                "web": ["/nonexistent/gunicorn"]}


def test_a_stack_that_cannot_start_stops_what_it_started(tmp_path):
    stack = Broken("postgres://unused/db", "redis://unused/0", tmp_path / "s", log_dir=tmp_path)
    started = []
    original = stack.start

    def start(name):
        original(name)
        started.append(stack.procs[name])

    stack.start = start
    try:
        with pytest.raises(FileNotFoundError):
            stack.start_all()
        assert len(started) == 1 and started[0].poll() is not None  # the emulator is stopped, not orphaned
        assert stack.procs == {}
    finally:
        for proc in started:  # never leave it behind, even when the assertion fails
            if proc.poll() is None:
                proc.kill()
                proc.wait()
