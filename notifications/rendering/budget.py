"""The budget of one template render and the size checks (docs/ARCHITECTURE.md §10; used by
:mod:`notifications.rendering.bounds`, which routes a template's work through them).

A :class:`Budget` holds what one render may still spend: the thread's CPU time (read every
:data:`TICKS_PER_CLOCK_READ` operations and before large ones), loop iterations, characters written,
and the new values it makes (at most :data:`MADE_PER_OUTPUT` × the output bound). ``with budget():``
makes one current (:data:`CURRENT`). The size checks (:func:`check_size`, :func:`check_chars`,
:func:`check_items`, the format checks) also work with none current; with one, a string may be at
most the output left (:func:`output_left`). Limits: ``settings.CAMPAIGNS`` ``RENDER_*``,
:data:`MAX_INT_BITS`, :data:`MAX_TEMPLATE_TOKENS`; past one, :class:`RenderBoundExceeded`.
"""

from __future__ import annotations

import re
import string
import time
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import NamedTuple

from django.conf import settings

#: Integers a template computes are at most this many bits (about 3,000 decimal digits).
MAX_INT_BITS = 10_000
#: The CPU clock is read once per this many charged operations (a read costs a system call).
TICKS_PER_CLOCK_READ = 32
#: ... and before an operation once this many units of input (characters plus items) were charged
#: since the last read: a few large operations cannot add up unnoticed between two reads.
WORK_PER_CLOCK_READ = 200_000
#: A render makes new strings and containers of at most this many times RENDER_MAX_OUTPUT
#: characters plus items in total (each counted when made; 20,000,000 at the defaults).
MADE_PER_OUTPUT = 10
#: A template part is at most this many tokens (Jinja's lexer: text runs, names, operators, tag
#: delimiters; ``{{ x }}`` is 3). Compiling costs about 0.1 ms per token, before any render starts.
MAX_TEMPLATE_TOKENS = 10_000

_SETTING = {"time": "TEMPLATE_RENDER_CPU_MS", "iterations": "TEMPLATE_RENDER_MAX_ITERATIONS",
            "output": "TEMPLATE_RENDER_MAX_OUTPUT", "size": "MAX_INT_BITS", "tokens": "MAX_TEMPLATE_TOKENS"}


class RenderBoundExceeded(Exception):
    """A render passed one of its bounds. ``bound`` is ``"time"``, ``"iterations"`` (also items of a
    list), ``"output"`` (characters), ``"size"`` (bits of an integer) or ``"tokens"`` (the source
    itself); the message names it and the setting or constant that sets it.
    (:class:`notifications.rendering.RenderError` is what callers see.)"""

    def __init__(self, bound: str, message: str) -> None:
        super().__init__(f"{message} ({_SETTING[bound]})")
        self.bound = bound


class Limits(NamedTuple):
    """``cpu_seconds`` of the thread's CPU per render, ``iterations`` of loops per render (also the
    most items of a list it builds), ``output`` characters written per render (and per string)."""

    cpu_seconds: float
    iterations: int
    output: int


def limits() -> Limits:
    """The limits in force (``settings.CAMPAIGNS``: RENDER_CPU_MS, RENDER_MAX_ITERATIONS, RENDER_MAX_OUTPUT)."""
    conf = settings.CAMPAIGNS
    return Limits(cpu_seconds=conf.get("RENDER_CPU_MS", 100) / 1000,
                  iterations=conf.get("RENDER_MAX_ITERATIONS", 10_000),
                  output=conf.get("RENDER_MAX_OUTPUT", 2_000_000))


class Budget:
    """What one render may still spend. Methods raise :class:`RenderBoundExceeded`.

    The CPU clock starts at the first read, after TICKS_PER_CLOCK_READ charged operations (a read
    is a system call of about 2 µs here, as long as a small render): the few operations before it
    are not counted, and a typical render never reads the clock at all.
    """

    __slots__ = ("deadline", "iterations_left", "limits", "made", "produced", "ticks", "work")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.deadline: float | None = None
        self.iterations_left = limits.iterations
        self.produced = 0
        self.made = 0
        self.ticks = 0
        self.work = 0

    def tick(self) -> None:
        """Count one operation; every TICKS_PER_CLOCK_READ, check the CPU deadline."""
        self.ticks += 1
        if not self.ticks % TICKS_PER_CLOCK_READ:
            self.check_time()

    def charge(self, units: int) -> None:
        """Charge an operation about to run on ``units`` characters plus items of input: one tick,
        and a clock read first when WORK_PER_CLOCK_READ units were charged since the last one."""
        self.work += units
        if self.work >= WORK_PER_CLOCK_READ:
            self.work = 0
            self.check_time()
        self.tick()

    def make(self, units: int) -> None:
        """Charge a new value of ``units`` characters plus items (raises past MADE_PER_OUTPUT × output)."""
        self.made += units
        if self.made > self.limits.output * MADE_PER_OUTPUT:
            raise RenderBoundExceeded("output", f"the template made more than {self.limits.output * MADE_PER_OUTPUT:,} "
                                                f"characters and items of new values in one render "
                                                f"({MADE_PER_OUTPUT}× the output bound)")

    def check_time(self) -> None:
        now = time.thread_time()
        if self.deadline is None:
            self.deadline = now + self.limits.cpu_seconds
        elif now > self.deadline:
            raise RenderBoundExceeded("time", f"template rendering took more than "
                                              f"{self.limits.cpu_seconds * 1000:g} ms of CPU")

    def iterate(self, iterable: Iterable) -> Iterator:
        """``iterable``'s items, each charged one iteration."""
        for item in iterable:
            self.iterations_left -= 1
            if self.iterations_left < 0:
                raise RenderBoundExceeded("iterations", f"template loops ran more than "
                                                        f"{self.limits.iterations:,} iterations in one render")
            self.tick()
            yield item

    def produce(self, chars: int) -> None:
        """Charge ``chars`` characters of output."""
        self.produced += chars
        if self.produced > self.limits.output:
            raise RenderBoundExceeded("output", f"the template wrote more than {self.limits.output:,} "
                                                "characters in one render")


CURRENT: ContextVar[Budget | None] = ContextVar("template_render_budget", default=None)


class budget:
    """``with budget(limits_=None) as b:`` makes a fresh :class:`Budget` (``limits_``, or
    :func:`limits`) the one renders in this thread (or task) charge inside the block. (A class, not
    ``contextlib.contextmanager``: it is entered once per message sent.)"""

    __slots__ = ("current", "token")

    def __init__(self, limits_: Limits | None = None) -> None:
        self.current = Budget(limits_ or limits())

    def __enter__(self) -> Budget:
        self.token = CURRENT.set(self.current)
        return self.current

    def __exit__(self, *exc_info) -> None:
        CURRENT.reset(self.token)


def limits_now() -> Limits:
    """The current budget's limits, or the configured ones when no budget is current."""
    current = CURRENT.get()
    return current.limits if current is not None else limits()


def tick() -> None:
    """Charge one operation to the current budget, if any (may raise the time bound)."""
    current = CURRENT.get()
    if current is not None:
        current.tick()


def charge(units: int) -> None:
    """:meth:`Budget.charge` on the current budget, if any (may raise the time bound)."""
    current = CURRENT.get()
    if current is not None:
        current.charge(units)


def make(units: int) -> None:
    """:meth:`Budget.make` on the current budget, if any (may raise the output bound)."""
    current = CURRENT.get()
    if current is not None and units:
        current.make(units)


def output_left() -> int:
    """Characters the current render may still write (the output bound when no budget is current)."""
    current = CURRENT.get()
    if current is None:
        return limits().output
    return current.limits.output - current.produced


def too_long(what: str, size: int, unit: str = "characters", most: int | None = None) -> RenderBoundExceeded:
    """Characters count against the output bound (``most``: what is left of it); items of a list
    against the iteration bound."""
    lim = limits_now()
    if unit == "characters":
        most = lim.output if most is None else most
        left = "" if most >= lim.output else f" (left of {lim.output:,} per render)"
        return RenderBoundExceeded("output", f"{what} would be {size:,} characters; at most {most:,}{left}")
    return RenderBoundExceeded("iterations", f"{what} would be {size:,} items; at most {lim.iterations:,}")


def check_size(value, what: str):
    """Return ``value``; raise if it is a string longer than the output bound, or a list, tuple,
    dict or set with more items than the iteration bound, or an integer of more than MAX_INT_BITS bits."""
    lim = limits_now()
    if isinstance(value, str):
        if len(value) > lim.output:
            raise too_long(what, len(value))
    elif isinstance(value, list | tuple | dict | set | frozenset):
        if len(value) > lim.iterations:
            raise too_long(what, len(value), "items")
    elif isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise RenderBoundExceeded("size", f"{what} would be a number of more than {MAX_INT_BITS:,} bits")
    return value


def check_chars(chars: int, what: str) -> None:
    """Raise (output bound) when a string of ``chars`` characters would be too long to make: longer
    than the output the render may still write (:func:`output_left`)."""
    left = output_left()
    if chars > left:
        raise too_long(what, chars, most=left)


def check_items(items: int, what: str) -> None:
    """Raise (iteration bound) when a list of ``items`` items would be too long to make."""
    if items > limits_now().iterations:
        raise too_long(what, items, "items")


def _widths_ok(numbers: Iterable[str], what: str) -> None:
    for digits in numbers:
        if len(digits) > 9 or int(digits) > limits_now().output:
            raise too_long(what, int(digits) if len(digits) <= 30 else 10 ** 30)


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?([^a-zA-Z%]*)")


def check_percent_format(fmt: str, what: str = "a %-formatted string") -> None:
    """Refuse ``fmt % …`` whose conversions ask for a width or precision past the output bound, or
    take one from the arguments (``*``)."""
    for spec in _PERCENT_SPEC.findall(fmt):
        if "*" in spec:
            raise RenderBoundExceeded("output", f"{what}: a width or precision taken from the arguments (*) "
                                                "is not allowed")
        _widths_ok(re.findall(r"\d+", spec), what)


def check_brace_format(fmt: str, what: str = "str.format()") -> None:
    """Refuse ``fmt.format(…)`` whose fields ask for a width or precision past the output bound, or
    nest a field in a format spec (``{:{width}}``). Fields are read by ``string.Formatter().parse``."""
    for _literal, _field, spec, _conversion in string.Formatter().parse(fmt):
        if not spec:
            continue
        if "{" in spec:
            raise RenderBoundExceeded("output", f"{what}: a nested field in a format spec is not allowed")
        _widths_ok(re.findall(r"\d+", spec), what)


def check_tokens(env, source: str) -> None:
    """Raise when ``source`` has more than MAX_TEMPLATE_TOKENS tokens, before it is parsed or
    compiled (both cost time in proportion). Lexing stops at the first token past the bound."""
    for count, _token in enumerate(env.lex(source), 1):
        if count > MAX_TEMPLATE_TOKENS:
            raise RenderBoundExceeded("tokens", f"the template has more than {MAX_TEMPLATE_TOKENS:,} tokens")
