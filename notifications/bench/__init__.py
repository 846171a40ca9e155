"""``manage.py bench``: the whole platform under a campaign blast plus a stream of OTPs.

Modules: :mod:`.stats` and :mod:`.report` are pure (statistics, the JSON report, targets, the docs
table; unit-tested in ``tests/test_bench_*.py``); :mod:`.stack` starts the bench's own stack
(a subclass of ``tests.stack.Stack``); :mod:`.seed` writes recipients and segments with COPY;
:mod:`.procs` samples CPU and RSS per process kind; :mod:`.emulator` talks to the emulator's
control API; :mod:`.otp` sends high-priority notifications at a fixed rate; :mod:`.raw` is the raw
provider ceiling; :mod:`.runner` runs one blast; :mod:`.plot` draws the PNG. See docs/PERFORMANCE.md.
"""
