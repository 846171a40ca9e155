"""What one save may ask of the template check (docs/TYPES.md, "Limits"): how many templates it
carries, and ONE budget of CPU time for checking all of them.

Render bounds hold per render, not per request (forty variants once took 25 s), so a save's checks
share one :class:`CheckBudget` of ``TEMPLATE_CHECK_CPU_MS``: read before each compile and dry
render, each render spending at most what is left; past it :class:`CheckBudgetSpent` (``422
render_budget``, nothing written). ``with check_budget():`` makes one save's checks share it. A
budget also holds one of ``TEMPLATE_CHECK_CONCURRENCY`` slots per process (the GIL), taken at its
first :meth:`CheckBudget.left`; none within ``TEMPLATE_CHECK_WAIT_MS``: :class:`ChecksBusy` (``503
template_checks_busy``). Why these numbers: docs/TYPES.md, "Limits".
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from django.conf import settings

#: A template's variants: one per locale. 50 covers the languages an app store offers (Apple: 39
#: localizations; Google Play: about 80 language variants, of which apps ship a fraction).
MAX_VARIANTS = 50
#: A notification type's templates: every channel (push, email, sms, in_app) in MAX_VARIANTS locales.
MAX_TYPE_TEMPLATES = 4 * MAX_VARIANTS

#: The clock the budget reads (seconds of this thread's CPU); tests replace it with a fake one.
cpu_clock = time.thread_time


def budget_ms() -> int:
    """The CPU budget of one request's template checks, in ms (``TEMPLATE_CHECK_CPU_MS``)."""
    return settings.CAMPAIGNS.get("CHECK_CPU_MS", 1000)


class CheckBudgetSpent(Exception):
    """A request's templates together took more than their check budget; the message names the rule."""

    code = "render_budget"

    def __init__(self, total_ms: int) -> None:
        super().__init__(f"checking the templates of this request took more than {total_ms:,} ms of CPU "
                         "(TEMPLATE_CHECK_CPU_MS: one budget for all the templates and variants saved "
                         "together); save fewer or simpler templates at once")


class ChecksBusy(CheckBudgetSpent):
    """Every template-check slot of this process stayed taken for TEMPLATE_CHECK_WAIT_MS; nothing
    was checked. Retry after :func:`busy_retry_after` seconds."""

    code = "template_checks_busy"

    def __init__(self, total_ms: int) -> None:
        conf = settings.CAMPAIGNS
        Exception.__init__(self, f"other requests are checking templates: at most "
                                 f"{conf.get('CHECK_CONCURRENCY', 1)} at once per process "
                                 f"(TEMPLATE_CHECK_CONCURRENCY), none free within {conf.get('CHECK_WAIT_MS', 1000)} ms "
                                 "(TEMPLATE_CHECK_WAIT_MS); nothing was saved: retry shortly")
        self.total_ms = total_ms


def busy_retry_after() -> int:
    """Seconds a request refused with :class:`ChecksBusy` is told to wait: one request's check budget."""
    return max(1, math.ceil(budget_ms() / 1000))


_SLOTS: dict[int, threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


def slots() -> threading.BoundedSemaphore:
    """This process's template-check slots (``TEMPLATE_CHECK_CONCURRENCY`` of them)."""
    size = max(1, settings.CAMPAIGNS.get("CHECK_CONCURRENCY", 1))
    with _SLOTS_LOCK:
        return _SLOTS.setdefault(size, threading.BoundedSemaphore(size))


class CheckBudget:
    """What is left of one request's check budget (:func:`cpu_clock` from its creation), and the
    process's check slot it holds (taken at the first :meth:`left`)."""

    def __init__(self, total_ms: int) -> None:
        self.total_ms = total_ms
        self.started = cpu_clock()
        self.slot: threading.BoundedSemaphore | None = None

    def left(self) -> float:
        """Seconds of CPU left; raises :class:`CheckBudgetSpent` when none is, :class:`ChecksBusy`
        when no check slot frees in time."""
        if self.slot is None:
            slot = slots()
            if not slot.acquire(timeout=settings.CAMPAIGNS.get("CHECK_WAIT_MS", 1000) / 1000):
                raise ChecksBusy(self.total_ms)
            self.slot = slot
        left = self.total_ms / 1000 - (cpu_clock() - self.started)
        if left <= 0:
            raise CheckBudgetSpent(self.total_ms)
        return left


_CURRENT: ContextVar[CheckBudget | None] = ContextVar("template_check_budget", default=None)


@contextmanager
def check_budget() -> Iterator[CheckBudget]:
    """The request's budget: the one already open (checks inside share it), or a new one."""
    current = _CURRENT.get()
    if current is not None:
        yield current
        return
    current = CheckBudget(budget_ms())
    token = _CURRENT.set(current)
    try:
        yield current
    finally:
        _CURRENT.reset(token)
        if current.slot is not None:
            current.slot.release()
            current.slot = None
