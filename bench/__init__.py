"""Benchmark tools: ``manage.py bench`` (docs/PERFORMANCE.md), ``bench_fanout``, ``latency_probe``,
and :mod:`bench.stack` (the whole platform as real processes, for the e2e tests and the bench).

A top-level package beside the apps: it imports them, they never import it (the ``bench`` entry in
``INSTALLED_APPS`` exists for its management commands only, see :mod:`bench.apps`).

Modules: :mod:`.stats` and :mod:`.report` are pure (statistics, the JSON report, targets, the docs
table; unit-tested in ``tests/test_bench_*.py``); :mod:`.production_stack` starts the bench's own
stack (a subclass of :class:`bench.stack.Stack` with production timings); :mod:`.seed` writes
recipients and segments with COPY; :mod:`.procs` samples CPU and RSS per process kind;
:mod:`.emulator` talks to the emulator's control API; :mod:`.otp` sends high-priority notifications
at a fixed rate; :mod:`.raw` is the raw and SDK ceilings; :mod:`.runner` runs one blast;
:mod:`.plot` draws the PNG.
"""
