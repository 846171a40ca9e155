"""The rules of the ids and texts every floor accepts: user ids and push tokens (1 to a maximum
length, no invisible character; user ids also in NFKC, without whitespace or ``/``, in one
script), names and other text (no invisible character but the ones text needs), and the OpenAPI
patterns built from them. Pure functions on ``str``; they never raise, they answer why a value
breaks the rule (``''`` when it does not). docs/SECURITY.md "Invisible characters and look-alike
ids" gives the rules and why."""

from __future__ import annotations

import functools
import re
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
#: Unicode's Default_Ignorable_Code_Point property (DerivedCoreProperties.txt, Unicode 15.1.0, the
#: same in 16.0): characters a renderer shows as nothing unless it supports them, so ``bob\u3164``
#: (Hangul filler), ``bob\ufe0f`` (variation selector) or ``bo\u034fb`` look like ``bob``. Python's
#: ``unicodedata`` lacks the property, hence the ranges (first, last) here.
DEFAULT_IGNORABLE = ((0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
                     (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
                     (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
                     (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))
#: The emoji and text presentation selectors (U+FE0E, U+FE0F; default-ignorable): ``❤️`` is U+2764
#: U+FE0F, so names and text may hold them (after a character they change only its glyph); ids never.
PRESENTATION_SELECTORS = "\ufe0e\ufe0f"
#: What a multi-line text (a description, an inbox body) may hold besides: tab and line breaks.
LINE_BREAKS = "\t\n\r"


def is_default_ignorable(char: str) -> bool:
    """Whether ``char`` has Unicode's Default_Ignorable_Code_Point property (:data:`DEFAULT_IGNORABLE`)."""
    code = ord(char)
    return any(first <= code <= last for first, last in DEFAULT_IGNORABLE)


def is_invisible(char: str) -> bool:
    """Whether ``char`` is invisible: in :data:`INVISIBLE_CATEGORIES` or default-ignorable."""
    return unicodedata.category(char) in INVISIBLE_CATEGORIES or is_default_ignorable(char)


def _ranges(allow: str, whitespace: bool = False) -> str:
    """The Basic Multilingual Plane's invisible characters (but ``allow``) as the body of a regular
    expression character class (``\\u0000-\\u001f…``) that Python's ``re`` and JSON Schema (ECMA 262,
    no ``u`` flag) read alike. Surrogates are left out (ECMA 262 sees an emoji as two of them) and
    so are the invisible characters beyond U+FFFF (tags, musical format controls): the server's check
    (:func:`control_character_problem`) refuses those, the documented pattern does not say so.
    ``whitespace``: also the Unicode spaces (Z*) and ``/`` (a user id's, :func:`user_id_problem`)."""
    spans: list[list[int]] = []
    for code in range(0xFFFF + 1):
        char = chr(code)
        if unicodedata.category(char) == "Cs" or char in allow:
            continue
        if is_invisible(char) or (whitespace and (unicodedata.category(char).startswith("Z") or char == "/")):
            if spans and spans[-1][1] == code - 1:
                spans[-1][1] = code
            else:
                spans.append([code, code])
    return "".join(f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}" for a, b in spans)


#: The invisible characters as a character-class body (BMP, see :func:`_ranges`) that every OpenAPI
#: pattern of an id is built from (:func:`no_control_pattern`), so they keep in step.
CONTROL_CHARACTERS = _ranges("")
#: The same for names (:data:`TEXT_MARKS` and :data:`PRESENTATION_SELECTORS` allowed).
NAME_CONTROL_CHARACTERS = _ranges(TEXT_MARKS + PRESENTATION_SELECTORS)
#: The same for user ids: also no whitespace and no ``/`` (:func:`user_id_problem`).
USER_ID_CHARACTERS = _ranges("", whitespace=True)
#: The OpenAPI pattern of a user id (NFKC and one script are the server's, not the pattern's).
USER_ID_PATTERN = f"^[^{USER_ID_CHARACTERS}]{{1,{MAX_USER_ID_LENGTH}}}$"
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
    RIGHT-TO-LEFT OVERRIDE)"`` naming the first character of ``value`` that is invisible
    (:func:`is_invisible`: :data:`INVISIBLE_CATEGORIES` or default-ignorable) and not in
    ``allow`` (:data:`TEXT_MARKS` for names and text, with :data:`LINE_BREAKS` for multi-line
    text), or ``''``. Code ``control_character``."""
    if not _candidates(allow).search(value):  # the common case, in C: nothing to name
        return ""
    for char in value:
        if is_invisible(char) and char not in allow:
            name = unicodedata.name(char, "")
            return Problem(f"contains a control character (U+{ord(char):04X}{' ' + name if name else ''})",
                           "control_character")
    return ""


@functools.cache
def _candidates(allow: str) -> re.Pattern:
    """What may be invisible, as one compiled class: the Basic Multilingual Plane's invisible
    characters but ``allow`` (:func:`_ranges`), surrogates, and every character beyond U+FFFF (checked
    one by one). Sends run the text rule on every rendered inbox title and body: this keeps it ~1 µs."""
    return re.compile(f"[{_ranges(allow)}\\ud800-\\udfff\\U00010000-\\U0010ffff]")


def text_problem(value: str, multiline: bool = False) -> str:
    """:func:`control_character_problem` for a name or a text shown to people: :data:`TEXT_MARKS`
    and :data:`PRESENTATION_SELECTORS` allowed, and tabs and line breaks where ``multiline``."""
    return control_character_problem(value, TEXT_MARKS + PRESENTATION_SELECTORS + (LINE_BREAKS if multiline else ""))


def mixed_script_problem(value: str) -> str:
    """Why ``value`` cannot be an id for mixing scripts (``bоb`` with a Cyrillic ``о`` beside
    ``bob``), or ``''``: Unicode TS #39 "Highly Restrictive" (:data:`_SCRIPT_SETS`), scripts as
    ``confusable_homoglyphs`` reads them from Unicode's data. Code ``confusable``. (An id wholly in
    one other script, ``вов``, passes: see docs/SECURITY.md.)"""
    if value.isascii():  # Latin and common characters only
        return ""
    scripts = categories.unique_aliases(value) - {"COMMON", "INHERITED"}
    if len(scripts) <= 1 or any(scripts <= allowed for allowed in _SCRIPT_SETS):
        return ""
    return Problem(f"mixes the scripts {', '.join(sorted(scripts))}: an id is in one script (or Latin with "
                   "Han, kana, Bopomofo or Hangul), so no two ids look alike", "confusable")


def user_id_problem(value: str) -> str:
    """Why ``value`` cannot be a user id, or ``''`` when it can.

    The rule of the ``/v1/users/{user_id}`` path (``core.api.parameters.USER_ID``): 1 to
    MAX_USER_ID_LENGTH characters, no invisible character (:func:`control_character_problem`, none
    allowed, default-ignorable ones included), in NFKC (``Mu\u0308ller``, ``ﬁnn``, ``Ⅰ`` are refused
    as not the form their twins ``Müller``, ``finn``, ``I`` have; code ``not_normalized``), no
    whitespace (Unicode Z*: ``bob\u3000``) and no ``/`` (a path could not address it), in one
    script (:func:`mixed_script_problem`). Every way of creating a recipient applies it (segment
    members by API and CSV upload, the admin, events), so no recipient exists that
    ``/v1/users/{user_id}`` cannot reach. Ids are taken as given: never trimmed or normalized for
    the caller, and case-sensitive (``Alice`` and ``alice`` are two users).
    """
    if not isinstance(value, str) or not value:
        return "must not be empty"
    if len(value) > MAX_USER_ID_LENGTH:
        return f"is {len(value)} characters; at most {MAX_USER_ID_LENGTH}"
    invisible = control_character_problem(value)
    if invisible:
        return invisible
    for char in value:
        if unicodedata.category(char).startswith("Z"):
            return Problem(f"contains whitespace (U+{ord(char):04X} {unicodedata.name(char, '')}): an id has none")
        if char == "/":
            return Problem("contains '/': an id has none, so /v1/users/{user_id} can address it")
    if unicodedata.normalize("NFKC", value) != value:
        return Problem(f"is not in Unicode normalization form NFKC (as NFKC: "
                       f"{unicodedata.normalize('NFKC', value)!r}): an id has one spelling, so no two ids look alike",
                       "not_normalized")
    return mixed_script_problem(value)


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


def shows_nothing(text: str | None) -> bool:
    """Whether ``text`` has no letter, digit, punctuation or symbol a reader would see (the rule of an
    empty body and subject, on every road: single sends, templates at save and at send)."""
    return not any(_shows(char) for char in text or "")


def _shows(char: str) -> bool:
    return (unicodedata.category(char)[0] in "LNPS" and char != BRAILLE_BLANK
            and not is_default_ignorable(char))


#: U+2800, a symbol that draws nothing.
BRAILLE_BLANK = "\u2800"
