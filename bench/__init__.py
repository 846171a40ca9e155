"""Benchmark tools: ``manage.py bench`` (docs/PERFORMANCE.md), ``bench_fanout``, ``latency_probe``,
and :mod:`bench.stack` (the whole platform as real processes, for the e2e tests and the bench).

A top-level package beside the apps: it imports them, they never import it (its ``INSTALLED_APPS``
entry is for its management commands only, :mod:`bench.apps`). :mod:`.stats` and :mod:`.report` are
pure and unit-tested (tests/test_bench_*.py); :mod:`.runner` runs one blast on
:mod:`.production_stack`, with :mod:`.seed`, :mod:`.procs`, :mod:`.emulator`, :mod:`.otp`,
:mod:`.raw` and :mod:`.plot` as their names say.
"""
