"""What one save may ask of the template check (docs/TYPES.md, "Limits"): how many templates it
carries, and ONE budget of CPU time for checking all of them.

Saving checks every template part (:func:`notifications.rendering.check_parts`: compile, then dry
renders on four sample recipients, each within the render bounds). The render bounds hold per
render, not per request: forty variants of a loop body took 25 s and eight such requests starved
every API thread. So a request's checks share one :class:`CheckBudget` of
``TEMPLATE_CHECK_CPU_MS`` (``settings.CAMPAIGNS["CHECK_CPU_MS"]``, 1,000 ms) of the thread's CPU:
read before each compile and each dry render, and each dry render may spend at most what is left.
Past it, :class:`CheckBudgetSpent` (the save answers ``422 render_budget`` and writes nothing); a
request answers within about the budget plus one compile and one render.

``with check_budget():`` around everything one save checks (a template's variants, a type's
templates and keys) makes them share it; :func:`check_parts` opens its own when none is open.
"""

from __future__ import annotations

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


class CheckBudget:
    """What is left of one request's check budget (:func:`cpu_clock` from its creation)."""

    def __init__(self, total_ms: int) -> None:
        self.total_ms = total_ms
        self.started = cpu_clock()

    def left(self) -> float:
        """Seconds of CPU left; raises :class:`CheckBudgetSpent` when none is."""
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
