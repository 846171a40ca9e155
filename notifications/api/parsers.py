"""The API's JSON parser: DRF's, plus two refusals that would otherwise surface as 500s.

* ``\\u0000`` anywhere (keys or values): PostgreSQL text cannot store NUL, so it is refused up
  front with the path of the offending field.
* Nesting deep enough to exhaust Python's recursion limit (``[[[[…]]]]``).
"""

from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


def _find_nul(value, path: str = "") -> str | None:
    if isinstance(value, str):
        return path or "(body)" if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            if "\x00" in str(key):
                return here.replace("\x00", "\\u0000")
            found = _find_nul(item, here)
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _find_nul(item, f"{path}.{index}" if path else str(index))
            if found:
                return found
    return None


class StrictJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON nested too deeply") from None
        where = _find_nul(data)
        if where:
            raise ParseError(f"{where}: NUL characters (\\u0000) are not allowed")
        return data
