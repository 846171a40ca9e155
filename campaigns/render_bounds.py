"""Bounds on one template render: CPU time, loop iterations, output size (DESIGN.md §10).

:class:`BoundedSandbox` is Jinja2's ``SandboxedEnvironment`` with every way a template can spend
time or memory routed through a per-render :class:`Budget` (held in a context variable while
:func:`budget` is active), using the library's own hooks:

* loops: a code generator (``code_generator_class``) wraps the iterable of every ``{% for %}``
  (and of every recursive ``loop(…)`` call, through :meth:`BoundedSandbox.call`) so that each
  iteration is charged; ``range()`` (the sandbox's global) refuses a range longer than the
  iterations left;
* operators: ``+ * ** %`` are ``intercepted_binops``; :meth:`BoundedSandbox.call_binop` refuses a
  string or list that would pass the bounds and an integer of more than :data:`MAX_INT_BITS` bits
  before computing it (``'x' * 10**10``, ``9 ** 9 ** 9``, ``'%999999999d' % 1``);
* output: every ``{{ … }}`` (through ``finalize``) and every piece of template text (charged by the
  code generator) counts against the output bound, also when written into a macro, a ``{% set %}``
  block or a filter block; ``~`` concatenations are measured before they are joined;
* calls, filters and ``str.format``: each call ticks the clock; the arguments of the filters and
  string methods that size their result (``center``, ``indent``, ``replace``, ``wordwrap``,
  ``format``, ``join``, ``batch``, ``slice``, ``sum``, ``ljust``, ``zfill``…) are checked first, and
  every result is measured.

The clock is the thread's CPU time (``time.thread_time``): a render is not failed because the
machine is busy. It is read every :data:`TICKS_PER_CLOCK_READ` charged operations.

Limits come from ``settings.CAMPAIGNS`` (``RENDER_CPU_MS``, ``RENDER_MAX_ITERATIONS``,
``RENDER_MAX_OUTPUT``; environment ``TEMPLATE_RENDER_*``). A bound exceeded raises
:class:`RenderBoundExceeded`, whose message names the bound and its setting.
"""

from __future__ import annotations

import functools
import re
import string
import time
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import NamedTuple

from django.conf import settings
from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.runtime import LoopContext
from jinja2.sandbox import MAX_RANGE, SandboxedEnvironment
from jinja2.utils import pass_context
from markupsafe import soft_str

#: Integers a template computes are at most this many bits (about 3,000 decimal digits).
MAX_INT_BITS = 10_000
#: The CPU clock is read once per this many charged operations (a read costs a system call).
TICKS_PER_CLOCK_READ = 32
#: A template part is at most this many tokens (Jinja's lexer: text runs, names, operators, tag
#: delimiters; ``{{ x }}`` is 3). Compiling costs about 0.1 ms per token, before any render starts.
MAX_TEMPLATE_TOKENS = 10_000

_SETTING = {"time": "TEMPLATE_RENDER_CPU_MS", "iterations": "TEMPLATE_RENDER_MAX_ITERATIONS",
            "output": "TEMPLATE_RENDER_MAX_OUTPUT", "size": "MAX_INT_BITS", "tokens": "MAX_TEMPLATE_TOKENS"}


class RenderBoundExceeded(Exception):
    """A render passed one of its bounds. ``bound`` is ``"time"``, ``"iterations"`` (also items of a
    list), ``"output"`` (characters), ``"size"`` (bits of an integer) or ``"tokens"`` (the source
    itself); the message names it and the setting or constant that sets it.
    (:class:`campaigns.rendering.RenderError` is what callers see.)"""

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

    __slots__ = ("deadline", "iterations_left", "limits", "produced", "ticks")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.deadline = None
        self.iterations_left = limits.iterations
        self.produced = 0
        self.ticks = 0

    def tick(self) -> None:
        """Count one operation; every TICKS_PER_CLOCK_READ, check the CPU deadline."""
        self.ticks += 1
        if not self.ticks % TICKS_PER_CLOCK_READ:
            self.check_time()

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


_BUDGET: ContextVar[Budget | None] = ContextVar("template_render_budget", default=None)


class budget:
    """``with budget(limits_=None) as b:`` makes a fresh :class:`Budget` (``limits_``, or
    :func:`limits`) the one renders in this thread (or task) charge inside the block. (A class, not
    ``contextlib.contextmanager``: it is entered once per message sent.)"""

    __slots__ = ("current", "token")

    def __init__(self, limits_: Limits | None = None) -> None:
        self.current = Budget(limits_ or limits())

    def __enter__(self) -> Budget:
        self.token = _BUDGET.set(self.current)
        return self.current

    def __exit__(self, *exc_info) -> None:
        _BUDGET.reset(self.token)


def _limits_now() -> Limits:
    current = _BUDGET.get()
    return current.limits if current is not None else limits()


def _tick() -> None:
    current = _BUDGET.get()
    if current is not None:
        current.tick()


def _too_long(what: str, size: int, unit: str = "characters") -> RenderBoundExceeded:
    """Characters count against the output bound; items of a list against the iteration bound."""
    lim = _limits_now()
    if unit == "characters":
        return RenderBoundExceeded("output", f"{what} would be {size:,} characters; at most {lim.output:,}")
    return RenderBoundExceeded("iterations", f"{what} would be {size:,} items; at most {lim.iterations:,}")


def check_size(value, what: str):
    """Return ``value``; raise if it is a string longer than the output bound, or a list, tuple,
    dict or set with more items than the iteration bound, or an integer of more than MAX_INT_BITS bits."""
    lim = _limits_now()
    if isinstance(value, str):
        if len(value) > lim.output:
            raise _too_long(what, len(value))
    elif isinstance(value, list | tuple | dict | set | frozenset):
        if len(value) > lim.iterations:
            raise _too_long(what, len(value), "items")
    elif isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise RenderBoundExceeded("size", f"{what} would be a number of more than {MAX_INT_BITS:,} bits")
    return value


def _check_estimate(chars: int, what: str) -> None:
    if chars > _limits_now().output:
        raise _too_long(what, chars)


def _check_count(items: int, what: str) -> None:
    if items > _limits_now().iterations:
        raise _too_long(what, items, "items")


def _widths_ok(numbers: Iterable[str], what: str) -> None:
    for digits in numbers:
        if len(digits) > 9 or int(digits) > _limits_now().output:
            raise _too_long(what, int(digits) if len(digits) <= 30 else 10 ** 30)


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


# --- filters and string methods whose result size their arguments decide --------------------------

def _arg(args, kwargs, index: int, name: str, default=None):
    return args[index] if len(args) > index else kwargs.get(name, default)


def _replace_estimate(s, old, new, count) -> int:
    s, old, new = soft_str(s), soft_str(old), soft_str(new)
    found = s.count(old) if old else len(s) + 1
    if count is not None and count >= 0:
        found = min(found, count)
    return len(s) + found * max(0, len(new) - len(old))


def _pre_center(a, k, what):
    width = _arg(a, k, 1, "width", 80)
    if isinstance(width, int):
        _check_estimate(width, what)


def _pre_indent(a, k, what):
    s, width = soft_str(_arg(a, k, 0, "s", "")), _arg(a, k, 1, "width", 4)
    each = width if isinstance(width, int) else len(soft_str(width))
    _check_estimate(len(s) + (s.count("\n") + 1) * max(each, 0), what)


def _pre_replace(a, k, what):
    _check_estimate(_replace_estimate(_arg(a, k, 0, "s", ""), _arg(a, k, 1, "old", ""), _arg(a, k, 2, "new", ""),
                                      _arg(a, k, 3, "count")), what)


def _pre_wordwrap(a, k, what):
    s, width = soft_str(_arg(a, k, 0, "s", "")), _arg(a, k, 1, "width", 79)
    wrap = soft_str(_arg(a, k, 3, "wrapstring") or "\n")
    if isinstance(width, int):
        _check_estimate(len(s) + (len(s) // max(width, 1) + 1) * len(wrap), what)


def _pre_format(a, k, what):
    check_percent_format(soft_str(_arg(a, k, 0, "value", "")), what)


def _pre_count(index: int, name: str):
    def check(a, k, what):
        n = _arg(a, k, index, name)
        if isinstance(n, int):
            _check_count(n, what)
    return check


def _sizes(items) -> int:
    return sum(len(x) if isinstance(x, str | list | tuple) else len(soft_str(x)) for x in items)


def _pre_join(a, k, what):
    """Materialises the items (so they are read once) and returns the new arguments."""
    if _arg(a, k, 2, "attribute") is not None or not a:
        return None
    items = list(a[0])
    sep = soft_str(_arg(a, k, 1, "d", ""))
    _check_estimate(_sizes(items) + len(sep) * max(len(items) - 1, 0), what)
    return (items, *a[1:])


def _pre_sum(a, k, what):
    if _arg(a, k, 1, "attribute") is not None or not a:
        return None
    items = list(a[0])
    start = _arg(a, k, 2, "start", 0)
    if not isinstance(start, int | float) or any(not isinstance(x, int | float) for x in items):
        _check_count(_sizes(items) + (len(start) if isinstance(start, str | list | tuple) else 0), what)
    return (items, *a[1:])


#: Checks before a filter runs: ``(args after any context argument, kwargs, what)`` → new args or None.
FILTER_PRECHECKS = {
    "center": _pre_center, "indent": _pre_indent, "replace": _pre_replace, "wordwrap": _pre_wordwrap,
    "format": _pre_format, "batch": _pre_count(1, "linecount"), "slice": _pre_count(1, "slices"),
    "join": _pre_join, "sum": _pre_sum,
}


def _guard_filter(name: str, func):
    precheck = FILTER_PRECHECKS.get(name)
    offset = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0
    what = f"the result of |{name}"

    @functools.wraps(func)
    def guarded(*args, **kwargs):
        _tick()
        if precheck is not None:
            new = precheck(args[offset:], kwargs, what)
            if new is not None:
                args = (*args[:offset], *new)
        return check_size(func(*args, **kwargs), what)

    return guarded


def _check_str_method(method, args, kwargs) -> tuple:
    """Checks before ``some_string.<method>(…)``; returns the (possibly materialised) args."""
    s, name, what = method.__self__, method.__name__, f"str.{method.__name__}()"
    if name in ("ljust", "rjust", "center", "zfill") and args and isinstance(args[0], int):
        _check_estimate(args[0], what)
    elif name == "expandtabs":
        size = _arg(args, kwargs, 0, "tabsize", 8)
        if isinstance(size, int):
            _check_estimate(len(s) + s.count("\t") * max(size, 0), what)
    elif name == "replace" and len(args) >= 2:
        _check_estimate(_replace_estimate(s, args[0], args[1], _arg(args, kwargs, 2, "count")), what)
    elif name == "join" and args:
        items = list(args[0])
        _check_estimate(_sizes(items) + len(s) * max(len(items) - 1, 0), what)
        args = (items, *args[1:])
    return args


def check_tokens(env, source: str) -> None:
    """Raise when ``source`` has more than MAX_TEMPLATE_TOKENS tokens, before it is parsed or
    compiled (both cost time in proportion). Lexing stops at the first token past the bound."""
    for count, _token in enumerate(env.lex(source), 1):
        if count > MAX_TEMPLATE_TOKENS:
            raise RenderBoundExceeded("tokens", f"the template has more than {MAX_TEMPLATE_TOKENS:,} tokens")


# --- the environment ---------------------------------------------------------------------------------

def _is_budgeted(expr) -> bool:
    return (isinstance(expr, nodes.Call) and isinstance(expr.node, nodes.EnvironmentAttribute)
            and expr.node.name == "bounded_iter")


class BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator, with each loop's iterable, each ``~`` and each piece of template text
    routed through the environment's budget hooks."""

    def visit_For(self, node: nodes.For, frame) -> None:
        # The iterable becomes environment.bounded_iter(<iterable>) (Jinja allows no custom nodes).
        if not _is_budgeted(node.iter):
            node.iter = nodes.Call(nodes.EnvironmentAttribute("bounded_iter", lineno=node.lineno), [node.iter],
                                   [], None, None, lineno=node.lineno)
        super().visit_For(node, frame)

    def visit_Concat(self, node: nodes.Concat, frame) -> None:
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            join = "markup_join"
        else:
            join = "str_join"
        self.write(f"environment.bounded_concat({join}, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def visit_Output(self, node: nodes.Output, frame) -> None:
        static = sum(len(child.data) for child in node.nodes if isinstance(child, nodes.TemplateData))
        if static and not (frame.require_output_check and self.has_known_extends):
            self.writeline(f"environment.charge_output({static})")
        super().visit_Output(node, frame)


@pass_context
def _charge_expression(context, value):
    """``finalize``: every ``{{ … }}`` written anywhere is charged to the output bound."""
    current = _BUDGET.get()
    if current is not None:
        current.tick()
        current.produce(len(value) if isinstance(value, str) else len(soft_str(value)))
    return value


class BoundedSandbox(SandboxedEnvironment):
    """The sandbox with render bounds; see the module docstring. Outside a :func:`budget` block it
    still refuses what passes the static bounds (sizes, integer bits), without a clock or counter."""

    code_generator_class = BoundedCodeGenerator
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, **options) -> None:
        super().__init__(finalize=_charge_expression, **options)
        self.globals["range"] = self.bounded_range
        self.filters = {name: _guard_filter(name, func) for name, func in self.filters.items()}

    # Called by generated code.
    def bounded_iter(self, iterable):
        current = _BUDGET.get()
        return iterable if current is None else current.iterate(iterable)

    def bounded_concat(self, join, parts):
        strings = [soft_str(p) for p in parts]
        _check_estimate(sum(map(len, strings)), "a ~ concatenation")
        return join(strings)

    def charge_output(self, chars: int) -> None:
        current = _BUDGET.get()
        if current is not None:
            current.produce(chars)

    def bounded_range(self, *args) -> range:
        """``range()`` for templates: refused when longer than the iterations left (or MAX_RANGE)."""
        rng = range(*args)
        current = _BUDGET.get()
        left = min(current.iterations_left if current is not None else limits().iterations, MAX_RANGE)
        try:
            length = len(rng)
        except OverflowError:
            length = left + 1
        if length > left:
            most = current.limits.iterations if current is not None else limits().iterations
            raise RenderBoundExceeded("iterations", f"range() of {length:,} items is longer than the "
                                                    f"{left:,} loop iterations left of {most:,} per render")
        return rng

    def call_binop(self, context, operator: str, left, right):
        _tick()
        what = f"the result of {operator}"
        if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            if right * abs(left).bit_length() > MAX_INT_BITS:
                raise RenderBoundExceeded("size", f"{what} would be a number of more than {MAX_INT_BITS:,} bits")
        elif operator == "*":
            if isinstance(left, int) and isinstance(right, int):
                if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                    raise RenderBoundExceeded("size", f"{what} would be a number of more than {MAX_INT_BITS:,} bits")
            else:
                seq, times = (left, right) if isinstance(right, int) else (right, left)
                if isinstance(times, int) and isinstance(seq, str):
                    _check_estimate(len(seq) * max(times, 0), what)
                elif isinstance(times, int) and isinstance(seq, list | tuple):
                    _check_count(len(seq) * max(times, 0), what)
        elif operator == "+" and isinstance(left, str) and isinstance(right, str):
            _check_estimate(len(left) + len(right), what)
        elif operator == "%" and isinstance(left, str):
            check_percent_format(left, what)
        return check_size(super().call_binop(context, operator, left, right), what)

    def call(self, context, obj, /, *args, **kwargs):
        current = _BUDGET.get()
        if current is not None:
            current.tick()
            if isinstance(obj, LoopContext) and args:  # a recursive loop(…) iterates again
                args = (current.iterate(args[0]), *args[1:])
        owner = getattr(obj, "__self__", None)
        if isinstance(owner, str) and hasattr(obj, "__name__"):
            args = _check_str_method(obj, args, kwargs)
        elif (isinstance(owner, list | dict | set) and getattr(obj, "__name__", "") in ("extend", "update")
              and args and hasattr(args[0], "__len__")):
            _check_count(len(owner) + len(args[0]), f"{type(owner).__name__}.{obj.__name__}()")
        result = super().call(context, obj, *args, **kwargs)
        if isinstance(owner, list | dict | set):
            check_size(owner, f"a {type(owner).__name__} built by the template")
        return check_size(result, "the result of a call")

    def wrap_str_format(self, value):
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt = value.__self__

        @functools.wraps(wrapper)
        def bounded(*args, **kwargs):
            _tick()
            check_brace_format(fmt, f"str.{value.__name__}()")
            return check_size(wrapper(*args, **kwargs), f"the result of str.{value.__name__}()")

        return bounded
