"""How big a value a template holds is, counted the way C code would walk it (docs/ARCHITECTURE.md §10; used
by :mod:`notifications.rendering.bounds` and :mod:`notifications.rendering.calls` before an operation runs).

``[[1] * 10000] * 10000`` is two lists of 10,000 items, but ``str()`` or ``|tojson`` walk
100,000,000 in C, so sizes count **every reference each time**. :func:`measure` returns a
:class:`Size` (``items``, and ``chars``: an estimate of ``len(str(value))``) and raises
:class:`~notifications.rendering.budget.RenderBoundExceeded` as soon as either passes its cap, so a
walk costs at most about ``cap`` steps. :func:`percent_estimate` is the length of ``fmt % args``;
:func:`nesting` is how deeply containers nest (``|tojson(indent=…)`` writes the indent per level).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import NamedTuple

from jinja2.runtime import Undefined
from jinja2.utils import Cycler, Namespace

from notifications.rendering.budget import RenderBoundExceeded, check_percent_format, limits_now

_DICT_VIEWS: tuple[type[Collection], ...] = (type({}.keys()), type({}.values()), type({}.items()))
_SEQUENCES: tuple[type[Collection], ...] = (list, tuple, set, frozenset, *_DICT_VIEWS)
#: ``repr()`` of a float is at most 24 characters; of any other object (a macro, a loop, a
#: generator) its default form, ``<… object at 0x…>``, about this many.
FLOAT_CHARS = 24
OBJECT_CHARS = 64
#: Values whose text is at most FLOAT_CHARS long (an int has at most MAX_INT_BITS bits; its digits
#: are counted when it is an item of a container).
SCALARS = frozenset({int, float, bool, type(None)})


class Size(NamedTuple):
    """``items``: elements of containers reached, each reference counted; ``chars``: about the
    length of the value as text."""

    items: int
    chars: int


def _int_chars(value: int) -> int:
    return value.bit_length() * 3 // 10 + 2  # decimal digits (log10 2 < 0.3011), sign


def measure(value, what: str, *, items: int | None = None, chars: int | None = None) -> Size:
    """The :class:`Size` of ``value`` (see the module docstring).

    ``items`` and ``chars`` are the caps (default: the iteration bound and the output bound of the
    current render). Raises RenderBoundExceeded (``"iterations"`` or ``"output"``) naming ``what``
    once the count passes a cap; the walk stops there.
    """
    lim = limits_now()
    items_cap = lim.iterations if items is None else items
    chars_cap = lim.output if chars is None else chars
    if isinstance(value, str):  # the common cases, at once
        if len(value) > chars_cap:
            raise _over_chars(what, len(value), chars_cap, lim.output)
        return Size(0, len(value))
    if type(value) in SCALARS:
        return Size(0, FLOAT_CHARS)
    n_items = n_chars = 0
    stack = [value]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        v = pop()
        if isinstance(v, str):
            n_chars += len(v) + 2  # as an item, repr() adds quotes
        elif isinstance(v, bool) or v is None:
            n_chars += 5
        elif isinstance(v, int):
            n_chars += _int_chars(v)
        elif isinstance(v, float):
            n_chars += FLOAT_CHARS
        elif isinstance(v, _SEQUENCES):
            n = len(v)
            n_items += n
            n_chars += 2 + 2 * n
            if n_items > items_cap:
                raise _over_items(what, items_cap)
            extend(v)
        elif isinstance(v, dict):
            n = len(v)
            n_items += n
            n_chars += 2 + 4 * n
            if n_items > items_cap:
                raise _over_items(what, items_cap)
            extend(v.keys())
            extend(v.values())
        elif isinstance(v, range):  # its text is a few characters ("range(0, 5)"); iterating it makes items
            n_items += len(v)
            if n_items > items_cap:
                raise _over_items(what, items_cap)
        elif isinstance(v, Namespace):
            push(object.__getattribute__(v, "_Namespace__attrs"))
        elif isinstance(v, Cycler):
            push(v.items)
        elif not isinstance(v, Undefined):
            n_chars += OBJECT_CHARS
        if n_chars > chars_cap:
            raise _over_chars(what, n_chars, chars_cap, lim.output, more=bool(stack))
    return Size(n_items, n_chars)


def _over_items(what: str, cap: int) -> RenderBoundExceeded:
    return RenderBoundExceeded("iterations", f"{what} would hold more than {cap:,} items, counting those of "
                                             f"nested lists and every repeated reference; at most {cap:,}")


def _over_chars(what: str, size: int, cap: int, output: int, more: bool = False) -> RenderBoundExceeded:
    left = "" if cap >= output else f" (left of {output:,} per render)"
    return RenderBoundExceeded("output", f"{what} would be {'more than ' if more else ''}{size:,} characters as "
                                         f"text; at most {cap:,}{left}")


def units(size: Size) -> int:
    """What an operation on a value of this size is charged (:func:`notifications.rendering.budget.charge`)."""
    return size.items + size.chars


def measure_all(values, what: str, *, items: int | None = None, chars: int | None = None) -> Size:
    """The sizes of several values (``args`` and ``kwargs.values()`` of a call) added up, under one
    pair of caps."""
    if not values:
        return Size(0, 0)
    if len(values) == 1:
        return measure(values[0], what, items=items, chars=chars)
    return measure(list(values), what, items=items, chars=chars)


_CONVERSION = re.compile(r"%(?:\(([^)]*)\))?([^a-zA-Z%]*)([a-zA-Z%]?)")


def percent_estimate(fmt: str, args, what: str, *, chars: int | None = None) -> int:
    """About ``len(fmt % args)``: the format's literal text, each conversion's width and precision,
    and the size of the argument each conversion formats (by key for ``%(key)s``). Raises what
    :func:`notifications.rendering.budget.check_percent_format` raises (widths), and RenderBoundExceeded
    when an argument is too large to format (see :func:`measure`)."""
    check_percent_format(fmt, what)
    total = len(fmt)
    conversions = list(_CONVERSION.finditer(fmt))
    if not conversions:
        return total
    positional = args if isinstance(args, tuple) else (args,)
    index = 0
    for match in conversions:
        key, spec, kind = match.groups()
        if kind == "%":
            continue
        total += sum(int(d) for d in re.findall(r"\d+", spec))
        if key is not None:
            value = args.get(key) if isinstance(args, Mapping) else None
        elif index < len(positional):
            value, index = positional[index], index + 1
        else:
            continue
        total += measure(value, what, chars=chars).chars
    return total


def nesting(value, cap: int) -> int:
    """How many levels of containers ``value`` has (0 for a scalar), counting at most ``cap``."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list | tuple) and not isinstance(v, str):
            deepest = max(deepest, depth)
            if deepest >= cap:
                return cap
            stack.extend((item, depth + 1) for item in v)
    return deepest
