"""What each filter, test, method and global a template can call may cost, checked before it runs
(docs/ARCHITECTURE.md §10; used by :mod:`notifications.rendering.bounds`).

Work done in C cannot be interrupted by the CPU bound, so every check happens **before** the call:
text-making filters (:data:`STRINGIFYING`) get what is left of the output bound, comparing ones
(:data:`COMPARING`) the whole bounds, Python loops (:data:`ITERATING`) the iteration bound,
per-character ones (:data:`PER_CHARACTER`) :data:`CHARS_PER_CPU_MS`; result-sizing arguments are
estimated first (:data:`FILTER_PRECHECKS`, :func:`check_method`); built-in methods are an
allowlist (:data:`SAFE_ATTRIBUTES`); results are charged as made values. The rules in words:
docs/SECURITY.md, "Limits on input and rendering".
"""

from __future__ import annotations

import builtins
import functools

from jinja2.sandbox import SandboxedFormatter
from jinja2.utils import generate_lorem_ipsum
from markupsafe import EscapeFormatter, Markup, soft_str

from notifications.rendering.budget import (
    RenderBoundExceeded,
    charge,
    check_brace_format,
    check_chars,
    check_items,
    check_size,
    limits_now,
    make,
    output_left,
    too_long,
)
from notifications.rendering.sizes import Size, measure, measure_all, nesting, percent_estimate, units

#: Filters that turn their input into text (so it may be at most what is left of the output bound).
STRINGIFYING = frozenset({
    "capitalize", "center", "e", "escape", "forceescape", "format", "indent", "join", "lower", "pprint",
    "replace", "safe", "string", "striptags", "title", "tojson", "trim", "truncate", "upper", "urlencode",
    "urlize", "wordcount", "wordwrap", "xmlattr",
})
#: Filters that compare, hash or add up their input's items (so walk them, nested ones included).
COMPARING = frozenset({"dictsort", "groupby", "max", "min", "sort", "sum", "unique"})
#: Filters that loop over their input's items in Python (a string's items are its characters).
ITERATING = frozenset({
    "batch", "dictsort", "groupby", "items", "join", "list", "map", "max", "min", "reject", "rejectattr",
    "select", "selectattr", "slice", "sort", "sum", "unique",
})
#: Filters that loop per word or character in Python: about 0.1–0.5 µs per character here.
PER_CHARACTER = frozenset({"title", "urlencode", "urlize", "wordcount", "wordwrap"})
#: ... so they take at most this many characters per millisecond of TEMPLATE_RENDER_CPU_MS.
CHARS_PER_CPU_MS = 1_000
#: Tests that turn their input into text, and those that compare it (so walk it).
STRINGIFYING_TESTS = frozenset({"lower", "upper"})
COMPARING_TESTS = frozenset({"!=", "<", "<=", "==", ">", ">=", "eq", "equalto", "ge", "greaterthan", "gt", "in",
                             "le", "lessthan", "lt", "ne"})


def _arg(args, kwargs, index: int, name: str, default=None):
    return args[index] if len(args) > index else kwargs.get(name, default)


def checked_result(result, what: str, inputs=()):
    """A result of a filter, call or operator: a string at most the output bound long, a container
    of at most the iteration bound of items (shallow: what it holds was measured where it was made,
    and is measured again wherever it is read deeply); what is new is charged to the render's made
    values. Returns ``result``."""
    check_size(result, what)
    if isinstance(result, str | list | tuple | dict) and not any(result is x for x in inputs):
        make(len(result))
    return result


# --- filters --------------------------------------------------------------------------------------

def _replace_estimate(s: str, old, new, count) -> int:
    old, new = soft_str(old), soft_str(new)
    found = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
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
    check_chars(_replace_estimate(soft_str(_arg(a, k, 0, "s", "")), _arg(a, k, 1, "old", ""),
                                  _arg(a, k, 2, "new", ""), _arg(a, k, 3, "count")), what)


def _pre_wordwrap(a, k, what):
    s, width = soft_str(_arg(a, k, 0, "s", "")), _arg(a, k, 1, "width", 79)
    wrap = soft_str(_arg(a, k, 3, "wrapstring") or "\n")
    if isinstance(width, int):
        check_chars(len(s) + (len(s) // max(width, 1) + 1) * len(wrap), what)


def _pre_format(a, k, what):
    fmt = soft_str(_arg(a, k, 0, "value", ""))
    check_chars(percent_estimate(fmt, dict(k) if k else tuple(a[1:]), what, chars=output_left()), what)


def _pre_count(index: int, name: str):
    def check(a, k, what):
        n = _arg(a, k, index, name)
        if isinstance(n, int):
            check_items(n, what)
    return check


def _pre_join(a, k, what):
    """Materialises the items (so they are read once), estimates the text; returns the new arguments."""
    if not a:
        return None
    items = list(a[0])
    sep = soft_str(_arg(a, k, 1, "d", ""))
    size = measure(items, what, chars=output_left())
    check_chars(size.chars + len(sep) * max(len(items) - 1, 0), what)
    return (items, *a[1:])


def _pre_sum(a, k, what):
    """Materialises the items; lists added up have at most their measured items."""
    if not a:
        return None
    items = list(a[0])
    measure([items, _arg(a, k, 2, "start", 0)], what)
    return (items, *a[1:])


def _pre_tojson(a, k, what):
    indent = _arg(a, k, 1, "indent")
    if indent is None or not a:
        return
    step = indent if isinstance(indent, int) else len(soft_str(indent))
    size = measure(a[0], what, chars=output_left())
    levels = nesting(a[0], limits_now().iterations)
    check_chars(size.chars + (size.items + 1) * levels * max(step, 0), what)


#: Checks before a filter runs: ``(args after any context argument, kwargs, what)`` → new args or None.
FILTER_PRECHECKS = {
    "center": _pre_center, "indent": _pre_indent, "replace": _pre_replace, "wordwrap": _pre_wordwrap,
    "format": _pre_format, "batch": _pre_count(1, "linecount"), "slice": _pre_count(1, "slices"),
    "join": _pre_join, "sum": _pre_sum, "tojson": _pre_tojson,
}


def _shallow(value) -> int:
    return len(value) if isinstance(value, str | list | tuple | dict | range) else 1


def check_inputs(values, what: str, *, deep: bool, stringifying: bool = False, iterating: bool = False,
                 per_character: bool = False) -> None:
    """The generic checks of a filter's (or test's) inputs, ``values`` (the filtered value first),
    which are then charged: measured (``deep``: the filter walks them in C, comparing or writing them
    as text; text at most what is left of the output bound when ``stringifying``), or only counted."""
    lim = limits_now()
    first = values[0] if values else None
    if deep:
        size = measure_all(values, f"the input of {what}", chars=output_left() if stringifying else None)
    else:
        size = Size(_shallow(first), 0)
    if iterating and isinstance(first, str) and len(first) > lim.iterations:
        raise too_long(f"{what} (it loops over each character)", len(first), "items")
    if per_character:
        most = int(lim.cpu_seconds * 1000 * CHARS_PER_CPU_MS)
        if size.chars > most:
            raise RenderBoundExceeded("time", f"{what} loops in Python over each word or character: at most "
                                              f"{most:,} characters ({CHARS_PER_CPU_MS:,} per ms of CPU), "
                                              f"not {size.chars:,}")
    charge(units(size))


def guard_filter(name: str, func):
    """``func`` (a filter) with the checks of the module docstring around it."""
    precheck = FILTER_PRECHECKS.get(name)
    offset = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0
    what = f"|{name}"
    stringifying = name in STRINGIFYING
    deep, iterating, per_character = stringifying or name in COMPARING, name in ITERATING, name in PER_CHARACTER

    @functools.wraps(func)
    def guarded(*args, **kwargs):
        inputs = (*args[offset:], *kwargs.values())
        check_inputs(inputs, what, deep=deep, stringifying=stringifying, iterating=iterating,
                     per_character=per_character)
        if precheck is not None:
            new = precheck(args[offset:], kwargs, f"the result of {what}")
            if new is not None:
                args = (*args[:offset], *new)
        return checked_result(func(*args, **kwargs), f"the result of {what}", inputs)

    return guarded


def guard_test(name: str, func):
    """``func`` (a test) with its inputs measured (comparisons, text) or counted, and charged, first."""
    offset = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0
    what = f"the test {name!r}"
    stringifying = name in STRINGIFYING_TESTS
    deep = stringifying or name in COMPARING_TESTS

    @functools.wraps(func)
    def guarded(*args, **kwargs):
        check_inputs((*args[offset:], *kwargs.values()), what, deep=deep, stringifying=stringifying)
        return func(*args, **kwargs)

    return guarded


# --- methods and globals --------------------------------------------------------------------------

_STR_METHODS = frozenset({
    "capitalize", "casefold", "center", "count", "endswith", "expandtabs", "find", "format", "format_map",
    "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric",
    "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "partition",
    "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit", "rstrip",
    "split", "splitlines", "startswith", "strip", "swapcase", "title", "upper", "zfill",
})
_INT_ATTRIBUTES = frozenset({"as_integer_ratio", "bit_count", "bit_length", "conjugate", "denominator", "imag",
                             "numerator", "real"})
#: The attributes a template may read on values of these exact built-in types; any other is refused
#: (as an unsafe attribute: the sandbox's SecurityError).
SAFE_ATTRIBUTES: dict[type, frozenset[str]] = {
    str: _STR_METHODS,
    Markup: _STR_METHODS | {"escape", "striptags", "unescape"},
    list: frozenset({"append", "clear", "copy", "count", "extend", "index", "insert", "pop", "remove", "reverse",
                     "sort"}),
    dict: frozenset({"clear", "copy", "fromkeys", "get", "items", "keys", "pop", "popitem", "setdefault", "update",
                     "values"}),
    tuple: frozenset({"count", "index"}),
    range: frozenset({"count", "index", "start", "step", "stop"}),
    int: _INT_ATTRIBUTES,
    bool: _INT_ATTRIBUTES,
    float: frozenset({"as_integer_ratio", "conjugate", "fromhex", "hex", "imag", "is_integer", "real"}),
}
#: Methods whose cost is a walk of the whole container (comparisons of every element).
_DEEP_METHODS = frozenset({"count", "index", "remove", "sort"})


def attribute_allowed(obj, attr: str) -> bool | None:
    """For a value of a type in SAFE_ATTRIBUTES, whether ``attr`` is listed; ``None`` for other types."""
    allowed = SAFE_ATTRIBUTES.get(type(obj))
    return None if allowed is None else attr in allowed


def _check_str_method(s: str, name: str, args, kwargs, what: str) -> tuple:
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
        size = measure(items, what, chars=output_left())
        check_chars(size.chars + len(s) * max(len(items) - 1, 0), what)
        args = (items, *args[1:])
    elif name in ("split", "rsplit"):
        sep, most = _arg(args, kwargs, 0, "sep"), _arg(args, kwargs, 1, "maxsplit", -1)
        if isinstance(sep, str) and sep and isinstance(most, int):
            parts = s.count(sep) + 1
            check_items(parts if most < 0 else min(parts, most + 1), what)
    return args


def check_method(obj, args, kwargs) -> tuple:
    """Checks before calling the bound method ``obj`` of a string, list or dict (see the module
    docstring); returns the (possibly materialised) positional arguments."""
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    what = f"{type(owner).__name__}.{name}()"
    if isinstance(owner, str):
        return _check_str_method(owner, name, args, kwargs, what)
    if isinstance(owner, list | dict):
        if name in ("extend", "update") and args and hasattr(args[0], "__len__"):
            check_items(len(owner) + len(args[0]), what)
        elif name in ("append", "insert", "setdefault"):
            check_items(len(owner) + 1, what)
        elif name in _DEEP_METHODS:
            charge(units(measure(owner, f"the {type(owner).__name__} {what} compares")))
    elif owner is dict and name == "fromkeys" and args and hasattr(args[0], "__len__"):
        check_items(len(args[0]), "dict.fromkeys()")
    return args


def bounded_lipsum(n=5, html=True, min=20, max=100):  # Jinja's own parameter names
    """``lipsum()`` for templates: refused when its words would pass what is left of the output bound."""
    if isinstance(n, int) and isinstance(min, int) and isinstance(max, int):
        words = builtins.max(min, max, 0)
        check_chars(builtins.max(n, 0) * (12 * words + 12), "lipsum()")  # a word is at most 12 characters
    return generate_lorem_ipsum(n=n, html=html, min=min, max=max)


# --- str.format ----------------------------------------------------------------------------------------

class BoundedFormatter(SandboxedFormatter):
    """The sandbox's ``str.format`` formatter, with each field measured before it is converted and
    the text made so far kept within what is left of the output bound."""

    def __init__(self, env, fmt: str, what: str, **kwargs) -> None:
        super().__init__(env, **kwargs)
        self.what, self.total = what, len(fmt)

    def get_field(self, field_name, args, kwargs):
        obj, first = super().get_field(field_name, args, kwargs)
        size = measure(obj, f"a field of {self.what}", chars=output_left() - self.total)
        charge(units(size))
        return obj, first

    def format_field(self, value, format_spec):
        text = super().format_field(value, format_spec)
        self.total += len(text)
        check_chars(self.total, f"the result of {self.what}")
        return text


class BoundedEscapeFormatter(BoundedFormatter, EscapeFormatter):
    """:class:`BoundedFormatter` for ``Markup.format`` (escapes each field)."""


def bounded_format(env, method):
    """The sandboxed, bounded ``str.format`` / ``format_map`` of the bound method ``method``."""
    fmt, is_map = method.__self__, method.__name__ == "format_map"
    what = f"str.{method.__name__}()"

    def wrapper(*args, **kwargs):
        charge(len(fmt))
        check_brace_format(fmt, what)
        if is_map:
            if kwargs or len(args) != 1:
                raise TypeError("format_map() takes exactly one argument")
            args, kwargs = (), args[0]
        if isinstance(fmt, Markup):
            formatter = BoundedEscapeFormatter(env, fmt, what, escape=fmt.escape)
        else:
            formatter = BoundedFormatter(env, fmt, what)
        result = type(fmt)(formatter.vformat(fmt, args, kwargs))
        make(len(result))
        return result

    return functools.update_wrapper(wrapper, method)
