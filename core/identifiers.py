"""The rules of the ids and texts every floor accepts: user ids and push tokens (1 to a maximum
length, no invisible character, user ids in one script), names and other text (no invisible
character but the ones text needs), and the OpenAPI patterns built from them. Pure functions on
``str``; they never raise, they answer why a value breaks the rule (``''`` when it does not).
docs/SECURITY.md "Invisible characters and look-alike ids" gives the rules and why."""

from __future__ import annotations

import unicodedata

from confusable_homoglyphs import categories

MAX_USER_ID_LENGTH = 255
MAX_PUSH_TOKEN_LENGTH = 1024

#: The Unicode general categories no id, key, name or text may hold: controls (Cc: C0, DEL, C1),
#: format characters (Cf: the bidirectional embeddings, overrides and isolates U+202A–U+202E and
#: U+2066–U+2069, zero-width space U+200B, soft hyphen, BOM, tags …), the line and paragraph
#: separators (Zl, Zp) and lone surrogates (Cs: not text; Postgres cannot store them).
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
#: Format characters that ordinary text needs and that reorder nothing: the zero-width non-joiner and
#: joiner (Persian, Indic scripts, emoji sequences) and the left-to-right / right-to-left marks
#: (right-to-left text). Names, titles, bodies and data values may hold them; ids and keys never.
TEXT_MARKS = "\u200c\u200d\u200e\u200f"
#: What a multi-line text (a description, an inbox body) may hold besides: tab and line breaks.
LINE_BREAKS = "\t\n\r"


def _ranges(allow: str) -> str:
    """The Basic Multilingual Plane's invisible characters (but ``allow``) as the body of a regular
    expression character class (``\\u0000-\\u001f…``) that Python's ``re`` and JSON Schema (ECMA 262,
    no ``u`` flag) read alike. Surrogates are left out (ECMA 262 sees an emoji as two of them) and
    so are the invisible characters beyond U+FFFF (tags, musical format controls): the server's check
    (:func:`control_character_problem`) refuses those, the documented pattern does not say so."""
    spans: list[list[int]] = []
    for code in range(0xFFFF + 1):
        char = chr(code)
        if unicodedata.category(char) in INVISIBLE_CATEGORIES - {"Cs"} and char not in allow:
            if spans and spans[-1][1] == code - 1:
                spans[-1][1] = code
            else:
                spans.append([code, code])
    return "".join(f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}" for a, b in spans)


#: The invisible characters as a character-class body (BMP, see :func:`_ranges`) that every OpenAPI
#: pattern of an id is built from (:func:`no_control_pattern`), so they keep in step.
CONTROL_CHARACTERS = _ranges("")
#: The same for names (:data:`TEXT_MARKS` allowed).
NAME_CONTROL_CHARACTERS = _ranges(TEXT_MARKS)
#: Unicode TS #39 §5.2 "Highly Restrictive": an id is written in one script, or in Latin with the
#: scripts Chinese, Japanese and Korean are written with. Characters common to all scripts (digits,
#: punctuation) and combining marks (inherited) do not count.
_SCRIPT_SETS = (frozenset({"LATIN", "HAN", "HIRAGANA", "KATAKANA"}), frozenset({"LATIN", "HAN", "BOPOMOFO"}),
                frozenset({"LATIN", "HAN", "HANGUL"}))


class Problem(str):
    """Why a value breaks a rule (a sentence), with the error code the API answers it with:
    ``control_character`` (an invisible character), ``confusable`` (an id mixing scripts),
    ``invalid`` (anything else)."""

    code: str

    def __new__(cls, message: str, code: str = "invalid") -> Problem:
        problem = super().__new__(cls, message)
        problem.code = code
        return problem


def problem_code(problem: str) -> str:
    """The API's error code of a problem these functions answered (``invalid`` for a plain string)."""
    return getattr(problem, "code", "invalid")


def no_control_pattern(max_length: int, min_length: int = 1, *, name: bool = False) -> str:
    """The OpenAPI (and Python) pattern of ``min_length``–``max_length`` characters without an
    invisible character (``name``: but :data:`TEXT_MARKS`): ``^[^\\u0000-\\u001f…]{1,255}$``."""
    return f"^[^{NAME_CONTROL_CHARACTERS if name else CONTROL_CHARACTERS}]{{{min_length},{max_length}}}$"


def control_character_problem(value: str, allow: str = "") -> str:
    """The one rule of invisible characters: ``"contains a control character (U+202E
    RIGHT-TO-LEFT OVERRIDE)"`` naming the first character of ``value`` in :data:`INVISIBLE_CATEGORIES` that is
    not in ``allow`` (:data:`TEXT_MARKS` for names and text, with :data:`LINE_BREAKS` for multi-line
    text), or ``''``. Code ``control_character``."""
    for char in value:
        if unicodedata.category(char) in INVISIBLE_CATEGORIES and char not in allow:
            name = unicodedata.name(char, "")
            return Problem(f"contains a control character (U+{ord(char):04X}{' ' + name if name else ''})",
                           "control_character")
    return ""


def text_problem(value: str, multiline: bool = False) -> str:
    """:func:`control_character_problem` for a name or a text shown to people: :data:`TEXT_MARKS`
    allowed, and tabs and line breaks where ``multiline``."""
    return control_character_problem(value, TEXT_MARKS + (LINE_BREAKS if multiline else ""))


def mixed_script_problem(value: str) -> str:
    """Why ``value`` cannot be an id for mixing scripts (``bоb`` with a Cyrillic ``о`` beside
    ``bob``), or ``''``: Unicode TS #39 "Highly Restrictive" (:data:`_SCRIPT_SETS`), scripts as
    ``confusable_homoglyphs`` reads them from Unicode's data. Code ``confusable``. (An id wholly in
    one other script, ``вов``, passes: see docs/SECURITY.md.)"""
    scripts = categories.unique_aliases(value) - {"COMMON", "INHERITED"}
    if len(scripts) <= 1 or any(scripts <= allowed for allowed in _SCRIPT_SETS):
        return ""
    return Problem(f"mixes the scripts {', '.join(sorted(scripts))}: an id is in one script (or Latin with "
                   "Han, kana, Bopomofo or Hangul), so no two ids look alike", "confusable")


def user_id_problem(value: str) -> str:
    """Why ``value`` cannot be a user id, or ``''`` when it can.

    The rule of the ``/v1/users/{user_id}`` path (``core.api.parameters.USER_ID``): 1 to
    MAX_USER_ID_LENGTH characters, no invisible character (:func:`control_character_problem`, none
    allowed), in one script (:func:`mixed_script_problem`). Every way of creating a recipient
    applies it (segment members by API and CSV upload, the admin), so no recipient exists that
    ``/v1/users/{user_id}`` cannot reach. Ids are taken as given: never trimmed, and case-sensitive
    (``Alice`` and ``alice`` are two users). Returns ``"must not be empty"``, ``"is 300 characters;
    at most 255"``, or a :class:`Problem` coded ``control_character`` or ``confusable``.
    """
    if not isinstance(value, str) or not value:
        return "must not be empty"
    if len(value) > MAX_USER_ID_LENGTH:
        return f"is {len(value)} characters; at most {MAX_USER_ID_LENGTH}"
    return control_character_problem(value) or mixed_script_problem(value)


def push_token_problem(value: str) -> str:
    """Why ``value`` cannot be a push token, or ``''``: the one token rule of ``PUT
    /v1/users/{id}/devices`` (the body's ``push_token``) and of ``DELETE …/devices/{push_token}``, so
    every token that can be registered can be removed. 1 to MAX_PUSH_TOKEN_LENGTH characters (FCM
    tokens are ~160, APNs 64 hex digits), no invisible character; taken as given, never trimmed.
    Returns ``"must not be empty"``, ``"is 2000 characters; at most 1024"`` or ``"contains a control
    character (U+0001)"``."""
    if not isinstance(value, str) or not value:
        return "must not be empty"
    if len(value) > MAX_PUSH_TOKEN_LENGTH:
        return f"is {len(value)} characters; at most {MAX_PUSH_TOKEN_LENGTH}"
    return control_character_problem(value)
