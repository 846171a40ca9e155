"""The API's JSON parser: DRF's, plus refusals of what would otherwise be a 500 or silently accepted.

NUL and lone UTF-16 surrogates anywhere (Postgres and UTF-8 cannot hold them), nesting past the
recursion limit, a key given twice in one object (last-wins could send to the wrong user), and
``NaN``/``Infinity`` (not JSON, RFC 8259 §6): each is ``400 parse_error`` naming the field's path
(the body for the last), in the API's one error shape. The client's view: docs/API.md, "Errors";
docs/SECURITY.md.
"""

from __future__ import annotations

import codecs
import json
import math

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from core.vocabulary import UNSTORABLE


def unstorable(text: str) -> str | None:
    """What in ``text`` cannot be stored or echoed: ``"NUL characters (\\u0000)"``, ``"a lone UTF-16
    surrogate (\\udXXX)"``, or None."""
    match = UNSTORABLE.search(text)
    if match is None:
        return None
    if match.group() == "\x00":
        return "NUL characters (\\u0000)"
    return f"a lone UTF-16 surrogate (\\u{ord(match.group()):04x})"


NOT_FINITE = "a number too large for a double (it overflows to infinity)"


def _printable(path: str) -> str:
    return "".join(f"\\u{ord(c):04x}" if c == "\x00" or 0xD800 <= ord(c) <= 0xDFFF else c for c in path)


def _find_unstorable(value, path: str = "") -> tuple[str, str] | None:
    """``(path, what)`` of the first key or value that cannot be stored, or None: a string with NUL
    or a lone surrogate, or a number too large for a double (``1e999`` parses to infinity, which
    Postgres' ``jsonb`` refuses)."""
    if isinstance(value, str):
        what = unstorable(value)
        return (path or "(body)", what) if what else None
    if isinstance(value, float) and not math.isfinite(value):
        return (path or "(body)", NOT_FINITE)
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            what = unstorable(str(key))
            if what:
                return here, what
            found = _find_unstorable(item, here)
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _find_unstorable(item, f"{path}.{index}" if path else str(index))
            if found:
                return found
    return None


class FieldParseError(ParseError):
    """A body that parses but holds something no field may: 400 ``parse_error`` naming ``field``
    (its path), with ``code`` and ``rule`` for the field's entry (core/api/errors.py)."""

    def __init__(self, field: str, code: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field, self.code, self.rule = field, code, rule


class _Duplicated(dict):
    """An object with a key given twice: marked, so the parse can name its path (objects are built
    innermost first, so the hook alone does not know where it is)."""

    duplicate = ""


def _object_marking_duplicates(pairs: list[tuple[str, object]], seen: list) -> dict:
    found: dict = {}
    for key, value in pairs:
        if key in found:
            marked = _Duplicated(found)
            marked.duplicate = key
            seen.append(key)
            return marked
        found[key] = value
    return found


def _find_duplicate(value, path: str = "") -> str | None:
    """The path of the first key given twice (``metadata.a``), or None."""
    if isinstance(value, _Duplicated):
        return f"{path}.{value.duplicate}" if path else value.duplicate
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _find_duplicate(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number (RFC 8259)")


class StrictJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            seen: list[str] = []
            data = json.load(codecs.getreader(encoding)(stream), parse_constant=_no_constants,
                             object_pairs_hook=lambda pairs: _object_marking_duplicates(pairs, seen))
            duplicate = _find_duplicate(data) if seen else None  # a walk only when there is one
        except RecursionError:
            raise ParseError("JSON nested too deeply") from None
        except ValueError as exc:  # json.JSONDecodeError, NaN/Infinity, undecodable bytes
            raise ParseError(f"JSON parse error: {exc}") from None
        if duplicate is not None:
            raise FieldParseError(_printable(duplicate), "duplicate_key", "given twice in one object")
        found = _find_unstorable(data)
        if found:
            code = "not_finite" if found[1] == NOT_FINITE else "unstorable_character"
            raise FieldParseError(_printable(found[0]), code, f"{found[1]} not allowed")
        return data
