"""A send's free-form ``metadata`` (docs/WEBHOOKS.md, "Payload"; docs/API.md): the client's own
object, stored once per notification, returned on reads and in every webhook payload's
``data.metadata.client``, blanked by an erasure. The one rule of its shape is here."""

from __future__ import annotations

import math
import re

from core.identifiers import problem_code, text_problem
from notifications.content_limits import json_bytes

MAX_KEYS = 20
MAX_BYTES = 2048
MAX_KEY_LENGTH = 64
KEY_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")
#: 2**53 - 1, JavaScript's Number.MAX_SAFE_INTEGER: larger numbers do not survive every JSON reader.
MAX_SAFE_NUMBER = 2 ** 53 - 1


def problems(value) -> dict[str | None, tuple[str, str]]:
    """``{key: (message, code)}`` of what is wrong with ``metadata``: ``None`` names the object
    itself, a key its key or value (``{}``: it passes)."""
    if not isinstance(value, dict):
        return {None: ("an object of at most 20 keys", "invalid")}
    found: dict[str | None, tuple[str, str]] = {}
    if len(value) > MAX_KEYS:
        found[None] = (f"{len(value)} keys; at most {MAX_KEYS}", "too_many_keys")
    for key, item in value.items():
        if not KEY_PATTERN.fullmatch(key):
            found[key] = (f"a key is a letter or '_', then letters, digits, '_', '.', '-'; at most "
                          f"{MAX_KEY_LENGTH}", "invalid_key")
        elif isinstance(item, str) and (problem := text_problem(item)):
            found[key] = (str(problem), problem_code(problem))
        elif isinstance(item, float) and not math.isfinite(item):
            found[key] = ("a finite number", "invalid_value")
        elif isinstance(item, int | float) and not isinstance(item, bool) and abs(item) > MAX_SAFE_NUMBER:
            # Postgres' jsonb keeps numbers as decimals: 1e308 came back as a 309-digit integer.
            found[key] = (f"a number from -{MAX_SAFE_NUMBER} to {MAX_SAFE_NUMBER} (what every JSON reader keeps "
                          "exactly); send a larger one as a string", "invalid_value")
        elif item is not None and not isinstance(item, str | int | float | bool):
            found[key] = ("a string, number, boolean or null (no object or list)", "invalid_value")
    if not found:
        size = json_bytes(value)
        if size > MAX_BYTES:
            found[None] = (f"{size} bytes as JSON; at most {MAX_BYTES}", "payload_too_large")
    return found
