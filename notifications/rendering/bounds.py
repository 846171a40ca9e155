"""Bounds on one template render: CPU time, loop iterations, output size, and the size of every
value an operation makes or reads (docs/ARCHITECTURE.md §10).

:class:`BoundedSandbox` is Jinja2's ``SandboxedEnvironment`` with every way a template can spend
time or memory routed through the current :class:`Budget`, using the library's own hooks: a code
generator charges loops, comparisons and template text; :meth:`BoundedSandbox.call_binop` sizes
``+ * ** %`` from their operands; literals are measured as made; ``finalize`` measures output.
**An operation whose work happens in C is sized before it runs**, because the CPU bound is only
checked between operations. Sizes: :mod:`.sizes`; what calls may cost: :mod:`.calls`; the budget:
:mod:`.budget`. The rules in words: docs/SECURITY.md, "Limits on input and rendering".
"""

from __future__ import annotations

import types

from jinja2 import nodes
from jinja2.compiler import CodeGenerator, operators, optimizeconst
from jinja2.runtime import LoopContext, Undefined
from jinja2.sandbox import MAX_RANGE, SandboxedEnvironment
from jinja2.utils import pass_context
from markupsafe import escape, soft_str

from notifications.rendering.budget import (
    CURRENT,
    MAX_INT_BITS,
    RenderBoundExceeded,
    charge,
    check_chars,
    check_items,
    check_size,
    limits,
    limits_now,
    make,
    output_left,
    too_long,
)
from notifications.rendering.calls import (
    attribute_allowed,
    bounded_format,
    bounded_lipsum,
    check_method,
    checked_result,
    guard_filter,
    guard_test,
)
from notifications.rendering.sizes import SCALARS, measure, measure_all, percent_estimate, units


def _is_budgeted(expr) -> bool:
    return (isinstance(expr, nodes.Call) and isinstance(expr.node, nodes.EnvironmentAttribute)
            and expr.node.name == "bounded_iter")


class BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator, with each loop's iterable, each ``~``, each literal container, each
    compared operand and each piece of template text routed through the environment's hooks."""

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

    def _literal(self, visit, node, frame) -> None:
        self.write("environment.made_literal(")
        visit(node, frame)
        self.write(")")

    def visit_List(self, node: nodes.List, frame) -> None:
        self._literal(super().visit_List, node, frame)

    def visit_Dict(self, node: nodes.Dict, frame) -> None:
        self._literal(super().visit_Dict, node, frame)

    def visit_Tuple(self, node: nodes.Tuple, frame) -> None:
        if node.ctx == "load":
            self._literal(super().visit_Tuple, node, frame)
        else:  # an assignment target: {% set a, b = … %}, {% for k, v in … %}
            super().visit_Tuple(node, frame)

    def _operand(self, expr, frame) -> None:
        if isinstance(expr, nodes.Const):  # a constant is as small as the source that wrote it
            self.visit(expr, frame)
            return
        self.write("environment.compared(")
        self.visit(expr, frame)
        self.write(")")

    @optimizeconst
    def visit_Compare(self, node: nodes.Compare, frame) -> None:
        self.write("(")
        self._operand(node.expr, frame)
        for op in node.ops:
            self.write(f" {operators[op.op]} ")
            self._operand(op.expr, frame)
        self.write(")")


@pass_context
def _charge_expression(context, value):
    """``finalize``: every ``{{ … }}`` written anywhere is charged to the output bound, a value that is
    not a string measured first (its text may be at most what is left) and turned into text once. In
    an autoescaping template (an email's html) it is charged as written: escaped (``'`` is five
    characters), so the bound holds for the html as for the text."""
    current = CURRENT.get()
    autoescape = context.eval_ctx.autoescape
    if hasattr(value, "__html__"):
        text = value.__html__()
    elif isinstance(value, str):
        if current is not None:
            current.tick()
        if not autoescape:
            if current is not None:
                current.produce(len(value))
            return value
        text = value = escape(value)
        if current is not None:
            current.charge(len(text))
            current.produce(len(text))
        return value
    else:
        if type(value) not in SCALARS and not isinstance(value, Undefined):
            measure(value, "a value written by {{ … }}", chars=output_left())
        text = value = escape(value) if autoescape else soft_str(value)
    if current is not None:
        current.charge(len(text))
        current.produce(len(text))
    return value


class BoundedSandbox(SandboxedEnvironment):
    """The sandbox with render bounds; see the module docstring. Outside a :func:`budget` block it
    still refuses what passes the static bounds (sizes, integer bits), without a clock or counter."""

    code_generator_class = BoundedCodeGenerator
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, **options) -> None:
        super().__init__(finalize=_charge_expression, **options)
        self.globals["range"] = self.bounded_range
        self.globals["lipsum"] = bounded_lipsum
        self.filters = {name: guard_filter(name, func) for name, func in self.filters.items()}
        self.tests = {name: guard_test(name, func) for name, func in self.tests.items()}

    # Called by generated code.
    def bounded_iter(self, iterable):
        current = CURRENT.get()
        return iterable if current is None else current.iterate(iterable)

    def bounded_concat(self, join, parts):
        strings, chars = [], 0
        for part in parts:
            if not isinstance(part, str):
                if type(part) not in SCALARS:  # measured before str() walks it
                    measure(part, "a part of a ~ concatenation", chars=output_left() - chars)
                part = soft_str(part)
            strings.append(part)
            chars += len(part)
        check_chars(chars, "a ~ concatenation")
        charge(chars)
        make(chars)
        return join(strings)

    def charge_output(self, chars: int) -> None:
        current = CURRENT.get()
        if current is not None:
            current.produce(chars)

    def made_literal(self, value):
        """A list, tuple or dict the template wrote as a literal (``[a, b]``, ``{k: v}``), measured."""
        charge(units(measure(value, f"a {type(value).__name__} built by the template")))
        make(len(value))
        return value

    def compared(self, value):
        """An operand of a comparison (``==``, ``<``, ``in``…), measured: comparing walks both."""
        if not isinstance(value, str) and type(value) not in SCALARS:
            charge(units(measure(value, "a compared value")))
        return value

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

    # Sandbox hooks.
    def is_safe_attribute(self, obj, attr: str, value) -> bool:
        allowed = attribute_allowed(obj, attr)
        return (allowed is not False) and super().is_safe_attribute(obj, attr, value)

    def getitem(self, obj, argument):
        if isinstance(argument, tuple):  # hashing a tuple key walks it
            charge(units(measure(argument, "a dictionary key")))
        return super().getitem(obj, argument)

    def call_binop(self, context, operator: str, left, right):
        what = f"the result of {operator}"
        charge(self._check_binop(operator, left, right, what))
        result = super().call_binop(context, operator, left, right)
        if isinstance(result, str | list | tuple):
            return checked_result(result, what, (left, right))
        return check_size(result, what)

    @staticmethod
    def _check_binop(operator: str, left, right, what: str) -> int:
        """Refuses an operation whose result would pass a bound; returns the units to charge."""
        if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            if right * abs(left).bit_length() > MAX_INT_BITS:
                raise RenderBoundExceeded("size", f"{what} would be a number of more than {MAX_INT_BITS:,} bits")
        elif operator == "*":
            if isinstance(left, int) and isinstance(right, int):
                if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                    raise RenderBoundExceeded("size", f"{what} would be a number of more than {MAX_INT_BITS:,} bits")
                return 1
            seq, times = (left, right) if isinstance(right, int) else (right, left)
            if not isinstance(times, int):
                return 1
            times = max(times, 0)
            if isinstance(seq, str):
                check_chars(len(seq) * times, what)
                return len(seq) * times
            if isinstance(seq, list | tuple):
                check_items(len(seq) * times, what)
                size = measure(seq, what)
                lim = limits_now()
                if size.items * times > lim.iterations:
                    raise too_long(f"{what} (counting nested items, each reference)", size.items * times, "items")
                if size.chars * times > lim.output:
                    raise too_long(f"{what} as text", size.chars * times)
                return (size.items + size.chars) * times
        elif operator == "+":
            if isinstance(left, str) and isinstance(right, str):
                check_chars(len(left) + len(right), what)
                return len(left) + len(right)
            if isinstance(left, list | tuple) and isinstance(right, list | tuple):
                return units(measure([left, right], what))
        elif operator == "%" and isinstance(left, str):
            estimate = percent_estimate(left, right, what, chars=output_left())
            check_chars(estimate, what)
            return estimate
        return 1

    def call(self, context, obj, /, *args, **kwargs):
        current = CURRENT.get()
        if isinstance(obj, LoopContext) and args and current is not None:  # a recursive loop(…) iterates again
            args = (current.iterate(args[0]), *args[1:])
        owner = getattr(obj, "__self__", None)
        if isinstance(owner, LoopContext) and getattr(obj, "__name__", "") == "changed":  # compares its arguments
            charge(units(measure_all((*args, *kwargs.values()), "the arguments of loop.changed()")))
        else:
            charge(len(args) + len(kwargs))
        if owner is not None and hasattr(obj, "__name__"):
            args = check_method(obj, args, kwargs)
        result = super().call(context, obj, *args, **kwargs)
        if isinstance(owner, list | dict):
            check_size(owner, f"a {type(owner).__name__} built by the template")
        return checked_result(result, "the result of a call", (*args, owner))

    def wrap_str_format(self, value):
        """``str.format`` and ``format_map``: sandboxed and bounded
        (:func:`notifications.rendering.calls.bounded_format`)."""
        if (not isinstance(value, types.MethodType | types.BuiltinMethodType)
                or value.__name__ not in ("format", "format_map") or not isinstance(value.__self__, str)):
            return None
        return bounded_format(self, value)
