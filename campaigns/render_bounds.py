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

The budget, its limits (settings ``TEMPLATE_RENDER_*``) and the size checks are in
:mod:`campaigns.render_budget`; a bound exceeded raises its :class:`RenderBoundExceeded`.
"""

from __future__ import annotations

import functools

from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.runtime import LoopContext
from jinja2.sandbox import MAX_RANGE, SandboxedEnvironment
from jinja2.utils import pass_context
from markupsafe import soft_str

from campaigns.render_budget import (
    CURRENT,
    MAX_INT_BITS,
    RenderBoundExceeded,
    check_brace_format,
    check_chars,
    check_items,
    check_percent_format,
    check_size,
    limits,
    tick,
)

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
        check_chars(width, what)


def _pre_indent(a, k, what):
    s, width = soft_str(_arg(a, k, 0, "s", "")), _arg(a, k, 1, "width", 4)
    each = width if isinstance(width, int) else len(soft_str(width))
    check_chars(len(s) + (s.count("\n") + 1) * max(each, 0), what)


def _pre_replace(a, k, what):
    check_chars(_replace_estimate(_arg(a, k, 0, "s", ""), _arg(a, k, 1, "old", ""), _arg(a, k, 2, "new", ""),
                                      _arg(a, k, 3, "count")), what)


def _pre_wordwrap(a, k, what):
    s, width = soft_str(_arg(a, k, 0, "s", "")), _arg(a, k, 1, "width", 79)
    wrap = soft_str(_arg(a, k, 3, "wrapstring") or "\n")
    if isinstance(width, int):
        check_chars(len(s) + (len(s) // max(width, 1) + 1) * len(wrap), what)


def _pre_format(a, k, what):
    check_percent_format(soft_str(_arg(a, k, 0, "value", "")), what)


def _pre_count(index: int, name: str):
    def check(a, k, what):
        n = _arg(a, k, index, name)
        if isinstance(n, int):
            check_items(n, what)
    return check


def _sizes(items) -> int:
    return sum(len(x) if isinstance(x, str | list | tuple) else len(soft_str(x)) for x in items)


def _pre_join(a, k, what):
    """Materialises the items (so they are read once) and returns the new arguments."""
    if _arg(a, k, 2, "attribute") is not None or not a:
        return None
    items = list(a[0])
    sep = soft_str(_arg(a, k, 1, "d", ""))
    check_chars(_sizes(items) + len(sep) * max(len(items) - 1, 0), what)
    return (items, *a[1:])


def _pre_sum(a, k, what):
    if _arg(a, k, 1, "attribute") is not None or not a:
        return None
    items = list(a[0])
    start = _arg(a, k, 2, "start", 0)
    if not isinstance(start, int | float) or any(not isinstance(x, int | float) for x in items):
        check_items(_sizes(items) + (len(start) if isinstance(start, str | list | tuple) else 0), what)
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
        tick()
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
        check_chars(args[0], what)
    elif name == "expandtabs":
        size = _arg(args, kwargs, 0, "tabsize", 8)
        if isinstance(size, int):
            check_chars(len(s) + s.count("\t") * max(size, 0), what)
    elif name == "replace" and len(args) >= 2:
        check_chars(_replace_estimate(s, args[0], args[1], _arg(args, kwargs, 2, "count")), what)
    elif name == "join" and args:
        items = list(args[0])
        check_chars(_sizes(items) + len(s) * max(len(items) - 1, 0), what)
        args = (items, *args[1:])
    return args


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
    current = CURRENT.get()
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
        current = CURRENT.get()
        return iterable if current is None else current.iterate(iterable)

    def bounded_concat(self, join, parts):
        strings = [soft_str(p) for p in parts]
        check_chars(sum(map(len, strings)), "a ~ concatenation")
        return join(strings)

    def charge_output(self, chars: int) -> None:
        current = CURRENT.get()
        if current is not None:
            current.produce(chars)

    def bounded_range(self, *args) -> range:
        """``range()`` for templates: refused when longer than the iterations left (or MAX_RANGE)."""
        rng = range(*args)
        current = CURRENT.get()
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
        tick()
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
                    check_chars(len(seq) * max(times, 0), what)
                elif isinstance(times, int) and isinstance(seq, list | tuple):
                    check_items(len(seq) * max(times, 0), what)
        elif operator == "+" and isinstance(left, str) and isinstance(right, str):
            check_chars(len(left) + len(right), what)
        elif operator == "%" and isinstance(left, str):
            check_percent_format(left, what)
        return check_size(super().call_binop(context, operator, left, right), what)

    def call(self, context, obj, /, *args, **kwargs):
        current = CURRENT.get()
        if current is not None:
            current.tick()
            if isinstance(obj, LoopContext) and args:  # a recursive loop(…) iterates again
                args = (current.iterate(args[0]), *args[1:])
        owner = getattr(obj, "__self__", None)
        if isinstance(owner, str) and hasattr(obj, "__name__"):
            args = _check_str_method(obj, args, kwargs)
        elif (isinstance(owner, list | dict | set) and getattr(obj, "__name__", "") in ("extend", "update")
              and args and hasattr(args[0], "__len__")):
            check_items(len(owner) + len(args[0]), f"{type(owner).__name__}.{obj.__name__}()")
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
            tick()
            check_brace_format(fmt, f"str.{value.__name__}()")
            return check_size(wrapper(*args, **kwargs), f"the result of str.{value.__name__}()")

        return bounded
