"""The rules of the ids every floor accepts: user ids and push tokens (1 to a maximum length, no
control character), and the OpenAPI patterns built from them. Pure functions on ``str``; they never
raise, they answer why a value breaks the rule (``''`` when it does not)."""

from __future__ import annotations

import re

MAX_USER_ID_LENGTH = 255
MAX_PUSH_TOKEN_LENGTH = 1024

#: The control characters no id, token or name may hold, as the body of a regular-expression
#: character class that Python's ``re`` and JSON Schema (ECMA 262) read alike: C0 (U+0000–U+001F,
#: NUL cannot even be stored), DEL (U+007F) and C1 (U+0080–U+009F, e.g. U+0085 NEXT LINE). Every
#: OpenAPI pattern of such a value is built from it (:func:`no_control_pattern`), so they keep in step.
CONTROL_CHARACTERS = r"\u0000-\u001f\u007f-\u009f"
_CONTROL = re.compile(f"[{CONTROL_CHARACTERS}]")


def no_control_pattern(max_length: int, min_length: int = 1) -> str:
    """The OpenAPI (and Python) pattern of ``min_length``–``max_length`` characters without a control
    character: ``^[^\\u0000-\\u001f\\u007f-\\u009f]{1,255}$``."""
    return f"^[^{CONTROL_CHARACTERS}]{{{min_length},{max_length}}}$"


def control_character_problem(value: str) -> str:
    """``"contains a control character (U+0085)"`` naming the first one in ``value``, or ``''``."""
    found = _CONTROL.search(value)
    return f"contains a control character (U+{ord(found.group()):04X})" if found else ""


def user_id_problem(value: str) -> str:
    """Why ``value`` cannot be a user id, or ``''`` when it can.

    The rule of the ``/v1/users/{user_id}`` path (``core.api.parameters.USER_ID``): 1 to
    MAX_USER_ID_LENGTH characters, none of them a control character (:data:`CONTROL_CHARACTERS`:
    C0, DEL, C1). Every way of creating a recipient applies it (segment members by API and CSV
    upload, the admin), so no recipient exists that ``/v1/users/{user_id}`` cannot reach. Ids are
    taken as given: never trimmed, and case-sensitive (``Alice`` and ``alice`` are two users).
    Returns ``"must not be empty"``, ``"is 300 characters; at most 255"`` or ``"contains a control
    character"``.
    """
    if not isinstance(value, str) or not value:
        return "must not be empty"
    if len(value) > MAX_USER_ID_LENGTH:
        return f"is {len(value)} characters; at most {MAX_USER_ID_LENGTH}"
    if _CONTROL.search(value):
        return "contains a control character"
    return ""


def push_token_problem(value: str) -> str:
    """Why ``value`` cannot be a push token, or ``''``: the one token rule of ``PUT
    /v1/users/{id}/devices`` (the body's ``push_token``) and of ``DELETE …/devices/{push_token}``, so
    every token that can be registered can be removed. 1 to MAX_PUSH_TOKEN_LENGTH characters (FCM
    tokens are ~160, APNs 64 hex digits), no control character; taken as given, never trimmed.
    Returns ``"must not be empty"``, ``"is 2000 characters; at most 1024"`` or ``"contains a control
    character (U+0001)"``."""
    if not isinstance(value, str) or not value:
        return "must not be empty"
    if len(value) > MAX_PUSH_TOKEN_LENGTH:
        return f"is {len(value)} characters; at most {MAX_PUSH_TOKEN_LENGTH}"
    return control_character_problem(value)
